"""adapters/upstream_errors.py: upstream statuses and error bodies mapped to the gateway's errors,
Retry-After, and the provider's reason scrubbed."""

from __future__ import annotations

import email.utils
import time
from typing import Any

import httpx
import orjson
import pytest

from adapters.upstream_errors import (
    REASON_LIMIT,
    error_code_from_body,
    map_status_error,
    map_stream_error,
    parse_retry_after,
    scrub_reason,
)
from gateway.kernel.errors import UpstreamError, UpstreamRateLimited, UpstreamRejected
from tests.adapters.helpers import MARKER, SECRET, assert_clean, openai_error


# -- map_status_error -----------------------------------------------------------------------------
@pytest.mark.parametrize("status", [500, 502, 503, 504, 408, 529])
def test_retryable_statuses(status: int) -> None:
    err = map_status_error(status, openai_error(None, type_="server_error"), {})
    assert type(err) is UpstreamError
    assert err.retryable and err.upstream_status == status
    assert err.status == 502 and err.code == "upstream_error"
    assert_clean(err)


@pytest.mark.parametrize("status", [400, 404, 422])
def test_rejected_statuses(status: int) -> None:
    err = map_status_error(status, openai_error(None), {})
    assert isinstance(err, UpstreamRejected)
    assert not err.retryable and err.status == 400
    assert err.code == "upstream_invalid_request"
    assert_clean(err)


def test_context_length_code_from_openai_body() -> None:
    err = map_status_error(400, openai_error("context_length_exceeded"), {})
    assert isinstance(err, UpstreamRejected) and err.code == "context_length_exceeded"
    assert_clean(err)


def test_context_length_from_message_hints() -> None:
    anthropic = orjson.dumps(
        {"type": "error", "error": {"type": "invalid_request_error", "message": "prompt is too long: 1 > 0"}}
    )
    gemini = orjson.dumps(
        {
            "error": {
                "code": 400,
                "status": "INVALID_ARGUMENT",
                "message": "The input token count (9) exceeds the maximum number of tokens allowed (8).",
            }
        }
    )
    vllm = orjson.dumps(
        {
            "error": {
                "message": "This model's maximum context length is 8 tokens.",
                "type": "BadRequestError",
                "code": 400,
            }
        }
    )
    for body in (anthropic, gemini, vllm):
        assert map_status_error(400, body, {}).code == "context_length_exceeded"


def test_error_code_from_body_shapes() -> None:
    assert error_code_from_body(openai_error("model_not_found")) == "model_not_found"
    assert error_code_from_body(orjson.dumps({"type": "error", "error": {"type": "overloaded_error"}})) == (
        "overloaded_error"
    )
    assert error_code_from_body(orjson.dumps({"error": {"code": 429, "status": "RESOURCE_EXHAUSTED"}})) == (
        "resource_exhausted"
    )
    assert error_code_from_body(openai_error(None)) is None  # generic type only
    assert error_code_from_body(openai_error("has spaces <script>")) is None
    assert error_code_from_body(openai_error("x" * 100)) is None
    assert error_code_from_body(b"<html>502 Bad Gateway</html>") is None
    assert error_code_from_body(b"") is None
    assert error_code_from_body(orjson.dumps([1, 2])) is None


def test_429_rate_limited_with_retry_after() -> None:
    err = map_status_error(429, openai_error("rate_limit_exceeded"), {"retry-after": "7"})
    assert isinstance(err, UpstreamRateLimited)
    assert err.retryable and err.retry_after == 7.0 and err.status == 429
    assert err.code == "rate_limit_exceeded"
    assert_clean(err)


def test_429_insufficient_quota_is_not_retryable() -> None:
    err = map_status_error(429, openai_error("insufficient_quota"), {"retry-after": "1"})
    assert isinstance(err, UpstreamRateLimited) and not err.retryable
    assert_clean(err)


@pytest.mark.parametrize("status", [401, 403])
def test_auth_errors(status: int) -> None:
    err = map_status_error(status, openai_error("invalid_api_key", message=f"Incorrect API key {SECRET}"), {})
    assert type(err) is UpstreamError and err.code == "upstream_auth_error" and not err.retryable
    assert_clean(err)


def test_other_statuses() -> None:
    err = map_status_error(418, b"teapot " + MARKER.encode(), {})
    assert type(err) is UpstreamError and not err.retryable and err.upstream_status == 418
    assert_clean(err)
    assert map_status_error(502, b"", {}).retryable
    assert not map_status_error(501, b"", {}).retryable  # not implemented: not on a retry either


def test_503_carries_retry_after() -> None:
    assert map_status_error(503, b"", {"retry-after": "2"}).retry_after == 2.0


# -- Retry-After ----------------------------------------------------------------------------------
def test_parse_retry_after_forms() -> None:
    assert parse_retry_after({"retry-after": "3"}) == 3.0
    assert parse_retry_after({"retry-after": " 1.5 "}) == 1.5
    assert parse_retry_after({"retry-after": "-4"}) == 0.0
    assert parse_retry_after({"retry-after-ms": "250", "retry-after": "9"}) == 0.25
    now = time.time()
    date = email.utils.formatdate(now + 30, usegmt=True)
    assert 28.0 <= parse_retry_after({"retry-after": date}, now=now) <= 31.0  # type: ignore[operator]
    past = email.utils.formatdate(now - 30, usegmt=True)
    assert parse_retry_after({"retry-after": past}, now=now) == 0.0
    assert parse_retry_after({"retry-after": "soon"}) is None
    assert parse_retry_after({"retry-after": "nan"}) is None
    assert parse_retry_after({}) is None
    assert parse_retry_after(None) is None
    assert parse_retry_after(httpx.Headers({"Retry-After": "5"})) == 5.0


# -- the provider's reason, scrubbed ----------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "kept", "gone"),
    [
        ("Incorrect API key provided: sk-live-SECRET-0123456789.", "Incorrect API key provided", SECRET),
        ("masked sk-proj-********************abcd here", "masked", "abcd"),
        ("failed at https://api.example.com/v1/chat?key=abc123", "failed at", "example"),
        ("no route to 10.0.0.5:8080 nor [fe80::1]:443 nor fe80::1ff:fe23:4567:890a", "no route", "10.0.0.5"),
        ("backend llm-1:11434 is down", "backend", "11434"),
        ("host gpu-7.inference.internal and api.openai.com refused", "refused", "inference.internal"),
        ("Authorization: Bearer abcDEF123456789xyz", "Authorization", "abcDEF123456789xyz"),
        ("api_key=zzzz1234 and token: 'qqqq9999'", "and", "zzzz1234"),
        ("AIzaSyA1234567890abcdefghijklmnopqrstu bad", "bad", "AIza"),
        ("AKIAIOSFODNN7EXAMPLE bad", "bad", "AKIA"),
        ("jwt eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.abc bad", "bad", "eyJ"),
        ("digest 0123456789abcdef0123456789abcdef bad", "bad", "0123456789abcdef"),
        ("mail ops@example.com please", "please", "ops@"),
        ("model gpt-4o-mini-2024-07-18 not found", "gpt-4o-mini-2024-07-18", "[redacted]"),
        ("Invalid value at 'messages[0].content'", "messages[0].content", "[host]"),
    ],
)
def test_scrub_reason_takes_out_what_is_secret_and_keeps_the_reason(text: str, kept: str, gone: str) -> None:
    scrubbed = scrub_reason(text)
    assert scrubbed is not None and kept in scrubbed and gone not in scrubbed, scrubbed


def test_scrub_reason_takes_out_known_strings_and_is_bounded() -> None:
    assert scrub_reason("key localbox echoed", known=["localbox"]) == "key [redacted] echoed"
    long = scrub_reason("word " * 500)
    assert long is not None and len(long) <= REASON_LIMIT and long.endswith("…")
    assert scrub_reason(" \n\t ") is None
    assert scrub_reason("x" * 100 + " tail") == "[redacted] tail"  # no word is that long: a blob goes
    assert scrub_reason("a." * 2000) == "[redacted]"  # (and no pattern backtracks over it)
    assert scrub_reason("a\x00b\nc") == "a b c"  # no control byte or line break goes on


def test_a_rejection_says_the_providers_reason() -> None:
    reason = "top_logprobs requires logprobs to be set to true"
    body = orjson.dumps({"error": {"code": 400, "message": reason}})
    err = map_status_error(400, body, {})
    assert err.message == (
        "The upstream provider rejected the request (HTTP 400). "
        "The provider said: top_logprobs requires logprobs to be set to true"
    )
    assert err.reason == "top_logprobs requires logprobs to be set to true"
    html = map_status_error(400, b"<html>" + MARKER.encode() + b"</html>", {})
    assert html.reason is None and MARKER not in html.message  # only a JSON message is a reason


@pytest.mark.parametrize(
    "message",
    [
        "image input is not supported - hint: if this is unexpected, you may need to provide the mmproj",
        "the model produced output that does not match the expected format",
    ],
)
def test_a_500_that_names_the_request_is_not_retried(message: str) -> None:
    err = map_status_error(500, orjson.dumps({"error": {"code": 500, "message": message}}), {})
    assert type(err) is UpstreamError and not err.retryable and err.status == 502
    assert err.message.endswith(f"The provider said: {message}")


def test_an_overflow_under_a_500_is_context_length_exceeded_with_its_reason_logged() -> None:
    message = "request (10030 tokens) exceeds the available context size (1024 tokens), try increasing it"
    err = map_status_error(500, orjson.dumps({"error": {"code": 500, "message": message}}), {})
    assert err.code == "context_length_exceeded" and err.status == 400 and not err.retryable
    assert (err.prompt_tokens, err.context_limit) == (10030, 1024)
    assert err.reason == message  # for the log line; the message is the gateway's own words


def test_a_bare_500_and_any_502_503_stay_transient() -> None:
    assert map_status_error(500, orjson.dumps({"error": {"message": "oops"}}), {}).retryable
    for status in (502, 503, 504):
        err = map_status_error(status, orjson.dumps({"error": {"message": "invalid upstream"}}), {})
        assert err.retryable and "invalid" not in err.message  # transient: no reason in the message
        assert err.reason == "invalid upstream"  # (for the log line)


def test_account_failures_keep_the_reason_for_the_log_only() -> None:
    for status, code in ((401, "invalid_api_key"), (429, "insufficient_quota"), (429, "rate_limit_exceeded")):
        err = map_status_error(status, openai_error(code, message="about your account"), {})
        assert err.reason == "about your account" and "account" not in err.message


def test_an_in_stream_error_that_names_the_request_is_not_retried() -> None:
    kinds: dict[str, Any] = {
        "rate_limited": "rl",
        "rejected": frozenset({"bad"}),
        "retryable": frozenset({"busy"}),
    }
    err = map_stream_error("busy", None, error={"message": "image input is not supported"}, **kinds)
    assert not err.retryable and err.message.endswith("The provider said: image input is not supported")
    err = map_stream_error("busy", None, error={"message": "overloaded"}, **kinds)
    assert err.retryable and "overloaded" not in err.message
    err = map_stream_error("bad", None, error={"message": f"no {SECRET}"}, **kinds)
    assert isinstance(err, UpstreamRejected) and SECRET not in err.message and "said: no" in err.message
