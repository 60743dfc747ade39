"""What the app-level tests share: a strict SSE frame reader, and the real CLI as a process."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[2]


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


def serve_cli(port: int, **popen: Any) -> subprocess.Popen[Any]:
    """``python -m gateway serve --port PORT`` from the repository root (``popen``: env, pipes)."""
    return subprocess.Popen(
        [sys.executable, "-m", "gateway", "serve", "--port", str(port)], cwd=ROOT, **popen
    )


def wait_until_up(proc: subprocess.Popen[Any], port: int, seconds: float = 120) -> None:
    """Until ``GET /healthz`` on ``port`` answers; fails when ``proc`` exits or time runs out first."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1)
            return
        except httpx.HTTPError:
            assert proc.poll() is None, "the gateway process exited"
            assert time.monotonic() < deadline, "the gateway did not start in time"
            time.sleep(0.1)
