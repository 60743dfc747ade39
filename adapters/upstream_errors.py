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

__all__ = [
    "context_overflow",
    "error_code_from_body",
    "map_status_error",
    "map_stream_error",
    "parse_retry_after",
    "reported_overflow",
]

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
# Codes that name a context overflow: OpenAI's, and llama.cpp's (its error ``type``).
_CONTEXT_CODES = frozenset({"context_length_exceeded", "exceed_context_size_error"})
_CONTEXT_HINTS = (
    "context length",
    "context_length",
    "context window",
    "context size",
    "maximum context",
    "prompt is too long",
    "too many tokens",
    "input token count",
    "exceeds the maximum number of tokens",
    "reduce the length",
)
_N = r"(\d[\d,]*)"
# What a provider's overflow message reports: the prompt's tokens, the window (``limit``) and the
# completion's share of it when the provider counts one. The first pattern that matches wins.
_OVERFLOW_COUNTS = tuple(
    re.compile(pattern.replace("N", _N), re.IGNORECASE | re.DOTALL)
    for pattern in (
        # vLLM >= 0.10: "'max_tokens' or 'max_completion_tokens' is too large: 100. This model's
        # maximum context length is 2048 tokens and your request has 2000 input tokens (...)"
        r"is too large: N\. This model's maximum context length is N tokens and your request has N input",
        # vLLM, older OpenAI: "maximum context length is 2048 tokens. However, you requested 3000
        # tokens (2900 in the messages, 100 in the completion)"
        r"maximum context length is N tokens.*? N tokens \(N in the messages, N in the completion\)",
        # OpenAI: "maximum context length is 128000 tokens. However, your messages resulted in
        # 130532 tokens"; vLLM: "... However, your request has 3000 input tokens"
        r"maximum context length is N tokens.*?(?:resulted in|request has) N (?:input )?tokens",
        # Anthropic: "prompt is too long: 208310 tokens > 200000 maximum"
        r"prompt is too long: N tokens > N maximum",
        # Gemini: "The input token count (1200000) exceeds the maximum number of tokens allowed (1048576)"
        r"input token count \(N\) exceeds the maximum number of tokens allowed \(N\)",
        # llama.cpp: "request (10030 tokens) exceeds the available context size (1024 tokens)"
        r"request \(N tokens\) exceeds the available context size \(N tokens\)",
    )
)
# Each pattern's groups, in order: which is the prompt (p), the window (w), the completion (c).
_OVERFLOW_GROUPS = ("cwp", "w_pc", "wp", "pw", "pw", "pw")


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


def _error_object(body: bytes | Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """The error object of an error body: its ``error`` (OpenAI, Anthropic, Gemini, llama.cpp),
    or the body itself when it has its ``message`` at the top (vLLM's)."""
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
    if isinstance(err, Mapping):
        return err
    return data if isinstance(data.get("message"), str) else None


def _count(value: Any) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return None


def reported_overflow(body: bytes | Mapping[str, Any] | None) -> tuple[int | None, int | None]:
    """``(prompt_tokens, context_limit)`` as a provider's context-overflow error reports them
    (llama.cpp's ``n_prompt_tokens`` and ``n_ctx``, or the numbers in an OpenAI, vLLM, Anthropic,
    Gemini or llama.cpp message); ``context_limit`` is the window less the completion's share
    when the provider counts one. None for what it does not say."""
    err = _error_object(body)
    if err is None:
        return None, None
    prompt, window = _count(err.get("n_prompt_tokens")), _count(err.get("n_ctx"))
    if prompt is not None:
        return prompt, window
    message = err.get("message")
    if not isinstance(message, str):
        return None, None
    for pattern, groups in zip(_OVERFLOW_COUNTS, _OVERFLOW_GROUPS, strict=True):
        found = pattern.search(message[:2000])
        if found is None:
            continue
        numbers = dict(zip(groups, (int(n.replace(",", "")) for n in found.groups()), strict=True))
        window = numbers["w"] - numbers.get("c", 0)
        return numbers["p"] or None, window if window > 0 else None
    return None, None


def context_overflow(body: bytes | Mapping[str, Any] | None, status: int | None = None) -> UpstreamRejected:
    """The gateway error for an upstream's context overflow: 400 ``context_length_exceeded``,
    with the counts it reported (``reported_overflow``)."""
    prompt, limit = reported_overflow(body)
    counted = f" (it counted {prompt} tokens" if prompt is not None else ""
    if counted:
        counted += f", {limit} allowed)" if limit is not None else ")"
    return UpstreamRejected(
        f"The input is longer than the upstream model's context window{counted}. Shorten it or "
        "compact the conversation (POST /v1/responses/compact).",
        code=ErrorCode.CONTEXT_LENGTH_EXCEEDED,
        param="input",
        upstream_status=status,
        prompt_tokens=prompt,
        context_limit=limit,
    )


def error_code_from_body(body: bytes | Mapping[str, Any] | None) -> str | None:
    """A useful, safe error code from an OpenAI, Anthropic, Gemini, vLLM or llama.cpp error body,
    or None.

    Looks at ``error.code`` (when a string), ``error.type``, ``error.status``; generic codes
    are ignored, and llama.cpp's ``exceed_context_size_error`` or a message that says the context
    window was exceeded gives ``context_length_exceeded``. Nothing else of the body is kept.
    """
    err = _error_object(body)
    if err is None:
        return None
    for key in ("code", "type", "status"):
        value = err.get(key)
        if isinstance(value, str) and _CODE_RE.match(value):
            code = value.lower()
            if code in _CONTEXT_CODES:
                return ErrorCode.CONTEXT_LENGTH_EXCEEDED.value
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
    if code == ErrorCode.CONTEXT_LENGTH_EXCEEDED and status not in (401, 403, 429):
        return context_overflow(body, status)
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
