"""``python -m tests.fakes.all``: every fake in one process and a gateway config routing a model
through each adapter (how the official suite and client SDKs are run against every adapter)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx
import yaml

from tests.harness import serve_gateway

ROOT = Path(__file__).resolve().parents[2]


def test_every_adapter_answers_through_the_standalone_fakes(tmp_path: Path) -> None:
    config = tmp_path / "fakes.yaml"
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.fakes.all", "--config", str(config)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while not config.exists() or not config.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, "the fakes did not start"
            time.sleep(0.05)
        settings = yaml.safe_load(config.read_text())
        assert set(settings["models"]) == {
            "via-openai-chat",
            "via-openai-responses",
            "via-anthropic",
            "via-gemini",
            "mock",
        }
        with serve_gateway(settings) as gw:
            with httpx.Client(base_url=gw.base_url, timeout=20) as c:
                for model in settings["models"]:
                    for stream in (False, True):
                        body = {"model": model, "input": "ping", "stream": stream}
                        r = c.post("/v1/responses", json=body)
                        assert r.status_code == 200, (model, r.text)
                        assert "ping" in r.text, (model, stream)
    finally:
        proc.terminate()
        proc.wait(10)
