"""What llama-server showed that our fakes never did (issue 21), kept as tests against it.

Context overflow (its ``exceed_context_size_error`` with the real count) answered as
``context_length_exceeded``, and recovered with ``truncation: "auto"``; a request-specific 500 (an
image to a text-only model) tried once, ejecting nothing, its reason passed on scrubbed; and what the
resource echoes of sampling is what the server applied.
"""

from __future__ import annotations

import base64
from typing import Any

import openai
import pytest
from structlog.testing import capture_logs

from tests.harness import ServedApp
from tests.llama_cpp.server import LlamaServer
from tests.llama_cpp.test_llama_server import MODELS, client

# ~6,000 tokens to llama.cpp's tokenizer (one per digit) in 6,000 bytes: 1,500 at four bytes a token
DIGITS = "1234567890" * 600
# a 1x1 PNG
PIXEL = base64.b64encode(
    bytes.fromhex(
        "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
        "1f15c4890000000d49444154789c6360000002000154a24f5d0000000049454e44ae426082"
    )
).decode()
IMAGE_INPUT: Any = [
    {
        "type": "message",
        "role": "user",
        "content": [
            {"type": "input_text", "text": "What is in this picture?"},
            {"type": "input_image", "image_url": f"data:image/png;base64,{PIXEL}"},
        ],
    }
]
NO_IMAGES = "image input is not supported"


@pytest.mark.parametrize("model", MODELS)
async def test_upstream_overflow_is_context_length_exceeded(llama_gateway: ServedApp, model: str) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        await client(llama_gateway).responses.create(
            model=f"{model}-wide", input=DIGITS, max_output_tokens=16, truncation="disabled"
        )
    assert info.value.code == "context_length_exceeded"


@pytest.mark.parametrize("model", MODELS)
async def test_gateway_estimate_refuses_what_cannot_fit(
    llama: LlamaServer, llama_gateway: ServedApp, model: str
) -> None:
    """The gateway's own estimate knows a run of digits is ~a token a digit: it refuses before sending."""
    before = llama.log_count("exceeds the available context size")
    with pytest.raises(openai.BadRequestError) as info:
        await client(llama_gateway).responses.create(
            model=model, input=DIGITS, max_output_tokens=16, truncation="disabled"
        )
    assert info.value.code == "context_length_exceeded"
    assert llama.log_count("exceeds the available context size") == before, "nothing was sent"


@pytest.mark.parametrize("model", MODELS)
async def test_truncation_auto_recovers_from_an_upstream_overflow(
    llama: LlamaServer, llama_gateway: ServedApp, model: str
) -> None:
    history: Any = [
        {"type": "message", "role": "user", "content": DIGITS},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Noted."}]},
        {"type": "message", "role": "user", "content": "Say hello."},
    ]
    response = await client(llama_gateway).responses.create(
        model=f"{model}-wide", input=history, max_output_tokens=16, temperature=0, truncation="auto"
    )
    assert response.status in ("completed", "incomplete"), response.error
    assert response.output_text.strip()
    assert response.usage is not None and response.usage.input_tokens < 4096


async def test_request_specific_500_is_tried_once_and_reason_passed(
    llama: LlamaServer, llama_gateway: ServedApp
) -> None:
    before = llama.log_count(NO_IMAGES)
    with pytest.raises(openai.APIStatusError) as info:
        await client(llama_gateway).responses.create(
            model="smol-chat", input=IMAGE_INPUT, max_output_tokens=16
        )
    assert llama.log_count(NO_IMAGES) == before + 1, "one attempt: a retry cannot fix it"
    message = str(info.value.message)
    assert NO_IMAGES in message, message
    assert "127.0.0.1" not in message and str(llama.port) not in message and "sk-llama" not in message


async def test_request_specific_failures_eject_nothing(llama: LlamaServer, llama_gateway: ServedApp) -> None:
    sdk = client(llama_gateway)
    before = llama.log_count(NO_IMAGES)
    with capture_logs() as logs:
        for _ in range(4):  # more than eject_after (3) on each deployment
            with pytest.raises(openai.APIStatusError):
                await sdk.responses.create(model="smol-pair", input=IMAGE_INPUT, max_output_tokens=16)
    assert llama.log_count(NO_IMAGES) == before + 4, "one attempt each, on one deployment"
    assert [line for line in logs if line["event"] == "deployment_ejected"] == []
    for _ in range(2):  # both deployments still serve
        response = await sdk.responses.create(
            model="smol-pair", input="Hi.", max_output_tokens=16, temperature=0
        )
        assert response.status in ("completed", "incomplete"), response.error


@pytest.mark.parametrize("model", MODELS)
async def test_echoed_sampling_is_what_the_server_applied(
    llama: LlamaServer, llama_gateway: ServedApp, model: str
) -> None:
    sdk = client(llama_gateway)
    for asked in ({}, {"temperature": 0.3, "top_p": 0.5}):
        response = await sdk.responses.create(
            model=model,
            input="Hi.",
            max_output_tokens=16,
            temperature=asked.get("temperature"),
            top_p=asked.get("top_p"),
        )
        applied = llama.last_sampling()
        for name in ("temperature", "top_p"):
            echoed = getattr(response, name)
            if echoed is not None:
                assert echoed == pytest.approx(applied[name], abs=1e-6), (name, asked, applied[name])
