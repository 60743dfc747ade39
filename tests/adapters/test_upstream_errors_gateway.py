"""Upstream failures through the gateway (the app under uvicorn, fake upstreams on loopback): the
provider's reason reaches the client, scrubbed of keys, URLs and hosts, in the reply and in the
log; only transient failures are retried or held against a deployment; and an unstreamed call
whose connection is lost after it went out is not sent again."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import orjson
import pytest
from structlog.testing import capture_logs

from tests.adapters.wire import content_length
from tests.fakes.anthropic import FakeAnthropic
from tests.fakes.gemini import FakeGemini
from tests.fakes.openai_chat import FakeOpenAIChat
from tests.fakes.openai_chat import Reply as ChatReply
from tests.fakes.openai_responses import FakeOpenAIResponses
from tests.fakes.scripted import FakeUpstream, Reply
from tests.fakes.server import serve_raw
from tests.harness import serve_gateway

KEY = "sk-upstream-Key-0123456789abcdef"  # the gateway's key for the upstream
OTHER_KEY = "sk-proj-AbCdEf0123456789xyzXYZ"  # a key the gateway does not know
TOKEN = "tok_9f8e7d6c5b4a3210FEDCBA"  # a bearer token
HOST_PORT = "llm-backend:11434"
INTERNAL_HOST = "gpu-7.inference.internal"
IP = "10.20.30.40"
REASON = "top_logprobs requires logprobs to be set to true"

FAKES: dict[str, type[FakeUpstream[Any]]] = {
    "openai-chat": FakeOpenAIChat,
    "openai-responses": FakeOpenAIResponses,
    "anthropic": FakeAnthropic,
    "gemini": FakeGemini,
}


def _hostile_message(base_url: str) -> str:
    """A reason followed by everything that must not reach a client."""
    return (
        f"{REASON}. Sent with key {KEY} (also {OTHER_KEY}) to {base_url}/chat, "
        f"via {HOST_PORT}, {INTERNAL_HOST} and {IP}:8443; Authorization: Bearer {TOKEN}"
    )


def _secrets(base_url: str) -> list[str]:
    port = base_url.split(":")[2].split("/")[0]
    return [KEY, OTHER_KEY, TOKEN, base_url, "127.0.0.1", port, HOST_PORT, "11434", INTERNAL_HOST, IP, "8443"]


def _error(kind: str, fake: FakeUpstream[Any], status: int, message: str) -> Any:
    body = fake.error_body(status, message, "invalid" if status < 500 else "server")
    return (ChatReply if kind == "openai-chat" else Reply).error(status, body)


@contextlib.contextmanager
def _gateway(providers: dict[str, dict[str, Any]], model: dict[str, Any]) -> Iterator[str]:
    settings = {"providers": providers, "models": {"m": model}}
    with serve_gateway(settings) as served:
        yield served.base_url


async def _ask(base_url: str, *, stream: bool = False) -> httpx.Response:
    async with httpx.AsyncClient(base_url=base_url, timeout=30, trust_env=False) as c:
        return await c.post("/v1/responses", json={"model": "m", "input": "x", "stream": stream})


@contextlib.asynccontextmanager
async def _served(kind: str) -> AsyncIterator[FakeUpstream[Any]]:
    async with FAKES[kind].serve() as fake:
        yield fake


# -- the provider's reason reaches the client, and nothing secret does -------------------------------
@pytest.mark.parametrize("kind", list(FAKES))
@pytest.mark.parametrize("stream", [False, True])
async def test_a_rejection_carries_the_providers_reason_scrubbed(kind: str, stream: bool) -> None:
    async with _served(kind) as fake:
        fake.add(_error(kind, fake, 400, _hostile_message(fake.base_url)))
        provider = {"kind": kind, "base_url": fake.base_url, "api_key": KEY}
        with (
            _gateway({"up": provider}, {"provider": "up", "upstream_model": "x"}) as gateway,
            capture_logs() as logs,
        ):
            r = await _ask(gateway, stream=stream)
        assert len(fake.requests) == 1  # a rejection is not retried
        secrets = _secrets(fake.base_url)
    assert r.status_code == 400, r.text
    message = r.json()["error"]["message"]
    assert message.startswith("The upstream provider rejected the request (HTTP 400). The provider said: ")
    assert REASON in message, message
    for secret in secrets:
        assert secret not in r.text, (secret, r.text)
    (call,) = [line for line in logs if line["event"] == "upstream_call"]
    assert REASON in call["upstream_reason"] and REASON in call["error"]
    logged = repr(logs)
    for secret in secrets:
        assert secret not in logged, (secret, logged)


async def test_a_reason_in_a_200_stream_reaches_the_client_scrubbed() -> None:
    async with _served("openai-chat") as fake:
        error = {"code": 400, "message": _hostile_message(fake.base_url), "type": "invalid_request_error"}
        chunk = {"error": error}
        fake.add(ChatReply(chunks=[chunk], done=False))
        provider = {"kind": "openai-chat", "base_url": fake.base_url, "api_key": KEY}
        with _gateway({"up": provider}, {"provider": "up", "upstream_model": "x"}) as gateway:
            r = await _ask(gateway, stream=True)  # failed before its first event: a plain HTTP error
        secrets = _secrets(fake.base_url)
    assert r.status_code == 400 and REASON in r.json()["error"]["message"], r.text
    for secret in secrets:
        assert secret not in r.text, (secret, r.text)


# -- only what a retry can fix is retried, or held against a deployment -------------------------------
IMAGE_REASON = (
    "image input is not supported - hint: if this is unexpected, you may need to provide the mmproj"
)
RETRY = {"attempts": 2, "backoff_base": 0.01}


def _pair(a: FakeUpstream[Any], b: FakeUpstream[Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    providers = {
        name: {"kind": "openai-chat", "base_url": fake.base_url, "retry": RETRY}
        for name, fake in (("a", a), ("b", b))
    }
    model = {
        "deployments": [{"provider": "a", "upstream_model": "x"}, {"provider": "b", "upstream_model": "x"}],
        "routing": {"strategy": "weighted", "affinity": "none", "eject_after": 1, "cooldown_seconds": 300},
    }
    return providers, model


@pytest.mark.parametrize(
    "reason", [IMAGE_REASON, "the model produced output that does not match the expected format"]
)
async def test_a_500_that_names_the_request_is_tried_once_and_ejects_nothing(reason: str) -> None:
    async with FakeOpenAIChat.serve() as a, FakeOpenAIChat.serve() as b:
        for fake in (a, b):
            fake.add(*(_error("openai-chat", fake, 500, reason) for _ in range(2)))
        with _gateway(*_pair(a, b)) as gateway:
            failed = [await _ask(gateway, stream=stream) for stream in (False, True)]
            assert len(a.requests) + len(b.requests) == 2  # one try each: no retry, no other deployment
            a.reset()
            b.reset()
            served = [await _ask(gateway) for _ in range(24)]
    for r in failed:
        assert r.status_code == 502 and r.json()["error"]["code"] == "upstream_error", r.text
        message = r.json()["error"]["message"]
        own = "The upstream provider could not serve this request (HTTP 500)."
        assert message == f"{own} The provider said: {reason}"
    assert all(r.status_code == 200 for r in served)
    assert a.requests and b.requests  # neither deployment was ejected: both still serve


@pytest.mark.parametrize("status", [502, 503])
async def test_a_transient_status_is_still_retried(status: int) -> None:
    async with FakeOpenAIChat.serve() as a, FakeOpenAIChat.serve() as b:
        for fake in (a, b):
            fake.add(_error("openai-chat", fake, status, "invalid upstream state, try again"))
        with _gateway(*_pair(a, b)) as gateway:
            r = await _ask(gateway)
    assert r.status_code == 200, r.text
    assert len(a.requests) + len(b.requests) == 3  # both deployments failed once, then one answered
    assert REASON not in r.text


# -- a connection lost after an unstreamed request went out ------------------------------------------
class Crashing:
    """Reads each request, counts it, writes ``answer`` (maybe nothing) and closes the connection:
    a server that crashed while it generated."""

    def __init__(self, answer: bytes) -> None:
        self.answer = answer
        self.requests = 0

    async def __call__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            await reader.readexactly(content_length(head))
            self.requests += 1
            writer.write(self.answer)
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


_BODY = orjson.dumps({"id": "c", "object": "chat.completion", "choices": []})
# a third of the promised body, then the connection closes
CUT_MID_BODY = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (
    len(_BODY) * 3,
    _BODY,
)
CLOSED_BEFORE_ANSWERING = b""  # nothing: it crashed before its answer's first byte


async def _crash(answer: bytes, *, stream: bool) -> tuple[httpx.Response, int]:
    upstream = Crashing(answer)
    async with serve_raw(upstream) as server:
        url = f"http://127.0.0.1:{server.port}/v1"
        provider = {"kind": "openai-chat", "base_url": url, "retry": RETRY}
        with _gateway({"up": provider}, {"provider": "up", "upstream_model": "x"}) as gateway:
            r = await _ask(gateway, stream=stream)
            await asyncio.sleep(0.05)
    return r, upstream.requests


@pytest.mark.parametrize("answer", [CUT_MID_BODY, CLOSED_BEFORE_ANSWERING], ids=["mid-body", "no-byte"])
async def test_an_unstreamed_call_lost_after_it_went_out_is_not_sent_again(answer: bytes) -> None:
    r, requests = await _crash(answer, stream=False)
    assert requests == 1  # (before: 3, the whole generation sent again, twice)
    assert r.status_code == 502, r.text
    error = r.json()["error"]
    assert error["code"] == "upstream_error" and "the connection was lost" in error["message"]
    assert "127.0.0.1" not in r.text


async def test_a_streamed_call_lost_before_its_answer_is_still_retried() -> None:
    r, requests = await _crash(CLOSED_BEFORE_ANSWERING, stream=True)
    assert requests == 3  # the try and the route's two retries
    assert r.status_code == 502 and "the connection was lost" in r.json()["error"]["message"], r.text
