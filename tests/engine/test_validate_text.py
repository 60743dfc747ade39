"""Request validation walks only free-form JSON: a message whose content is a plain string is not
walked character by character (it cost a few hundred µs per KB of replayed history on every turn)."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace

from gateway.engine.validate import _check_parts_depth, create_request
from gateway.kernel.settings import Limits


class Unwalkable(str):
    def __iter__(self) -> Iterator[str]:
        raise AssertionError("a message's text was walked character by character")


def test_plain_text_content_is_not_walked() -> None:
    _check_parts_depth([SimpleNamespace(content=Unwalkable("x" * 1000))], 64)


def test_a_long_text_history_validates() -> None:
    history = [{"type": "message", "role": "user", "content": "word " * 200} for _ in range(40)]
    body = create_request({"model": "m", "input": history}, Limits())
    assert len(body.input) == 40  # type: ignore[arg-type]
