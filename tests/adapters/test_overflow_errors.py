"""adapters/upstream_errors.py on context overflows: each provider's error body is
``context_length_exceeded`` (400, not retryable), with the prompt's tokens and the window it
reported (``reported_overflow``)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from adapters.upstream_errors import error_code_from_body, map_status_error, reported_overflow
from gateway.kernel.errors import UpstreamRejected
from tests.adapters.helpers import assert_clean
from tests.fakes.overflow import ANTHROPIC, GEMINI, LLAMA_CPP, OPENAI_CHAT, OPENAI_RESPONSES, VLLM, VLLM_NEW

# (body, (prompt_tokens, context_limit))
CASES = [
    (LLAMA_CPP, (10030, 1024)),
    (OPENAI_CHAT, (130532, 128000)),
    (OPENAI_RESPONSES, (None, None)),
    (ANTHROPIC, (208310, 200000)),
    (GEMINI, (1200000, 1048576)),
    (VLLM, (2900, 1948)),  # the window less the 100 the completion asked for
    (VLLM_NEW, (2000, 1948)),
]
IDS = ["llama.cpp", "openai-chat", "openai-responses", "anthropic", "gemini", "vllm", "vllm-0.10"]


@pytest.mark.parametrize(("body", "counts"), CASES, ids=IDS)
def test_each_providers_overflow(body: dict[str, Any], counts: tuple[int | None, int | None]) -> None:
    raw = orjson.dumps(body)
    assert error_code_from_body(raw) == "context_length_exceeded"
    assert reported_overflow(raw) == counts
    err = map_status_error(400, raw, {})
    assert isinstance(err, UpstreamRejected) and not err.retryable
    assert err.code == "context_length_exceeded" and err.status == 400 and err.param == "input"
    assert (err.prompt_tokens, err.context_limit) == counts
    assert err.upstream_status == 400
    assert_clean(err)


def test_llama_cpps_message_alone_gives_its_counts() -> None:
    error = {k: v for k, v in LLAMA_CPP["error"].items() if k not in ("n_prompt_tokens", "n_ctx", "type")}
    assert reported_overflow({"error": error}) == (10030, 1024)
    assert error_code_from_body({"error": error}) == "context_length_exceeded"


def test_an_overflow_under_a_5xx_is_not_retried() -> None:
    # an older llama-server answered 500 with the same words
    body = orjson.dumps(
        {"error": {"code": 500, "message": LLAMA_CPP["error"]["message"], "type": "server_error"}}
    )
    err = map_status_error(500, body, {})
    assert err.code == "context_length_exceeded" and not err.retryable and err.status == 400


def test_counts_with_thousands_separators_and_nothing_to_read() -> None:
    message = "prompt is too long: 208,310 tokens > 200,000 maximum"
    assert reported_overflow({"error": {"type": "invalid_request_error", "message": message}}) == (
        208310,
        200000,
    )
    assert reported_overflow(b"not json") == (None, None)
    assert reported_overflow({"error": {"message": "something else"}}) == (None, None)
    assert reported_overflow({"error": {"n_prompt_tokens": True, "message": 3}}) == (None, None)
