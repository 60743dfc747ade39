"""``python -m tests.fakes.all``: every fake in one process and a gateway config routing a model
through each adapter (how the official suite and client SDKs are run against every adapter)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import openai
import yaml

from tests.harness import serve_gateway

ROOT = Path(__file__).resolve().parents[2]


@contextmanager
def standalone_fakes(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """``python -m tests.fakes.all`` running; the gateway settings it wrote."""
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
        yield yaml.safe_load(config.read_text())
    finally:
        proc.terminate()
        proc.wait(10)


def test_every_adapter_answers_through_the_standalone_fakes(tmp_path: Path) -> None:
    with standalone_fakes(tmp_path) as settings:
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


def test_background_through_every_adapter(tmp_path: Path) -> None:
    """``background: true`` on each adapter's route (and ``mock``), through the openai SDK: created
    at once, polled to ``completed`` with the fake's answer, its stream replayed from a point."""
    with standalone_fakes(tmp_path) as settings:
        with serve_gateway(settings) as gw:
            client = openai.OpenAI(base_url=gw.base_url + "/v1", api_key="sk-none", max_retries=0)
            for model in settings["models"]:
                res = client.responses.create(model=model, input="ping", background=True)
                assert res.status in ("queued", "in_progress") and res.background, model
                until = time.monotonic() + 20
                while res.status in ("queued", "in_progress"):
                    assert time.monotonic() < until, model
                    time.sleep(0.05)
                    res = client.responses.retrieve(res.id)
                assert res.status == "completed" and "ping" in res.output_text, model
                events = list(client.responses.retrieve(res.id, stream=True, starting_after=1))
                assert events[0].sequence_number == 2, model
                assert events[-1].type == "response.completed", model
