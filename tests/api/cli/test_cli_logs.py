"""The real CLI process: config validation at start-up, and access logs without message content."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import httpx

from tests.api.helpers import run_cli, serve_cli, wait_until_up
from tests.harness import free_port


def test_bad_config_names_the_field(tmp_path: Path) -> None:
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(
        "providers:\n  up: {kind: openai-chat, timeouts: {connect: -1}}\nmodels:\n  m: {provider: nowhere}\n"
    )
    out = run_cli("check-config", "--config", str(cfg))
    assert out.returncode == 2
    assert "providers.up.timeouts.connect" in out.stderr
    cfg.write_text("models:\n  m: {provider: nowhere}\n")
    out = run_cli("check-config", "--config", str(cfg))
    assert out.returncode == 2 and "unknown provider 'nowhere'" in out.stderr
    out = run_cli("check-config", env={"GATEWAY_LIMITS__MAX_BODY_BYTES": "lots"})
    assert out.returncode == 2 and "limits.max_body_bytes" in out.stderr
    good = tmp_path / "good.yaml"
    good.write_text(
        "auth:\n  api_keys:\n    - {key: sk-team-a, tenant: team-a}\n"
        "providers:\n  local: {kind: openai-chat, base_url: 'http://127.0.0.1:9/v1'}\n"
        "models:\n  my-model: {provider: local, upstream_model: Qwen/Qwen3-8B}\n"
    )
    assert run_cli("check-config", "--config", str(good)).returncode == 0


def test_serve_logs_one_line_per_request_without_content(tmp_path: Path) -> None:
    port = free_port()
    secret = "very-private-words-0917"
    proc = serve_cli(port, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    try:
        wait_until_up(proc, port)
        for stream in (False, True):
            r = httpx.post(
                f"http://127.0.0.1:{port}/v1/responses",
                timeout=10,
                json={"model": "mock", "input": secret, "stream": stream, "store": False},
                headers={"x-request-id": f"req-test-{stream}"},
            )
            assert r.status_code == 200
        httpx.post(f"http://127.0.0.1:{port}/v1/responses", json={"model": "nope", "input": secret})
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=20)
    assert secret not in err
    lines = [json.loads(ln) for ln in err.splitlines() if ln.startswith("{")]
    requests = [ln for ln in lines if ln.get("event") == "request"]
    assert len(requests) == 3
    ok = next(ln for ln in requests if ln["request_id"] == "req-test-True")
    for field in ("tenant", "model", "provider", "status", "latency_ms", "input_tokens", "output_tokens"):
        assert field in ok
    assert ok["status"] == "completed" and ok["model"] == "mock"
    assert any(ln["status"] == 400 and ln["error_code"] == "model_not_found" for ln in requests)
