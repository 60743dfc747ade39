"""One request's exchange, as every route has it: reading and validating the request, the error
and JSON responses, the ``x-ratelimit-*`` headers, and the one log line plus metrics sample each
request ends with (``RequestLog``)."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import structlog
from pydantic import BaseModel
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from gateway.api.encode import json_bytes
from gateway.engine.limits import reset_text
from gateway.engine.telemetry import NOOP_SPAN, Span
from gateway.engine.validate import parse_json
from gateway.kernel.client_api import ClientApi
from gateway.kernel.errors import GatewayError, InvalidRequest, PayloadTooLarge, RateLimited, RateStanding
from gateway.kernel.ids import new_id, safe_id
from gateway.kernel.settings import Limits
from gateway.observability.genai import turn_attributes
from gateway.observability.observer import Metrics
from gateway.server.internals import LATE_BODY

if TYPE_CHECKING:
    from gateway.engine.auth import Principal
    from gateway.engine.orchestrator import Gateway
    from gateway.engine.telemetry import Attr, Tracer
    from gateway.engine.turn import Turn, TurnResult

M = TypeVar("M", bound=BaseModel, covariant=True)


class RequestValidator(Protocol[M]):
    """``gateway.engine.validate.create_request`` or ``compact_request``."""

    def __call__(self, data: Any, limits: Limits) -> M: ...


access_log = structlog.get_logger("gateway.access")


# what the headers say of a dimension no limit applies to: no client's integer type overflows on it
UNLIMITED = 2**31 - 1
_UNLIMITED = str(UNLIMITED)


def rate_limit_headers(standing: RateStanding | None) -> dict[str, str]:
    """The six ``x-ratelimit-*`` headers of a gateway limit's figures (none when no per-minute
    limit applies): for requests and for tokens, the limit, what is left and when it resets; a
    dimension no limit applies to reads ``UNLIMITED`` with a reset of 0s."""
    if standing is None:
        return {}
    headers: dict[str, str] = {}
    for what, window in (("requests", standing.requests), ("tokens", standing.tokens)):
        if window is None:
            headers[f"x-ratelimit-limit-{what}"] = headers[f"x-ratelimit-remaining-{what}"] = _UNLIMITED
            headers[f"x-ratelimit-reset-{what}"] = "0s"
        else:
            headers[f"x-ratelimit-limit-{what}"] = str(window.limit)
            headers[f"x-ratelimit-remaining-{what}"] = str(window.remaining)
            headers[f"x-ratelimit-reset-{what}"] = reset_text(window.reset_ms)
    return headers


def error_response(err: GatewayError, headers: dict[str, str] | None = None) -> Response:
    """``err`` as the spec's JSON error body; a rate limit also says when to come back (Retry-After,
    in whole seconds: the upstream's own when it gave one) and, a gateway limit's, where the
    request stood (the ``x-ratelimit-*`` headers)."""
    if isinstance(err, RateLimited) and err.standing is not None:
        headers = {**(headers or {}), **rate_limit_headers(err.standing)}
    retry_after = getattr(err, "retry_after", None)
    if retry_after is not None and err.status in (429, 503):
        headers = {**(headers or {}), "retry-after": str(max(1, math.ceil(retry_after)))}
    return Response(
        json_bytes(err.http_body()), status_code=err.status, media_type="application/json", headers=headers
    )


def json_response(obj: Any, status: int = 200) -> Response:
    return Response(json_bytes(obj), status_code=status, media_type="application/json")


async def read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"The request body exceeds the limit of {limit} bytes.")
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise PayloadTooLarge(f"The request body exceeds the limit of {limit} bytes.")
            chunks.append(chunk)
    except ClientDisconnect:
        late = request.scope.get(LATE_BODY)  # the connection answered 408 already: it is logged so
        if isinstance(late, GatewayError):
            raise late from None
        raise InvalidRequest("The client disconnected while sending the request.") from None
    return b"".join(chunks)


_MAX_LOGGED_MODEL = 200  # characters of a (possibly bogus) model name in a log line


class RequestLog:
    """Collects the fields of the one access-log line a request produces."""

    __slots__ = ("fields", "routed", "span", "start")

    def __init__(
        self,
        request: Request,
        transport: str,
        request_id: str | None = None,
        api: ClientApi = ClientApi.RESPONSES,
    ) -> None:
        """``request_id``: the caller's own (a WebSocket turn's); else the client's X-Request-Id
        when it is id-shaped, or a new one. ``api``: the client API the request came in by."""
        self.start = time.perf_counter()
        self.routed = False  # the model resolved to a route: it may label metrics
        self.span: Span = NOOP_SPAN  # the request's span (tracing), told how it ended
        self.fields: dict[str, Any] = {
            "request_id": request_id or safe_id(request.headers.get("x-request-id")) or new_id("req"),
            "transport": transport,
            "api": api.value,
        }

    @property
    def request_id(self) -> str:
        request_id: str = self.fields["request_id"]
        return request_id

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    @contextmanager
    def traced(
        self, tracer: Tracer, name: str, headers: Mapping[str, str], attrs: Mapping[str, Attr | None]
    ) -> Iterator[Span]:
        """The request's server span (a no-op unless tracing is on), the child of the client's
        ``traceparent``, for the ``with`` block; the log line tells it how the request ended."""
        with tracer.server(name, headers, attrs) as span:
            self.span = span
            yield span

    def routed_to(self, turn: Turn) -> None:
        """The request became ``turn``: its provider goes on the line, its model may label metrics."""
        self.fields["provider"] = turn.route.provider
        self.routed = True

    def refused(self, metrics: Metrics, err: GatewayError, **extra: Any) -> None:
        """End a request that was refused with ``err`` (no turn ran, or none was made)."""
        self.done(metrics, err.status, error_code=err.code, **extra)

    def metric_model(self) -> str | None:
        """The model for its metrics label: only a routed one (None: not routed, labelled
        ``_other``), so clients cannot mint label values."""
        return str(self.fields.get("model")) if self.routed else None

    def done(
        self,
        metrics: Metrics,
        status: int | str,
        usage: Mapping[str, Any] | None = None,
        *,
        turn: bool = True,
        **extra: Any,
    ) -> None:
        """End the request: its log line (token counts from ``usage``), its metrics sample and
        its span's attributes. ``turn``: on the WebSocket, a turn (False: a refused upgrade)."""
        extra["input_tokens"] = usage.get("input_tokens") if usage else None
        extra["output_tokens"] = usage.get("output_tokens") if usage else None
        self.emit(status, **extra)
        fields = self.fields
        metrics.observe(
            fields["transport"],
            self.metric_model(),
            status,
            self.elapsed(),
            usage,
            tenant=fields.get("tenant"),
            provider=fields.get("provider"),
            error_code=fields.get("error_code"),
            turn=turn,
            api=fields["api"],
        )
        if self.span.recording:
            self._trace(status)

    def _trace(self, status: int | str) -> None:
        fields = self.fields
        span = self.span
        span.update(
            {
                "gen_ai.request.model": fields.get("model") if self.routed else None,
                "gateway.tenant": fields.get("tenant"),
                "gateway.request_id": fields.get("request_id"),
                "gateway.api": fields["api"],
                "gateway.status": str(status),
            }
        )
        if isinstance(status, int):
            span.set("http.response.status_code", status)
        code = fields.get("error_code")
        span.set("error.type", code)
        if status == "failed" or (isinstance(status, int) and status >= 500):
            span.fail(code)  # a refusal (4xx) is the client's error, not the server span's

    def turn_ended(self, metrics: Metrics, result: TurnResult) -> None:
        """The end-of-turn hook's part: a turn that failed while opening logs its HTTP status, as a
        refused request does; any other its final status."""
        err = result.error
        status: int | str = err.status if err is not None and not result.started else result.status
        code = err.code if err is not None else None
        if self.span.recording:
            self.span.update(turn_attributes(result))
        self.done(
            metrics,
            status,
            result.usage,
            provider=result.provider,
            deployment=result.deployment,
            error_code=code,
        )

    def emit(self, status: int | str, **extra: Any) -> None:
        self.fields.update(extra)
        model = self.fields.get("model")
        if isinstance(model, str) and len(model) > _MAX_LOGGED_MODEL:
            self.fields["model"] = model[:_MAX_LOGGED_MODEL] + "…"
        # A server-side failure (5xx, or a streamed response that ended "failed") is a warning.
        failed = status == "failed" or (isinstance(status, int) and status >= 500)
        write = access_log.warning if failed else access_log.info
        write("request", status=status, latency_ms=round(self.elapsed() * 1000, 3), **self.fields)


async def read_request(
    request: Request, gw: Gateway, validate: RequestValidator[M], rlog: RequestLog
) -> tuple[Principal, M]:
    """Authenticate, read the capped body and ``validate`` it (the engine's one validator, with the
    input-size limit); the tenant and the model go on the log line as soon as they are known."""
    principal = gw.auth.authenticate(request.headers.get("authorization"))
    rlog.fields["tenant"] = principal.tenant
    rlog.span.set("gateway.api_key.name", principal.key_name)
    limits = gw.settings.limits
    raw = await read_body(request, limits.max_body_bytes)
    body = validate(parse_json(raw), limits)
    rlog.fields["model"] = getattr(body, "model", None)
    return principal, body
