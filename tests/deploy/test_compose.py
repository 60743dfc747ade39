"""deploy/docker-compose.yml, checked without a Docker engine: everything it references exists, only
the load balancer publishes a port, nginx proxies to every replica with WebSocket upgrades and long
timeouts, the replicas outlast their drain, and the gateway accepts the config and .env they get."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import secrets
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.api.helpers import cli_env, run_cli

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
COMPOSE = DEPLOY / "docker-compose.yml"
INTERPOLATION = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}")


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return doc


def gateways(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {n: s for n, s in compose["services"].items() if "gateway-config" in str(s.get("configs"))}


def seconds(text: str) -> float:
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    return sum(float(n) * units[u] for n, u in re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h)", text))


def dotenv(path: Path) -> dict[str, str]:
    """KEY=VALUE lines as compose reads them (single quotes: literal; # starts a comment line)."""
    out = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            name, _, value = line.partition("=")
            out[name.strip()] = shlex.split(value)[0] if value.strip() else ""
    return out


def test_every_reference_resolves(compose: dict[str, Any]) -> None:
    services = compose["services"]
    for name, svc in services.items():
        for dep in svc.get("depends_on", {}):
            assert dep in services, (name, dep)
        for c in svc.get("configs", []):
            assert c["source"] in compose.get("configs", {}), (name, c)
        for s in svc.get("secrets", []):
            assert (s["source"] if isinstance(s, dict) else s) in compose.get("secrets", {}), (name, s)
        for v in svc.get("volumes", []):
            source = (v["source"] if isinstance(v, dict) else v).split(":")[0]
            assert (source.startswith((".", "/")) and (DEPLOY / source).exists()) or source in compose.get(
                "volumes", {}
            ), (name, v)
        for env_file in svc.get("env_file", []):
            assert (DEPLOY / (env_file["path"] if isinstance(env_file, dict) else env_file)).is_file()
        if "build" in svc:
            context = DEPLOY / svc["build"]["context"]
            assert (context / svc["build"]["dockerfile"]).is_file()
    for name, cfg in compose.get("configs", {}).items():
        assert (DEPLOY / cfg["file"]).is_file(), name


def test_only_the_load_balancer_publishes_a_port_and_it_waits_for_healthy_replicas(
    compose: dict[str, Any],
) -> None:
    published = {n for n, s in compose["services"].items() if s.get("ports")}
    assert published == {"lb"}
    assert compose["services"]["lb"]["ports"] == ["${GATEWAY_PORT:-8080}:8080"]
    replicas = gateways(compose)
    assert len(replicas) == 2 and all("deploy" not in s for s in replicas.values())
    assert {d: c["condition"] for d, c in compose["services"]["lb"]["depends_on"].items()} == {
        n: "service_healthy" for n in replicas
    }
    for svc in replicas.values():
        assert "healthcheck" in svc and "/healthz" in " ".join(svc["healthcheck"]["test"])
        assert svc["depends_on"]["redis"]["condition"] == "service_healthy"
        assert svc["read_only"] is True and svc["cap_drop"] == ["ALL"]


def nginx_conf(compose: dict[str, Any]) -> str:
    target = next(c for c in compose["services"]["lb"]["configs"] if c["target"] == "/etc/nginx/nginx.conf")
    return (DEPLOY / compose["configs"][target["source"]]["file"]).read_text()


def directives(block: str) -> list[list[str]]:
    """The simple directives of an nginx config, as word lists (comments dropped)."""
    text = re.sub(r"#[^\n]*", "", block)
    return [shlex.split(d) for d in re.split(r"[;{}]", text) if d.strip()]


def test_nginx_proxies_to_every_replica_with_upgrades_and_long_timeouts(compose: dict[str, Any]) -> None:
    conf = nginx_conf(compose)
    assert conf.count("{") == conf.count("}")
    upstream = re.search(r"upstream\s+(\w+)\s*\{([^}]*)\}", conf)
    assert upstream is not None
    name, body = upstream.groups()
    servers = {d[1] for d in directives(body) if d[0] == "server"}
    assert servers == {f"{n}:8080" for n in gateways(compose)}
    words = directives(conf)
    found = {d[0]: d[1:] for d in words}
    assert ["proxy_pass", f"http://{name}"] in words
    assert found["listen"] == ["8080"]  # the port the lb publishes
    assert found["proxy_http_version"] == ["1.1"]
    headers = {d[1]: d[2] for d in words if d[0] == "proxy_set_header"}
    assert headers["Upgrade"] == "$http_upgrade" and headers["Connection"] == "$connection_upgrade"
    assert re.search(r"map\s+\$http_upgrade\s+\$connection_upgrade\s*\{[^}]*default\s+upgrade", conf)
    assert found["proxy_buffering"] == ["off"]  # SSE events are not held back
    gateway_cfg = yaml.safe_load((DEPLOY / compose["configs"]["gateway-config"]["file"]).read_text())
    ws_seconds = gateway_cfg.get("limits", {}).get("ws_connection_seconds", 3600)
    assert seconds(found["proxy_read_timeout"][0]) >= ws_seconds
    assert seconds(found["proxy_send_timeout"][0]) >= 60
    max_body = gateway_cfg.get("limits", {}).get("max_body_bytes", 8 * 1024 * 1024)
    assert int(found["client_max_body_size"][0].rstrip("m")) * 1024 * 1024 > max_body  # the gateway's 413


def test_the_replicas_outlast_their_drain(compose: dict[str, Any]) -> None:
    cfg = yaml.safe_load((DEPLOY / compose["configs"]["gateway-config"]["file"]).read_text())
    drain = cfg.get("limits", {}).get("ws_drain_seconds", 10)
    for svc in gateways(compose).values():
        assert seconds(svc["stop_grace_period"]) > drain + 5


def test_every_variable_the_compose_file_needs_is_in_the_env_example(compose: dict[str, Any]) -> None:
    example = dotenv(DEPLOY / ".env.example")
    for var, op, _ in INTERPOLATION.findall(COMPOSE.read_text()):
        if op.endswith("?"):  # required: compose refuses to start without it
            assert var in example, var
    # the filled-in copy, with the keys, is never committed
    ignored = subprocess.run(["git", "check-ignore", "-q", "deploy/.env"], cwd=DEPLOY.parent, timeout=30)
    assert ignored.returncode == 0


def compose_env(values: dict[str, str], compose: dict[str, Any]) -> dict[str, str]:
    """A replica's environment, interpolated as compose does from ``values`` (deploy/.env)."""
    out = {}
    for name, raw in next(iter(gateways(compose).values()))["environment"].items():

        def sub(m: re.Match[str]) -> str:
            var, op, default = m.groups()
            if op and op.endswith("?") and not values.get(var):
                raise KeyError(var)
            return values.get(var) or (default if op and op.endswith("-") else "")

        out[name] = INTERPOLATION.sub(sub, str(raw))
    return out


def check_config(compose: dict[str, Any], env: dict[str, str]) -> Any:
    """``check-config`` with a replica's own arguments (its --host) and environment."""
    svc = next(iter(gateways(compose).values()))
    args = list(svc["command"])
    config = DEPLOY / compose["configs"]["gateway-config"]["file"]
    args[args.index("--config") + 1] = str(config)
    assert args[0] == "serve"
    return run_cli("check-config", *args[1 : args.index("--port")], env=cli_env(**env))


def test_the_gateway_refuses_the_example_as_it_is_and_accepts_it_filled_in(compose: dict[str, Any]) -> None:
    example = dotenv(DEPLOY / ".env.example")
    as_is = check_config(compose, compose_env(example, compose))
    assert as_is.returncode == 2  # the REPLACE placeholders: no replica starts with a shared dummy key
    assert "auth.api_keys.0.sha256" in as_is.stderr and "compaction.keys.0" in as_is.stderr
    # filled in as its comments say
    client_key = "sk-" + secrets.token_urlsafe(18)
    digest = hashlib.sha256(client_key.encode()).hexdigest()
    filled = {
        **example,
        "GATEWAY_AUTH__API_KEYS": example["GATEWAY_AUTH__API_KEYS"].replace(
            "REPLACE-with-the-sha256-of-your-key", digest
        ),
        "GATEWAY_COMPACTION__KEYS": json.dumps([base64.b64encode(os.urandom(32)).decode()]),
    }
    ok = check_config(compose, compose_env(filled, compose))
    assert ok.returncode == 0, ok.stderr
    with pytest.raises(KeyError):  # compose itself stops on a missing required variable
        compose_env({}, compose)
