"""The real CLI process: one validation for ``check-config`` and ``serve``, every message naming its
field, no traceback; the refusal to serve without keys beyond loopback; the start-up line; --help."""

from __future__ import annotations

import base64
import hashlib
import json
import re
import subprocess
from pathlib import Path

import httpx
import pytest

import gateway
from tests.api.helpers import cli_env, run_cli, serve_cli, wait_until_up
from tests.harness import free_port

LOCAL = "{kind: openai-chat, base_url: 'http://127.0.0.1:9/v1', api_key: sk-x}"
KEY, SHORT = base64.b64encode(bytes(32)).decode(), base64.b64encode(b"short").decode()

# (config, the field path the error must name, what it must say)
BAD_CONFIGS = [
    ("compaction: {keys: ['not base64!']}\n", "compaction.keys.0", "not valid base64"),
    (
        f"compaction: {{keys: ['{KEY}', '{SHORT}']}}\n",
        "compaction.keys.1",
        "16, 24 or 32 bytes",
    ),
    ("state: {redis_url: 'http://127.0.0.1:6379/0'}\n", "state.redis_url", "redis://"),
    ("state: {redis_url: 'redis://127.0.0.1:port/0'}\n", "state.redis_url", "port"),
    (
        "providers:\n  up: {kind: openai-chat, base_url: 'vllm.internal:8000/v1'}\n",
        "providers.up.base_url",
        "http://",
    ),
    (
        "providers:\n  up: {kind: openai-chat, proxy: 'proxy.internal:3128'}\n",
        "providers.up.proxy",
        "http://",
    ),
    (
        "providers:\n  up: {kind: openai-chat, proxy: 'https://proxy.internal:3128'}\n",
        "providers.up.proxy",
        "an https:// proxy is not supported",
    ),
    (
        "providers:\n  up: {kind: openai-chat, base_url: 'http://vllm.internal:8000/v1 '}\n",
        "providers.up.base_url",
        "a character a URL cannot",
    ),
    (
        "providers:\n  up: {kind: gemini, base_url: 'https://g.example/v1beta#frag'}\n",
        "providers.up.base_url",
        "fragment",
    ),
    (
        "providers:\n  up: {kind: openai-chat, base_url: 'https://user:SECRET-PW@h.example/v1'}\n",
        "providers.up.base_url",
        "credentials",
    ),
    (
        'providers:\n  up: {kind: openai-chat, api_key: "sk-SECRET-KEY\\r\\nx-evil: 1"}\n',
        "providers.up.api_key",
        "a control or a non-ASCII character",
    ),
    (
        "providers:\n  up: {kind: openai-chat, headers: {Host: attacker.example}}\n",
        "providers.up.headers.Host",
        "writes this header itself",
    ),
    (
        "providers:\n  up: {kind: openai-chat, headers: {transfer-encoding: chunked}}\n",
        "providers.up.headers.transfer-encoding",
        "writes this header itself",
    ),
    (
        "providers:\n  up: {kind: openai-chat, headers: {'x-team key': a}}\n",
        "providers.up.headers",
        "not a header name",
    ),
    (
        'providers:\n  up: {kind: openai-chat, headers: {x-auth: "SECRET-VALUE\\x7f"}}\n',
        "providers.up.headers.x-auth",
        "the value holds a control",
    ),
    (
        "auth:\n  api_keys:\n    - {key: sk-shared, tenant: a}\n"
        f"    - {{sha256: {hashlib.sha256(b'sk-shared').hexdigest()}, tenant: b}}\n",
        "auth.api_keys.1",
        "the same key as auth.api_keys.0 (tenant 'a')",
    ),
    (
        "auth:\n  api_keys:\n    - {key: sk-a, tenant: a}\n    - {key: sk-a, tenant: b}\n",
        "auth.api_keys.1",
        "the same key",
    ),
    ("auth:\n  api_keys:\n    - {sha256: " + "zz" * 32 + ", tenant: a}\n", "auth.api_keys.0.sha256", "hex"),
    (
        f"auth:\n  api_keys:\n    - {{key: sk-a, tenant: a, models: [m, gpt-typo]}}\n"
        f"providers:\n  local: {LOCAL}\nmodels:\n  m: {{provider: local}}\n",
        "auth.api_keys.0.models.1",
        "unknown model 'gpt-typo'",
    ),
    (
        f"providers:\n  local: {LOCAL}\nmodels:\n  m: {{provider: local, fallbacks: [local/other, ghost]}}\n",
        "models.m.fallbacks.1",
        "unknown model 'ghost'",
    ),
    (
        "auth: {anonymous: true, api_keys: [{key: sk-a, tenant: a}]}\n",
        "auth.anonymous",
        "contradicts api_keys",
    ),
]


def refusal_text(stderr: str) -> str:
    """What the refusal says: check-config prints it; serve writes it as one JSON line
    (``config_invalid``), since every line a server writes is JSON."""
    lines = stderr.strip().splitlines()
    if len(lines) == 1 and lines[0].startswith("{"):
        entry = json.loads(lines[0])
        assert entry["event"] == "config_invalid" and entry["level"] == "error", entry
        return str(entry["detail"])
    return stderr


def assert_refused(out: subprocess.CompletedProcess[str], field: str, says: str) -> None:
    assert out.returncode == 2, out.stderr
    text = refusal_text(out.stderr)
    assert "Traceback" not in text and "(top level)" not in text, out.stderr
    line = next((ln for ln in text.splitlines() if ln.strip().startswith(f"{field}: ")), None)
    assert line is not None, out.stderr
    assert says in line, out.stderr
    assert "configuration ok" not in out.stdout


@pytest.mark.parametrize(("config", "field", "says"), BAD_CONFIGS)
def test_check_config_refuses_what_serve_cannot_run(
    tmp_path: Path, config: str, field: str, says: str
) -> None:
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(config)
    assert_refused(run_cli("check-config", "--config", str(cfg), env=cli_env()), field, says)


@pytest.mark.parametrize(("config", "field", "says"), [BAD_CONFIGS[0], BAD_CONFIGS[2], BAD_CONFIGS[6]])
def test_serve_refuses_them_too_with_the_same_message(
    tmp_path: Path, config: str, field: str, says: str
) -> None:
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(config)
    out = run_cli("serve", "--config", str(cfg), "--port", str(free_port()), env=cli_env())
    assert_refused(out, field, says)


def test_a_refused_secret_is_never_echoed(tmp_path: Path) -> None:
    cfg = tmp_path / "bad.yaml"
    for config, field, says in BAD_CONFIGS:
        if "SECRET" in config:
            cfg.write_text(config)
            out = run_cli("check-config", "--config", str(cfg), env=cli_env())
            assert_refused(out, field, says)
            assert "SECRET" not in out.stderr + out.stdout


def test_a_key_variable_a_header_cannot_carry_is_refused(tmp_path: Path) -> None:
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("providers:\n  up: {kind: openai-chat, api_key_env: ORGW_TEST_KEY}\n")
    out = run_cli("check-config", "--config", str(cfg), env=cli_env(ORGW_TEST_KEY="sk-SECRET\n"))
    assert_refused(out, "providers.up.api_key_env", "the variable ORGW_TEST_KEY (provider up)")
    assert "SECRET" not in out.stderr
    auto = run_cli("check-config", env=cli_env(OPENAI_API_KEY="sk-SECRET \t"))
    assert_refused(auto, "auto_providers", "the variable OPENAI_API_KEY (provider openai)")
    assert "SECRET" not in auto.stderr


def test_every_problem_is_listed_at_once(tmp_path: Path) -> None:
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(
        "auth:\n  api_keys:\n    - {key: sk-a, tenant: a, models: [nope]}\n    - {key: sk-a, tenant: b}\n"
        f"providers:\n  local: {LOCAL}\n"
        "models:\n  m: {provider: local, fallbacks: [ghost]}\n  n: {provider: nowhere}\n"
    )
    out = run_cli("check-config", "--config", str(cfg), env=cli_env())
    for field in ("auth.api_keys.0.models.0", "auth.api_keys.1", "models.m.fallbacks.0", "models.n.provider"):
        assert_refused(out, field, "")


def test_an_unset_key_variable_is_a_warning_in_both_commands(tmp_path: Path) -> None:
    cfg = tmp_path / "warn.yaml"
    cfg.write_text(
        "providers:\n  up: {kind: openai-chat, base_url: 'http://127.0.0.1:9/v1',"
        " api_key_env: ORGW_TEST_UNSET}\n"
        "models:\n  m: {provider: up}\n"
    )
    out = run_cli("check-config", "--config", str(cfg), env=cli_env())
    assert out.returncode == 0 and out.stdout.strip() == "configuration ok", out.stderr
    assert "warning: providers.up.api_key_env: the variable ORGW_TEST_UNSET is not set" in out.stderr
    assert run_cli("check-config", "--config", str(cfg), env=cli_env(ORGW_TEST_UNSET="sk")).stderr == ""
    port = free_port()
    proc = serve_cli(port, "--config", str(cfg), env=cli_env(), stderr=subprocess.PIPE, text=True)
    try:
        wait_until_up(proc, port)
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=20)
    lines = [json.loads(ln) for ln in err.splitlines() if ln.startswith("{")]
    warning = next(ln for ln in lines if ln.get("event") == "config_warning")
    assert warning["field"] == "providers.up.api_key_env" and warning["level"] == "warning"
    assert "ORGW_TEST_UNSET" in warning["detail"]


# -- beyond loopback -----------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["serve", "check-config"])
def test_no_auth_on_a_shared_address_refuses_to_start(command: str) -> None:
    args = [command, "--host", "0.0.0.0"] + (["--port", str(free_port())] if command == "serve" else [])
    out = run_cli(*args, env=cli_env())
    assert out.returncode == 2 and "Traceback" not in out.stderr
    message = out.stderr.strip()
    assert len(message.splitlines()) == 1, message
    assert "0.0.0.0" in message and "auth.api_keys" in message and "auth.anonymous: true" in message
    # keys, or loopback, or anonymous on purpose, and it starts
    ok = {"GATEWAY_AUTH__API_KEYS": '[{"key": "sk-a", "tenant": "a"}]'}
    assert run_cli("check-config", "--host", "0.0.0.0", env=cli_env(**ok)).returncode == 0
    assert run_cli("check-config", "--host", "::1", env=cli_env()).returncode == 0
    assert run_cli("check-config", "--host", "localhost", env=cli_env()).returncode == 0


def test_anonymous_on_a_shared_address_warns_and_keeps_environment_keys_off() -> None:
    port = free_port()
    env = cli_env(GATEWAY_AUTH__ANONYMOUS="true", OPENAI_API_KEY="sk-from-the-environment")
    proc = serve_cli(port, "--host", "0.0.0.0", env=env, stderr=subprocess.PIPE, text=True)
    try:
        wait_until_up(proc, port)
        base = f"http://127.0.0.1:{port}"
        assert [m["id"] for m in httpx.get(f"{base}/v1/models").json()["data"]] == ["mock"]
        r = httpx.post(f"{base}/v1/responses", json={"model": "openai/gpt-4o", "input": "hi"})
        assert r.status_code == 400 and r.json()["error"]["code"] == "model_not_found"
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=20)
    lines = [json.loads(ln) for ln in err.splitlines() if ln.startswith("{")]
    warning = next(ln for ln in lines if ln.get("event") == "config_warning")
    assert warning["field"] == "auth.anonymous" and "OPENAI_API_KEY" in warning["detail"]
    assert "sk-from-the-environment" not in err


# -- first contact -------------------------------------------------------------------------------


def started_line(err: str) -> dict[str, object]:
    lines = [json.loads(ln) for ln in err.splitlines() if ln.startswith("{")]
    started = [ln for ln in lines if ln.get("event") == "gateway_started"]
    assert len(started) == 1, err
    return started[0]


@pytest.mark.parametrize("with_auth", [False, True])
def test_start_up_line_says_where_whether_auth_which_models_and_the_store(with_auth: bool) -> None:
    port = free_port()
    env = cli_env(GATEWAY_AUTH__API_KEYS='[{"key": "sk-a", "tenant": "a"}]') if with_auth else cli_env()
    proc = serve_cli(port, env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    try:
        wait_until_up(proc, port)
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=20)
    line = started_line(err)
    assert line["url"] == f"http://127.0.0.1:{port}"
    assert line["auth"] is with_auth
    assert line["models"] == ["mock"] and line["store"] == "memory"


def help_entries(text: str) -> dict[str, str]:
    """``--flag`` → its help text, whitespace collapsed, from argparse's ``options:`` section."""
    entries: dict[str, str] = {}
    flag = None
    for line in text.split("options:", 1)[1].splitlines():
        if line.startswith("  -"):
            names = re.findall(r"--[\w-]+", line.split("  ", 2)[1])
            flag = names[-1]
            entries[flag] = line
        elif flag is not None:
            entries[flag] += line
    return {k: " ".join(v.split()) for k, v in entries.items()}


def test_version_and_help_with_every_default() -> None:
    out = run_cli("--version")
    assert out.returncode == 0 and out.stdout.strip() == f"openresponses-gateway {gateway.__version__}"
    expected = {
        "serve": {
            "--config": "$GATEWAY_CONFIG",
            "--host": "127.0.0.1",
            "--port": "8080",
            "--workers": "1",
            "--log-level": "info",
        },
        "check-config": {"--config": "$GATEWAY_CONFIG", "--host": "127.0.0.1"},
    }
    for command, flags in expected.items():
        out = run_cli(command, "--help")
        assert out.returncode == 0
        helps = help_entries(out.stdout)
        assert set(helps) == set(flags) | {"--help"}, out.stdout
        for flag, default in flags.items():
            assert re.search(r"\(default: [^)]*" + re.escape(default), helps[flag]), (command, helps[flag])


@pytest.mark.parametrize("port", ["99999999", "-1", "http"])
def test_a_port_out_of_range_is_refused_at_once(port: str) -> None:
    out = run_cli("serve", "--port", port)
    assert out.returncode == 2
    assert "--port" in out.stderr and "Traceback" not in out.stderr
