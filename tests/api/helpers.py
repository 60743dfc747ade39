"""What the app-level tests share: a strict SSE frame reader, and the real CLI as a process."""

from __future__ import annotations

import os
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


# variables that change what the gateway serves: none of them leaks in from the test runner's environment
PROVIDER_KEY_VARS = ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "GEMINI_API_KEY")


def cli_env(**extra: str) -> dict[str, str]:
    """This environment without GATEWAY_* and provider key variables, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_") and k not in PROVIDER_KEY_VARS}
    return {**env, **extra}


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m gateway ARGS`` to its end (``env``: added to this environment)."""
    return subprocess.run(
        [sys.executable, "-m", "gateway", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )


def serve_cli(port: int, *args: str, **popen: Any) -> subprocess.Popen[Any]:
    """``python -m gateway serve --port PORT ARGS`` from the repository root (``popen``: env, pipes)."""
    return subprocess.Popen(
        [sys.executable, "-m", "gateway", "serve", "--port", str(port), *args], cwd=ROOT, **popen
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
