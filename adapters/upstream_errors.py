"""Upstream errors classified: an HTTP status, an error body or an error reported inside a 200
stream → the ``gateway.kernel.errors`` class, ``code`` and retry hint the gateway answers with.

Pure (no I/O): the stream translators use it as much as the transport does. Messages are the
gateway's own words: no upstream URL, key or raw body ever reaches one.
"""

from __future__ import annotations

import email.utils
import math
import re
import time
from collections.abc import Mapping
from typing import Any

import orjson

from gateway.kernel.errors import ErrorCode, UpstreamError, UpstreamRateLimited, UpstreamRejected

__all__ = ["error_code_from_body", "map_status_error", "map_stream_error", "parse_retry_after"]

_RETRYABLE_STATUSES = frozenset({408, 409, 425, 500, 502, 503, 504, 520, 522, 524, 529})
_REJECTED_STATUSES = frozenset({400, 404, 405, 413, 415, 422})
_CODE_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_.\-]{0,63}$")
# Upstream codes that say nothing beyond the HTTP status; the gateway's own code is better.
_GENERIC_CODES = frozenset(
    {
        "error",
        "api_error",
        "invalid_request_error",
        "invalid_request",
        "invalid_argument",
        "bad_request",
        "badrequesterror",
        "server_error",
        "internal",
        "internal_error",
        "internal_server_error",
        "not_found",
        "not_found_error",
        "unknown",
        "failed_precondition",
    }
)
_CONTEXT_HINTS = (
    "context length",
    "context_length",
    "context window",
    "maximum context",
    "prompt is too long",
    "too many tokens",
    "input token count",
    "exceeds the maximum number of tokens",
    "reduce the length",
)


def parse_retry_after(headers: Mapping[str, str] | None, *, now: float | None = None) -> float | None:
    """Seconds to wait, from ``retry-after-ms``, or ``retry-after`` as seconds or an HTTP date."""
    if not headers:
        return None
    ms = headers.get("retry-after-ms")
    if ms:
        try:
            value = float(ms) / 1000.0
            if math.isfinite(value):
                return max(value, 0.0)
        except ValueError:
            pass
    raw = headers.get("retry-after")
    if not raw:
        return None
    raw = raw.strip()
    try:
        value = float(raw)
        return max(value, 0.0) if math.isfinite(value) else None
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(raw)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None:
        return None
    current = time.time() if now is None else now
    return max(when.timestamp() - current, 0.0)


def error_code_from_body(body: bytes | Mapping[str, Any] | None) -> str | None:
    """A useful, safe error code from an OpenAI, Anthropic or Gemini error body, or None.

    Looks at ``error.code`` (when a string), ``error.type``, ``error.status``; generic codes
    are ignored, and a message that says the context window was exceeded gives
    ``context_length_exceeded``. Nothing else of the body is kept.
    """
    data: Any = body
    if isinstance(body, bytes | bytearray):
        try:
            data = orjson.loads(body)
        except orjson.JSONDecodeError:
            return None
    if not isinstance(data, Mapping):
        return None
    err = data.get("error")
    if isinstance(err, list) and err and isinstance(err[0], Mapping):
        err = err[0]  # some Gemini proxies wrap the error object in a list
    if not isinstance(err, Mapping):
        return None
    for key in ("code", "type", "status"):
        value = err.get(key)
        if isinstance(value, str) and _CODE_RE.match(value):
            code = value.lower()
            if code not in _GENERIC_CODES:
                return code
    message = err.get("message")
    if isinstance(message, str):
        lowered = message[:2000].lower()
        if any(hint in lowered for hint in _CONTEXT_HINTS):
            return ErrorCode.CONTEXT_LENGTH_EXCEEDED.value  # a plain str, as an upstream's code is
    return None


def map_status_error(status: int, body: bytes, headers: Mapping[str, str] | None = None) -> UpstreamError:
    """The gateway error for an upstream non-2xx response (the body only picks the ``code``)."""
    code = error_code_from_body(body)
    retry_after = parse_retry_after(headers)
    if status == 429:
        if code == "insufficient_quota":  # OpenAI's "out of credit": retrying will not help
            return UpstreamRateLimited(
                "The upstream provider's quota is exhausted.",
                code=ErrorCode.UPSTREAM_QUOTA_EXCEEDED,
                upstream_status=status,
            )
        return UpstreamRateLimited(
            "The upstream provider is rate limiting requests; retry later.",
            retryable=True,
            retry_after=retry_after,
            upstream_status=status,
        )
    if status in (401, 403):
        return UpstreamError(
            "The gateway could not authenticate with the upstream provider.",
            code=ErrorCode.UPSTREAM_AUTH_ERROR,
            upstream_status=status,
        )
    if status in _REJECTED_STATUSES:
        return UpstreamRejected(
            f"The upstream provider rejected the request (HTTP {status}).",
            code=code,
            upstream_status=status,
        )
    if status in _RETRYABLE_STATUSES:
        return UpstreamError(
            f"The upstream provider failed (HTTP {status}).",
            retryable=True,
            retry_after=retry_after,
            upstream_status=status,
        )
    return UpstreamError(
        f"The upstream provider returned an unexpected status (HTTP {status}).",
        retryable=status >= 500,
        upstream_status=status,
    )


def map_stream_error(
    kind: str | None,
    code: str | None,
    *,
    rate_limited: str,
    rejected: frozenset[str],
    retryable: frozenset[str],
    auth: frozenset[str] = frozenset(),
) -> UpstreamError:
    """The gateway error for an error the provider reported inside a 200 stream.

    ``kind`` is the provider's own classification (Anthropic's ``type``, Gemini's ``status``, an
    OpenAI ``code``); the sets say which kinds mean what. An unknown kind is not retryable, a
    missing one is (the provider failed without saying why).
    """
    if kind == rate_limited:
        return UpstreamRateLimited(
            "The upstream provider is rate limiting requests; retry later.", retryable=True
        )
    if kind in rejected:
        return UpstreamRejected("The upstream provider rejected the request.", code=code)
    if kind in auth:
        return UpstreamError(
            "The gateway could not authenticate with the upstream provider.",
            code=ErrorCode.UPSTREAM_AUTH_ERROR,
        )
    return UpstreamError(
        "The upstream provider failed while generating.",
        retryable=kind is None or kind in retryable,
        code=code,
    )
