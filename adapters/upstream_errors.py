"""Upstream errors classified: an HTTP status, an error body or an error reported inside a 200
stream → the ``gateway.kernel.errors`` class, ``code``, retry hint and the provider's own reason.

Pure (no I/O): the stream translators use it as much as the transport does. Messages are the
gateway's own words, followed, for a failure a retry cannot fix, by the provider's reason as
``scrub_reason`` leaves it ("The provider said: …"): bounded, with URLs, hosts, addresses, e-mail
addresses and anything key-shaped taken out. No upstream URL, key or raw body ever reaches one.

What retries and what ejects (``UpstreamError.retryable``; gateway/engine/balance.py counts a
failure against a deployment's health exactly when it is retryable): connect errors, timeouts,
408/409/425/429 and 5xx statuses but 501 are transient, unless the body of a 500 says the request
itself cannot be served (its message holds one of ``REQUEST_SPECIFIC_HINTS``): that one is the
same on every deployment, so it is neither retried nor held against the deployment.
"""

from __future__ import annotations

import email.utils
import math
import re
import time
from collections.abc import Iterable, Mapping
from typing import Any

import orjson

from gateway.kernel.errors import ErrorCode, UpstreamError, UpstreamRateLimited, UpstreamRejected

__all__ = [
    "REASON_LIMIT",
    "REQUEST_SPECIFIC_HINTS",
    "context_overflow",
    "error_code_from_body",
    "map_status_error",
    "map_stream_error",
    "parse_retry_after",
    "reported_overflow",
    "request_specific",
    "scrub_reason",
    "upstream_reason",
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
# A 5xx whose message holds one of these says the request itself cannot be served (llama-server:
# "image input is not supported", "the model produced output that does not match the expected
# format"): sending it again, or elsewhere, gets the same answer. The one list of them.
REQUEST_SPECIFIC_HINTS = (
    "not supported",
    "unsupported",
    "does not match the expected format",
    "invalid",
    "requires",
    "is required",
    "must be",
    "not allowed",
    "cannot be",
    *_CONTEXT_HINTS,
)

# -- the provider's reason, scrubbed -------------------------------------------------------------
REASON_LIMIT = 300  # characters of a provider's reason passed on
_READ_LIMIT = 2000  # characters of a message looked at (the rest is never scanned)
# A run without a space this long is no word of a reason (a blob, a URL with a long query): it goes
# whole, and no pattern below ever scans a longer run (their backtracking stays linear).
_LONG_RUN_RE = re.compile(r"\S{80,}")
_SAID = "The provider said:"
_TLDS = (
    "com|net|org|io|ai|dev|app|cloud|co|info|biz|xyz|me|us|eu|uk|de|fr|nl|jp|cn|in|ru|br|ch|se|au|ca|kr"
    "|local|localhost|localdomain|internal|intranet|lan|corp|home|svc|cluster|private|test|example|invalid"
)
# (pattern, replacement), in order: URLs first (their host, key and path go with them), then
# credentials by their names, key shapes, addresses and host names.
_SCRUBS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"\b[A-Za-z][A-Za-z0-9+.\-]{0,20}://\S*"), "[url]"),
    (re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=\-]{4,}"), r"\1 [redacted]"),
    (
        re.compile(
            r"(?i)\b((?:x-)?(?:[a-z]+[-_])?(?:api[-_]?key|key|token|secret|password|passwd|authorization|"
            r"credentials?|signature|sig))(\s*[=:]\s*)([\"']?)[^\s\"',;&)]{4,}"
        ),
        r"\1\2\3[redacted]",
    ),
    (
        re.compile(
            r"\b(?:sk|pk|rk|ak|key|ghp|gho|ghu|ghs|ghr|github_pat|glpat|hf|xox[abposr]|npm|pypi)[-_]"
            r"[A-Za-z0-9_\-*]{6,}"  # (* too: a key the provider masked, sk-proj-****abcd)
            r"|\bAIza[0-9A-Za-z_\-]{10,}|\b(?:AKIA|ASIA|AGPA|AIDA|AROA)[0-9A-Z]{12,}\b"
            r"|\beyJ[A-Za-z0-9_\-]{4,}(?:\.[A-Za-z0-9_\-]*){0,2}"
        ),
        "[redacted]",
    ),
    (re.compile(r"\b[\w.+\-]+@[\w\-]+(?:\.[\w\-]+)+"), "[email]"),
    (re.compile(r"\[[0-9A-Fa-f:.]*:[0-9A-Fa-f:.]*\](?::\d{1,5})?"), "[host]"),
    (
        re.compile(
            r"(?<![\w:.])(?:[0-9A-Fa-f]{1,4}:){2,7}[0-9A-Fa-f]{1,4}(?![\w:])"
            r"|(?<![\w:])[0-9A-Fa-f:]*::[0-9A-Fa-f:]*(?![\w:])"
        ),
        "[host]",
    ),
    (re.compile(r"\b\d{1,3}(?:\.\d{1,3}){3}(?::\d{1,5})?\b"), "[host]"),
    (
        re.compile(
            rf"\b(?:[A-Za-z0-9](?:[A-Za-z0-9\-]{{0,61}}[A-Za-z0-9])?\.)+(?:{_TLDS})\b(?::\d{{1,5}})?",
            re.IGNORECASE,
        ),
        "[host]",
    ),
    (re.compile(r"\b[A-Za-z][A-Za-z0-9\-]*(?:\.[A-Za-z0-9\-]+)*:\d{2,5}\b"), "[host]"),
)
_TOKEN_RE = re.compile(r"[A-Za-z0-9_\-+/=]{16,}")
_RUN_RE = re.compile(r"[A-Za-z0-9]{12,}")
_SPACE_RE = re.compile(r"[\s\x00-\x1f\x7f]+")


def _key_shaped(token: str) -> bool:
    """A long run of letters and digits mixed (hex, base64, a random key), not a word or a
    model name such as ``gpt-4o-mini-2024-07-18``."""
    for run in _RUN_RE.findall(token):
        if any(c.isdigit() for c in run) and any(c.isalpha() for c in run):
            return True
    return False


def scrub_reason(text: str, known: Iterable[str] = ()) -> str | None:
    """A provider's reason made safe to pass on: ``known`` strings (the gateway's key, the
    upstream's host) removed, then URLs, credentials, key-shaped strings, e-mail addresses, IP
    addresses, ``host:port`` and host names; whitespace collapsed; at most ``REASON_LIMIT``
    characters. None when nothing is left."""
    text = _SPACE_RE.sub(" ", text[:_READ_LIMIT])
    for secret in known:
        if len(secret) >= 4:
            text = text.replace(secret, "[redacted]")
    text = _LONG_RUN_RE.sub("[redacted]", text)
    for pattern, replacement in _SCRUBS:
        text = pattern.sub(replacement, text)
    text = _TOKEN_RE.sub(lambda m: "[redacted]" if _key_shaped(m.group()) else m.group(), text)
    text = text.strip(" .")
    if not text:
        return None
    if len(text) > REASON_LIMIT:
        cut = text[: REASON_LIMIT - 1]
        text = (cut.rsplit(" ", 1)[0] if " " in cut[REASON_LIMIT // 2 :] else cut) + "…"
    return text


def upstream_reason(body: bytes | Mapping[str, Any] | None, known: Iterable[str] = ()) -> str | None:
    """The scrubbed message of an OpenAI, Anthropic or Gemini error body (``error.message``, an
    ``error`` string, a top-level ``message`` or ``detail``), or None. A body that is not JSON
    (an HTML error page) gives none: only a message the provider wrote for its client is kept."""
    data = _parsed(body)
    if not isinstance(data, Mapping):
        return None
    err = data.get("error")
    if isinstance(err, list) and err and isinstance(err[0], Mapping):
        err = err[0]
    message: Any = err.get("message") if isinstance(err, Mapping) else err
    if not isinstance(message, str):
        message = data.get("message") or data.get("detail")
    return scrub_reason(message, known) if isinstance(message, str) else None


def request_specific(reason: str | None) -> bool:
    """The provider's reason says the request itself cannot be served (``REQUEST_SPECIFIC_HINTS``)."""
    if not reason:
        return False
    lowered = reason.lower()
    return any(hint in lowered for hint in REQUEST_SPECIFIC_HINTS)


def _said(own: str, reason: str | None) -> str:
    """The gateway's own words first, then the provider's reason as its words."""
    return f"{own} {_SAID} {reason}" if reason else own


def _parsed(body: bytes | Mapping[str, Any] | None) -> Any:
    if isinstance(body, bytes | bytearray):
        try:
            return orjson.loads(body)
        except orjson.JSONDecodeError:
            return None
    return body


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
    data = _parsed(body)
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


def map_status_error(
    status: int,
    body: bytes | Mapping[str, Any],
    headers: Mapping[str, str] | None = None,
    *,
    known: Iterable[str] = (),
) -> UpstreamError:
    """The gateway error for an upstream non-2xx response: the status and the body's message
    decide whether a retry can fix it; the body picks the ``code`` and gives the ``reason``
    (``known``: strings to take out of it besides the usual shapes, the gateway's key and the
    upstream's host). The reason is in the message for what a retry cannot fix, but for 401/403
    and an exhausted quota, which are about the gateway's own account; every error keeps it as
    ``reason``, for the log line."""
    data = _parsed(body)
    code = error_code_from_body(data)
    reason = upstream_reason(data, known)
    if code == ErrorCode.CONTEXT_LENGTH_EXCEEDED and status not in (401, 403, 429):
        overflow = context_overflow(data, status)
        overflow.reason = reason
        return overflow
    retry_after = parse_retry_after(headers)
    exc: UpstreamError
    if status == 429:
        if code == "insufficient_quota":  # OpenAI's "out of credit": retrying will not help
            exc = UpstreamRateLimited(
                "The upstream provider's quota is exhausted.",
                code=ErrorCode.UPSTREAM_QUOTA_EXCEEDED,
                upstream_status=status,
            )
        else:
            exc = UpstreamRateLimited(
                "The upstream provider is rate limiting requests; retry later.",
                retryable=True,
                retry_after=retry_after,
                upstream_status=status,
            )
    elif status in (401, 403):
        exc = UpstreamError(
            "The gateway could not authenticate with the upstream provider.",
            code=ErrorCode.UPSTREAM_AUTH_ERROR,
            upstream_status=status,
        )
    elif status in _REJECTED_STATUSES:
        exc = UpstreamRejected(
            _said(f"The upstream provider rejected the request (HTTP {status}).", reason),
            code=code,
            upstream_status=status,
        )
    elif status == 500 and (request_specific(reason) or code == ErrorCode.CONTEXT_LENGTH_EXCEEDED):
        exc = UpstreamError(
            _said(f"The upstream provider could not serve this request (HTTP {status}).", reason),
            code=code,
            upstream_status=status,
        )
    elif status in _RETRYABLE_STATUSES:
        exc = UpstreamError(
            f"The upstream provider failed (HTTP {status}).",
            retryable=True,
            retry_after=retry_after,
            upstream_status=status,
        )
    else:  # 5xx but 501 are worth a retry; any other status is the request's
        retryable = status >= 500 and status != 501
        own = f"The upstream provider returned an unexpected status (HTTP {status})."
        exc = UpstreamError(
            own if retryable else _said(own, reason), retryable=retryable, upstream_status=status
        )
    exc.reason = reason
    return exc


def map_stream_error(
    kind: str | None,
    code: str | None,
    *,
    rate_limited: str,
    rejected: frozenset[str],
    retryable: frozenset[str],
    auth: frozenset[str] = frozenset(),
    error: Any = None,
) -> UpstreamError:
    """The gateway error for an error the provider reported inside a 200 stream.

    ``kind`` is the provider's own classification (Anthropic's ``type``, Gemini's ``status``, an
    OpenAI ``code``); the sets say which kinds mean what. An unknown kind is not retryable, a
    missing one is (the provider failed without saying why), unless the ``error`` object's message
    says the request itself cannot be served. That message is passed on as the provider's reason
    for a rejected request and for any failure a retry cannot fix.
    """
    reason = upstream_reason({"error": error}) if error is not None else None
    exc: UpstreamError
    if kind == rate_limited:
        exc = UpstreamRateLimited(
            "The upstream provider is rate limiting requests; retry later.", retryable=True
        )
    elif kind in rejected:
        exc = UpstreamRejected(_said("The upstream provider rejected the request.", reason), code=code)
    elif kind in auth:
        exc = UpstreamError(
            "The gateway could not authenticate with the upstream provider.",
            code=ErrorCode.UPSTREAM_AUTH_ERROR,
        )
    else:
        again = (kind is None or kind in retryable) and not request_specific(reason)
        own = "The upstream provider failed while generating."
        exc = UpstreamError(own if again else _said(own, reason), retryable=again, code=code)
    exc.reason = reason
    return exc
