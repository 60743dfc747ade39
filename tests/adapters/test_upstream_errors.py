"""adapters/upstream_errors.py: upstream statuses and error bodies mapped to the gateway's errors,
and Retry-After."""

from __future__ import annotations

import email.utils
import time

import httpx
import orjson
import pytest

from adapters.upstream_errors import error_code_from_body, map_status_error, parse_retry_after
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
    assert map_status_error(501, b"", {}).retryable


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
