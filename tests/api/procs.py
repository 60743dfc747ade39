"""The real ``serve`` process for the workers and reload tests: a YAML config the test rewrites, the
JSON log on stderr read back line by line, and async clients for HTTP, SSE and WebSocket."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import orjson
import yaml
from websockets.asyncio.client import ClientConnection, connect

from tests.api.helpers import cli_env, parse_sse, serve_cli
from tests.fakes.openai_chat import Reply
from tests.harness import free_port

ADMIN = {"Authorization": "Bearer sk-admin"}
TERMINAL = frozenset({"response.completed", "response.failed", "response.incomplete", "error"})


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


class Gateway:
    """``python -m gateway serve --config <config> [ARGS]`` on a free loopback port, logging at info
    to a file (a pipe nobody reads could fill and stall the workers)."""

    def __init__(self, tmp: Path, config: dict[str, Any], *args: str, **env: str) -> None:
        self.config_path = tmp / "gateway.yaml"
        self.write(config)
        self.log_path = tmp / "gateway.log"
        self.port = free_port()
        self._log = self.log_path.open("wb")
        self.proc = serve_cli(
            self.port,
            "--config",
            str(self.config_path),
            "--log-level",
            "info",
            *args,
            env=cli_env(**env),
            stdout=subprocess.DEVNULL,
            stderr=self._log,
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def write(self, config: dict[str, Any]) -> None:
        self.config_path.write_text(yaml.safe_dump(config))

    def logs(self) -> list[dict[str, Any]]:
        lines = self.log_path.read_text(errors="replace").splitlines()
        return [json.loads(ln) for ln in lines if ln.startswith("{") and ln.endswith("}")]

    def events(self, name: str) -> list[dict[str, Any]]:
        return events(self.logs(), name)

    async def wait_log(self, check: Callable[[list[dict[str, Any]]], bool], seconds: float = 60) -> None:
        deadline = time.monotonic() + seconds
        while not check(self.logs()):
            assert self.proc.poll() is None, f"the gateway exited:\n{self.tail()}"
            assert time.monotonic() < deadline, f"the log never showed it:\n{self.tail()}"
            await asyncio.sleep(0.1)

    async def started(self, workers: int = 1) -> None:
        """Until every worker has started (a ``gateway_started`` line per process)."""
        await self.wait_log(
            lambda logs: sum(e.get("event") == "gateway_started" for e in logs) >= workers, 120
        )

    def tail(self, lines: int = 30) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    async def stop(self, sig: int = signal.SIGTERM, seconds: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return await asyncio.to_thread(self.proc.wait, seconds)
        finally:
            self.close()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._log.close()


def events(logs: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [e for e in logs if e.get("event") == name]


def request_pids(logs: list[dict[str, Any]], transport: str | None = None) -> set[int]:
    return {
        e["pid"]
        for e in logs
        if e.get("event") == "request" and (transport is None or e.get("transport") == transport)
    }


def body(model: str, text: str = "hi", **extra: Any) -> dict[str, Any]:
    return {"model": model, "input": text, "store": False, **extra}


async def post_json(gw: Gateway, key: str, model: str = "mock", text: str = "hi") -> httpx.Response:
    """One request on a connection of its own (each one is handed to whichever worker accepts it)."""
    async with httpx.AsyncClient(base_url=gw.url, timeout=30) as client:
        return await client.post("/v1/responses", json=body(model, text), headers=bearer(key))


async def post_sse(gw: Gateway, key: str, model: str = "mock", text: str = "hi") -> list[tuple[str, str]]:
    async with httpx.AsyncClient(base_url=gw.url, timeout=60) as client:
        r = await client.post("/v1/responses", json=body(model, text, stream=True), headers=bearer(key))
        assert r.status_code == 200, r.text
        return parse_sse(r.content)


async def reload(gw: Gateway, headers: dict[str, str] | None = None) -> httpx.Response:
    async with httpx.AsyncClient(base_url=gw.url, timeout=30) as client:
        return await client.post("/admin/reload", headers=ADMIN if headers is None else headers)


def ws(gw: Gateway, key: str) -> Any:
    return connect(
        f"ws://127.0.0.1:{gw.port}/v1/responses",
        additional_headers=bearer(key),
        proxy=None,
        open_timeout=10,
        close_timeout=5,
    )


def create(model: str, text: str = "hi") -> str:
    return orjson.dumps({"type": "response.create", "model": model, "input": text, "store": False}).decode()


async def read_turn(sock: ClientConnection, wait: float = 30) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    while True:
        event = orjson.loads(await asyncio.wait_for(sock.recv(), wait))
        events.append(event)
        if event["type"] in TERMINAL:
            return events


async def ws_turn(sock: ClientConnection, model: str, text: str = "hi") -> list[dict[str, Any]]:
    await sock.send(create(model, text))
    return await read_turn(sock)


def completed_text(events: list[dict[str, Any]]) -> str:
    """The text of a turn that completed (fails on any other ending)."""
    assert events[-1]["type"] == "response.completed", events[-3:]
    return "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")


def sse_completed(frames: list[tuple[str, str]]) -> str:
    events = [orjson.loads(data) for name, data in frames if name]
    assert frames[-1] == ("", "[DONE]"), frames[-2:]
    return completed_text(events)


@contextlib.asynccontextmanager
async def running(tmp: Path, config: dict[str, Any], *args: str, workers: int = 1, **env: str) -> Any:
    """A started gateway, stopped (and killed if need be) at the end."""
    gw = Gateway(tmp, config, *args, **env)
    try:
        await gw.started(workers)
        yield gw
    finally:
        await gw.stop()


SLOW_TEXT = "one two three four five six seven eight"


def slow_reply() -> Reply:
    """About 3 s of stream: 12 writes, a quarter of a second apart."""
    return Reply.text(SLOW_TEXT, pieces=8, chunk_delay=0.25, split=None, comments=False)
