"""The shipped example config and the plain Kubernetes manifest: no secret in either, the gateway's
own validator accepts the config, and deploy/kubernetes.yaml is exactly the chart's render (so it
cannot drift), valid for Kubernetes, with nothing missing but the one Secret it says to make."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

from tests.api.helpers import cli_env, run_cli
from tests.deploy.chart import EXISTING_SECRET_ENV, KUBE_VERSION, need
from tests.deploy.test_chart import check_references

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
EXAMPLE = DEPLOY / "config.example.yaml"


def test_the_example_config_holds_no_secret() -> None:
    cfg = yaml.safe_load(EXAMPLE.read_text())
    assert "key" not in str(cfg.get("auth", {})) and "keys" not in cfg.get("compaction", {})
    assert all("api_key" not in p for p in cfg["providers"].values())
    assert "@" not in cfg["state"]["redis_url"]


def test_the_gateway_accepts_the_example_with_its_keys_from_the_environment() -> None:
    env = cli_env(**EXISTING_SECRET_ENV)
    ok = run_cli("check-config", "--config", str(EXAMPLE), "--host", "0.0.0.0", env=env)
    assert ok.returncode == 0, ok.stderr
    # and refuses to listen beyond loopback without client keys
    no_keys = {k: v for k, v in env.items() if k != "GATEWAY_AUTH__API_KEYS"}
    refused = run_cli("check-config", "--config", str(EXAMPLE), "--host", "0.0.0.0", env=no_keys)
    assert refused.returncode == 2 and "without client keys" in refused.stderr


def test_kubernetes_yaml_is_the_charts_render() -> None:
    need("helm_python")
    out = subprocess.run(
        [sys.executable, str(DEPLOY / "helm" / "render_plain.py")], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert (DEPLOY / "kubernetes.yaml").read_text() == out.stdout, (
        "regenerate: python deploy/helm/render_plain.py > deploy/kubernetes.yaml"
    )


def test_kubernetes_yaml_is_valid_and_complete() -> None:
    kv = need("kubernetes_validate")
    docs = [d for d in yaml.safe_load_all((DEPLOY / "kubernetes.yaml").read_text()) if d]
    assert {d["kind"] for d in docs} >= {"ConfigMap", "Deployment", "Service", "PodDisruptionBudget"}
    for doc in docs:
        kv.validate(doc, KUBE_VERSION, strict=True)
    secret = "openresponses-gateway-keys"
    assert f"kubectl create secret generic {secret}" in (DEPLOY / "kubernetes.yaml").read_text()
    check_references({"secrets": {"existingSecret": secret}}, docs)
