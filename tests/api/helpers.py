"""What the app-level tests share."""

from __future__ import annotations


def parse_sse(raw: bytes) -> list[tuple[str, str]]:
    """(event name, data) per frame, strictly: LF endings, one data line per event."""
    assert b"\r" not in raw
    frames = []
    for block in raw.decode().split("\n\n"):
        if not block:
            continue
        lines = block.split("\n")
        event = next((ln[7:] for ln in lines if ln.startswith("event: ")), "")
        data = [ln[6:] for ln in lines if ln.startswith("data: ")]
        assert len(data) == 1, block
        frames.append((event, data[0]))
    return frames
