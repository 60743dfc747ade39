"""Logs an operator can parse and correlate: every line of ``python -m gateway serve`` (a real
process) is one JSON object — the stdlib lines of the Redis store and of uvicorn and start-up
failures too; a failing upstream's lines carry the request id and the upstream's own id; 5xx and
failed outcomes are warnings; reads and deletes of stored responses are audited."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import yaml
from structlog.testing import capture_logs

from tests.api.helpers import ROOT, serve_cli, wait_until_up
from tests.fakes.openai_chat import FakeOpenAIChat, Reply
from tests.fakes.server import unused_port
from tests.harness import free_port, serve_gateway


def json_lines(*outputs: str) -> list[dict[str, Any]]:
    """Every line of ``outputs``, each of which must be one JSON object."""
    lines = []
    for out in outputs:
        for raw in out.splitlines():
            line = json.loads(raw)
            assert isinstance(line, dict), raw
            lines.append(line)
    return lines


def run_serve(port: int, env: dict[str, str], act: Any = None) -> tuple[int, list[dict[str, Any]]]:
    """Serve on ``port`` with ``env``; ``act()`` once it is up (None: it must fail to start).
    Returns the exit code and the lines of stdout and stderr."""
    proc = serve_cli(port, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        if act is not None:
            wait_until_up(proc, port)
            act()
    finally:
        if act is not None:
            proc.terminate()
        out, err = proc.communicate(timeout=30)
    return proc.returncode, json_lines(out, err)


def base_env(**extra: str) -> dict[str, str]:
    return {**os.environ, "GATEWAY_AUTO_PROVIDERS": "false", **extra}


def test_stdlib_and_uvicorn_lines_are_json_and_5xx_is_a_warning() -> None:
    port = free_port()
    env = base_env(
        GATEWAY_STATE__REDIS_URL=f"redis://127.0.0.1:{unused_port()}/0", GATEWAY_STATE__TIMEOUT_SECONDS="1"
    )

    def act() -> None:
        url = f"http://127.0.0.1:{port}/v1/responses"
        ok = httpx.post(url, json={"model": "mock", "input": "hi", "store": False}, timeout=10)
        assert ok.status_code == 200
        down = httpx.post(
            url, json={"model": "mock", "input": "hi", "previous_response_id": "resp_1"}, timeout=10
        )
        assert down.status_code == 503
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.sendall(b"NOT HTTP AT ALL\r\n\r\n")
            sock.recv(1024)

    _, lines = run_serve(port, env, act)
    store = [ln for ln in lines if ln.get("logger") == "state.redis_client"]
    assert store and store[0]["event"] == "state store error: ConnectionError"
    assert store[0]["level"] == "warning" and "timestamp" in store[0]
    assert any(ln.get("logger") == "uvicorn.error" and ln["level"] == "warning" for ln in lines)
    levels = {ln["status"]: ln["level"] for ln in lines if ln["event"] == "request"}
    assert levels == {"completed": "info", 503: "warning"}


def test_start_up_failures_are_json(tmp_path: Path) -> None:
    port = free_port()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port))
        taken.listen()
        code, lines = run_serve(port, base_env())
    assert code != 0
    assert any(
        ln.get("logger") == "uvicorn.error"
        and ln["level"] == "error"
        and "address already in use" in ln["event"]
        for ln in lines
    )
    # a config the validator refuses: one JSON line naming the field, exit 2, no traceback
    code, lines = run_serve(free_port(), base_env(GATEWAY_STATE__REDIS_URL="nosuchscheme://x"))
    assert code == 2
    invalid = [ln for ln in lines if ln["event"] == "config_invalid"]
    assert len(invalid) == 1 and "state.redis_url" in invalid[0]["detail"]
    assert not any("Traceback" in str(ln) for ln in lines)


def test_warnings_uncaught_exceptions_and_config_errors_are_json() -> None:
    """What configure_logging installs, in a real process: ``warnings``, an uncaught exception (in
    the main thread and another), and the ``config_invalid`` line cli.py writes for serve."""
    script = (
        "import threading, warnings\n"
        "from gateway.logs import configure_logging, log_config_error\n"
        "log_config_error('invalid configuration:\\n  limits.max_body_bytes: bad')\n"
        "configure_logging('debug')\n"
        "warnings.warn('careful now')\n"
        "t = threading.Thread(target=lambda: 1 / 0); t.start(); t.join()\n"
        "raise RuntimeError('boom at start')\n"
    )
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    lines = json_lines(out.stdout, out.stderr)
    config = lines[0]
    assert config["event"] == "config_invalid" and config["level"] == "error"
    assert "limits.max_body_bytes" in config["detail"]
    assert any(ln.get("logger") == "py.warnings" and "careful now" in ln["event"] for ln in lines)
    crashes = [ln for ln in lines if ln["event"] == "uncaught_exception"]
    assert [c["level"] for c in crashes] == ["critical", "critical"]
    assert "ZeroDivisionError" in crashes[0]["exception"]
    assert "RuntimeError: boom at start" in crashes[1]["exception"]


async def test_a_failing_upstream_is_correlated_both_ways(tmp_path: Path) -> None:
    secret = "sk-upstream-secret-5150"
    async with FakeOpenAIChat.serve() as fake:
        retry = {"attempts": 1, "backoff_base": 0.01, "backoff_max": 0.02}
        config = {
            "auto_providers": False,
            "providers": {
                "up": {"kind": "openai-chat", "base_url": fake.base_url, "api_key": secret, "retry": retry}
            },
            "models": {
                "m": {"provider": "up", "upstream_model": "fake-llm", "fallbacks": ["spare"]},
                "spare": {"provider": "mock", "upstream_model": "mock"},
                "solo": {"provider": "up", "upstream_model": "fake-llm"},
            },
        }
        path = tmp_path / "gw.yaml"
        path.write_text(yaml.safe_dump(config))
        port = free_port()
        proc = serve_cli(
            port,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=base_env(GATEWAY_CONFIG=str(path)),
        )
        try:
            wait_until_up(proc, port)
            up_id = {"x-request-id": "up-req.1"}
            fake.add(Reply.error(500, headers=up_id), Reply.error(500, headers=up_id))
            fake.add(*[Reply.error(503, headers={"x-request-id": "not an id!"})] * 2)
            fake.add(Reply.text("Hello there my friend", pieces=4, disconnect_after=3))
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=20) as client:
                for rid, model, status, stream in (
                    ("req-corr-1", "m", 200, False),
                    ("req-corr-2", "solo", 502, False),
                    ("req-corr-3", "solo", 200, True),
                ):
                    r = await client.post(
                        "/v1/responses",
                        json={"model": model, "input": "hi", "stream": stream},
                        headers={"x-request-id": rid},
                    )
                    assert r.status_code == status, r.text
        finally:
            proc.terminate()
            out, err = proc.communicate(timeout=30)
    sent = [r.headers.get("x-request-id") for r in fake.requests]
    assert sent == ["req-corr-1", "req-corr-1", "req-corr-2", "req-corr-2", "req-corr-3"]
    for leak in (secret, "not an id!", fake.base_url):
        assert leak not in out + err
    lines = json_lines(out, err)

    def of(event: str, rid: str) -> list[dict[str, Any]]:
        return [ln for ln in lines if ln["event"] == event and ln.get("request_id") == rid]

    assert [ln["attempt"] for ln in of("upstream_failed", "req-corr-1")] == [1, 2]
    assert len(of("route_exhausted", "req-corr-1")) == 1 and len(of("route_exhausted", "req-corr-2")) == 1
    assert of("fallback_used", "req-corr-1")[0]["fallback"] == "spare"
    calls = of("upstream_call", "req-corr-1")
    assert [(c["status"], c["upstream_request_id"], c["kind"]) for c in calls] == [
        (500, "up-req.1", "openai-chat")
    ] * 2
    assert [(c["status"], c["upstream_request_id"]) for c in of("upstream_call", "req-corr-2")] == [
        (503, None)
    ] * 2
    (mid_stream,) = of("upstream_call", "req-corr-3")
    assert mid_stream["status"] == 200 and mid_stream["error_code"] is not None
    access = {ln["request_id"]: (ln["status"], ln["level"]) for ln in lines if ln["event"] == "request"}
    assert access == {
        "req-corr-1": ("completed", "info"),
        "req-corr-2": (502, "warning"),
        "req-corr-3": ("failed", "warning"),
    }


async def test_reads_and_deletes_of_stored_responses_are_audited() -> None:
    b_digest = hashlib.sha256(b"sk-bee").hexdigest()
    auth = {"api_keys": [{"key": "sk-ay", "tenant": "a"}, {"sha256": b_digest, "tenant": "b"}]}
    a = {"Authorization": "Bearer sk-ay"}
    b = {"Authorization": "Bearer sk-bee"}
    with serve_gateway({"auth": auth}) as served:
        async with httpx.AsyncClient(base_url=served.base_url, timeout=20) as c:
            rid = (await c.post("/v1/responses", json={"model": "mock", "input": "hi"}, headers=a)).json()[
                "id"
            ]
            with capture_logs() as logs:
                assert (await c.get(f"/v1/responses/{rid}", headers=a)).status_code == 200
                assert (await c.get(f"/v1/responses/{rid}", headers=b)).status_code == 404
                assert (await c.get(f"/v1/responses/{rid}/input_items", headers=a)).status_code == 200
                assert (await c.delete(f"/v1/responses/{rid}", headers=b)).status_code == 404
                r = await c.delete(f"/v1/responses/{rid}", headers={**a, "x-request-id": "req-audit-1"})
                assert r.status_code == 200
                assert (await c.get(f"/v1/responses/{rid}/input_items", headers=a)).status_code == 404
                assert (
                    await c.get(f"/v1/responses/{rid}", headers={"Authorization": "Bearer nope"})
                ).status_code == 401
    audit = [ln for ln in logs if ln["event"] == "stored_response"]
    key_a = "sha256:" + hashlib.sha256(b"sk-ay").hexdigest()[:12]
    key_b = "sha256:" + b_digest[:12]
    assert [(ln["action"], ln["tenant"], ln["key_name"], ln["result"]) for ln in audit] == [
        ("get", "a", key_a, "found"),
        ("get", "b", key_b, "not_found"),
        ("list_input_items", "a", key_a, "found"),
        ("delete", "b", key_b, "not_found"),
        ("delete", "a", key_a, "deleted"),
        ("list_input_items", "a", key_a, "not_found"),
    ]
    assert all(ln["response_id"] == rid and ln["log_level"] == "info" for ln in audit)
    assert audit[4]["request_id"] == "req-audit-1"
    assert "sk-ay" not in repr(logs) and "sk-bee" not in repr(logs)
