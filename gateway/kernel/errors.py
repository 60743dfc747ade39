"""The one error tree, and its renderings.

    class                            status  type                   code
    GatewayError                      500    server_error           server_error
    ├── ServerError                   500    server_error           server_error
    ├── InvalidRequest                400    invalid_request_error  invalid_request_error
    │   ├── ModelNotFound             400    invalid_request_error  model_not_found (param "model")
    │   ├── PreviousResponseNotFound  400    invalid_request_error  previous_response_not_found
    │   │                                                           (param "previous_response_id")
    │   ├── ContextLengthExceeded     400    invalid_request_error  context_length_exceeded
    │   ├── InvalidEncryptedContent   400    invalid_request_error  invalid_encrypted_content
    │   ├── ConnectionLimitReached    400    invalid_request_error  websocket_connection_limit_reached
    │   └── PayloadTooLarge           413    invalid_request_error  payload_too_large
    ├── AuthenticationFailed          401    authentication_error   invalid_api_key
    ├── PermissionDenied              403    permission_error       permission_denied (an admin
    │                                                               key off /v1/usage, another
    │                                                               tenant's usage)
    ├── NotFound                      404    not_found              not_found
    ├── RateLimited                   429    too_many_requests      rate_limit_exceeded (retry_after)
    │   └── QuotaExceeded             429    too_many_requests      insufficient_quota (a budget)
    ├── ServiceUnavailable            503    server_error           service_unavailable (e.g. the
    │                                                               state store is down)
    └── UpstreamError                 502    server_error           upstream_error (retryable or not)
        ├── UpstreamTimeout           504    server_error           upstream_timeout
        ├── UpstreamConnectError      502    server_error           upstream_connect_error
        ├── UpstreamRateLimited       429    too_many_requests      rate_limit_exceeded
        ├── UpstreamRejected          400    invalid_request_error  upstream_invalid_request
        └── IllegalTransition         502    server_error           upstream_protocol_error

``chain_too_deep()`` makes an InvalidRequest (param "previous_response_id"). Any ``code`` can be
overridden per instance (``UpstreamError(..., code="event_limit_exceeded")``).

The three renderings of an error: ``http_body()``, the JSON body of an HTTP error reply;
``stream_event(n)``, the ``error`` event (sequence number ``n``) a response stream sends before
``response.failed``; ``ws_envelope()``, the WebSocket ``error`` message for a request that gets no
response (refused before generation, dropped, connection limit), with the HTTP status and a code
that is never null. Besides, ``response_error()`` is the ``{code, message}`` of a failed
ResponseResource.

Upstream failures are translated into this tree inside the adapters; nothing upstream-raw
(URLs, keys, bodies) is ever put into a message.
"""

from __future__ import annotations

from typing import Any


class GatewayError(Exception):
    status: int = 500
    type: str = "server_error"
    code: str | None = "server_error"

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code

    def error_object(self) -> dict[str, Any]:
        return {"type": self.type, "code": self.code, "message": self.message, "param": self.param}

    # -- renderings -------------------------------------------------------------------------
    def http_body(self) -> dict[str, Any]:
        return {"error": self.error_object()}

    def stream_event(self, sequence_number: int) -> dict[str, Any]:
        """The SSE ``error`` event. The top-level duplicates are what real clients read."""
        err = self.error_object()
        return {
            "type": "error",
            "sequence_number": sequence_number,
            "code": err["code"],
            "message": err["message"],
            "param": err["param"],
            "error": err,
        }

    def ws_envelope(self) -> dict[str, Any]:
        err = self.error_object()
        if err["code"] is None:
            err["code"] = self.type
        return {"type": "error", "status": self.status, "error": err}

    def response_error(self) -> dict[str, str]:
        """The ``{code, message}`` put on a failed ResponseResource."""
        return {"code": self.code or self.type, "message": self.message}


class ServerError(GatewayError):
    """An unexpected failure inside the gateway (500 server_error)."""


class InvalidRequest(GatewayError):
    status = 400
    type = "invalid_request_error"
    code = "invalid_request_error"


class ModelNotFound(InvalidRequest):
    code = "model_not_found"

    def __init__(self, model: str) -> None:
        super().__init__(f"The requested model '{model}' does not exist.", param="model")


class PreviousResponseNotFound(InvalidRequest):
    code = "previous_response_not_found"

    def __init__(self, response_id: str) -> None:
        super().__init__(
            f"Previous response with id '{response_id}' not found.", param="previous_response_id"
        )


def chain_too_deep(max_depth: int) -> InvalidRequest:
    return InvalidRequest(
        f"The previous_response_id chain is longer than {max_depth} responses.",
        param="previous_response_id",
    )


class ContextLengthExceeded(InvalidRequest):
    code = "context_length_exceeded"


class InvalidEncryptedContent(InvalidRequest):
    code = "invalid_encrypted_content"


class ConnectionLimitReached(InvalidRequest):
    code = "websocket_connection_limit_reached"


class AuthenticationFailed(GatewayError):
    status = 401
    type = "authentication_error"
    code = "invalid_api_key"


class PermissionDenied(GatewayError):
    status = 403
    type = "permission_error"
    code = "permission_denied"


class NotFound(GatewayError):
    status = 404
    type = "not_found"
    code = "not_found"


class PayloadTooLarge(InvalidRequest):
    status = 413
    code = "payload_too_large"


class RateLimited(GatewayError):
    status = 429
    type = "too_many_requests"
    code = "rate_limit_exceeded"

    def __init__(
        self,
        message: str,
        *,
        retry_after: float | None = None,
        headers: dict[str, str] | None = None,
        **kw: Any,
    ) -> None:
        super().__init__(message, **kw)
        self.retry_after = retry_after
        self.headers = headers  # extra response headers (the x-ratelimit-* of a gateway limit)


class QuotaExceeded(RateLimited):
    """A tenant's token budget is spent for its period."""

    code = "insufficient_quota"


class ServiceUnavailable(GatewayError):
    status = 503
    type = "server_error"
    code = "service_unavailable"


class UpstreamError(GatewayError):
    """The provider failed. ``retryable`` marks failures worth a retry or a fallback model
    (429, 5xx, timeouts, connection errors) when no output has reached the client yet."""

    status = 502
    type = "server_error"
    code = "upstream_error"

    def __init__(
        self,
        message: str,
        *,
        retryable: bool = False,
        retry_after: float | None = None,
        upstream_status: int | None = None,
        **kw: Any,
    ) -> None:
        super().__init__(message, **kw)
        self.retryable = retryable
        self.retry_after = retry_after
        self.upstream_status = upstream_status


class UpstreamTimeout(UpstreamError):
    status = 504
    code = "upstream_timeout"


class UpstreamConnectError(UpstreamError):
    code = "upstream_connect_error"


class UpstreamRateLimited(UpstreamError):
    """The provider said 429: shown to the client as 429 too_many_requests."""

    status = 429
    type = "too_many_requests"
    code = "rate_limit_exceeded"


class UpstreamRejected(UpstreamError):
    """The provider refused the request as invalid (its 400/404/422): the client can fix it."""

    status = 400
    type = "invalid_request_error"
    code = "upstream_invalid_request"


class IllegalTransition(UpstreamError):
    """The delta sequence broke a state machine of the ResponseBuilder (an adapter or upstream bug)."""

    code = "upstream_protocol_error"
