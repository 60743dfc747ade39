"""gateway/api/messages/encode.py: the text deltas a Messages stream writes without building their
dicts are byte for byte what orjson makes of the ``content_block_delta`` events ``feed`` returns."""

from __future__ import annotations

import orjson
import pytest

from gateway.api.messages.encode import MessageStream, sse


class _Finished:
    stop_sequence: str | None = None
    cache_write_tokens = 0


@pytest.mark.parametrize(
    "text", ["tok ", "", 'quote " and \\ backslash', "line\nbreak\ttab", "é 日本 🙂", "\x00\x1f"]
)
def test_a_text_delta_frame_is_the_event_feed_makes(text: str) -> None:
    fast, slow = MessageStream(_Finished()), MessageStream(_Finished())
    for stream in (fast, slow):
        stream._start({"type": "text", "text": ""})
        stream._start({"type": "text", "text": ""})  # index 1: a figure of more than one digit's worth
    event = {"type": "response.output_text.delta", "delta": text, "item_id": "msg_1", "output_index": 0}
    framed = fast.frames(event)
    assert framed == b"".join(sse(e) for e in slow.feed(event))
    head, data = framed.decode().split("\n", 1)
    assert head == "event: content_block_delta" and framed.endswith(b"\n\n")
    assert orjson.loads(data.removeprefix("data: ")) == {
        "type": "content_block_delta",
        "index": 1,
        "delta": {"type": "text_delta", "text": text},
    }
