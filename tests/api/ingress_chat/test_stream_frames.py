"""gateway/api/chat/encode.py: the content chunks a Chat Completions stream writes without building
their dicts are byte for byte what orjson makes of the chunks ``feed`` returns."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from gateway.api.chat.encode import ChatChunks

TEXTS = ["tok ", "", 'quote " and \\ backslash', "line\nbreak\ttab", "é 日本 🙂", "\x00\x1f"]
CREATED = {
    "type": "response.created",
    "response": {"id": "resp_abc", "created_at": 1764633600, "model": "m", "service_tier": "default"},
}


def frames_of(chunks: list[dict[str, Any]]) -> bytes:
    return b"".join(b"data: " + orjson.dumps(c) + b"\n\n" for c in chunks)


@pytest.mark.parametrize("include_usage", [False, True])
@pytest.mark.parametrize("text", TEXTS)
def test_a_content_chunk_is_the_chunk_feed_makes(text: str, include_usage: bool) -> None:
    fast, slow = ChatChunks(include_usage=include_usage), ChatChunks(include_usage=include_usage)
    assert fast.frames(CREATED) == frames_of(slow.feed(CREATED))
    event = {"type": "response.output_text.delta", "delta": text, "item_id": "msg_1", "output_index": 0}
    framed = fast.frames(event)
    assert framed == frames_of(slow.feed(event))
    chunk = orjson.loads(framed.removeprefix(b"data: "))
    assert chunk["choices"] == [
        {"index": 0, "delta": {"content": text}, "finish_reason": None, "logprobs": None}
    ]
    assert ("usage" in chunk) is include_usage


def test_a_delta_with_log_probabilities_goes_through_feed() -> None:
    fast, slow = ChatChunks(), ChatChunks()
    fast.frames(CREATED)
    slow.feed(CREATED)
    logprobs = [{"token": "tok", "logprob": -0.1, "bytes": [116, 111, 107], "top_logprobs": []}]
    event = {"type": "response.output_text.delta", "delta": "tok", "logprobs": logprobs}
    framed = fast.frames(event)
    assert framed == frames_of(slow.feed(event))
    assert orjson.loads(framed.removeprefix(b"data: "))["choices"][0]["logprobs"]["content"] == logprobs
