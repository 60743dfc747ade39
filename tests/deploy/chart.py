"""The Helm chart rendered offline by the real Helm engine (helm-python-sdk: Helm's Go SDK as a
library), parsed into manifests; and the value combinations the deploy tests render."""

from __future__ import annotations

import base64
import importlib
import os
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "open-responses-gateway"
RELEASE, NAMESPACE = "gw", "llm"
KUBE_VERSION = "1.34.0"  # kubernetes-validate ships schemas up to 1.37; 1.34 is a current cluster


def need(module: str) -> ModuleType:
    """The ``[deploy-test]`` extra's module: a skip without it, an error in CI (.ci/run installs it)."""
    if os.environ.get("CI"):
        return importlib.import_module(module)
    return pytest.importorskip(module, reason="pip install -e '.[deploy-test]'")


def key(n: int = 0) -> str:
    return base64.b64encode(bytes([n + 1]) * 32).decode()


# The least an install needs: a client key and a compaction key (the chart refuses less).
MINIMAL: dict[str, Any] = {
    "secrets": {"apiKeys": [{"key": "sk-team-a", "tenant": "team-a"}], "compactionKeys": [key()]}
}

COMBOS: dict[str, dict[str, Any]] = {
    "defaults": MINIMAL,
    "workers-2": {**MINIMAL, "workers": 2},
    "sentinel": {
        **MINIMAL,
        "redis": {
            "mode": "sentinel",
            "sentinels": ["sentinel-0.sentinel:26379", "sentinel-1.sentinel:26379"],
            "sentinelMaster": "mymaster",
            "url": "redis://sentinel-master:6379/0",  # in sentinel mode: scheme, credentials, db
            "internal": {"enabled": False},
        },
        "secrets": {**MINIMAL["secrets"], "sentinelPassword": "sentinel-pw"},
    },
    "cluster": {
        **MINIMAL,
        "redis": {"mode": "cluster", "url": "redis://redis-cluster:6379/0", "internal": {"enabled": False}},
    },
    "monitoring": {
        **MINIMAL,
        "metrics": {"port": 9464},
        "serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
        "networkPolicy": {
            "enabled": True,
            "ingressFrom": [{"namespaceSelector": {"matchLabels": {"name": "ingress"}}}],
            "metricsFrom": [{"namespaceSelector": {"matchLabels": {"name": "monitoring"}}}],
        },
    },
    "existing-secret": {"secrets": {"existingSecret": "gateway-keys"}},
    "digests-fixed-replicas": {
        "config": {
            "auth": {"api_keys": [{"sha256": "ab" * 32, "tenant": "team-a", "name": "ci"}]},
            "providers": {"local": {"kind": "openai-chat", "base_url": "http://vllm.models:8000/v1"}},
            "models": {"qwen": {"provider": "local", "upstream_model": "Qwen/Qwen3-8B"}},
            "limits": {"ws_drain_seconds": 45.5},
        },
        "secrets": {"compactionKeys": [key(1), key(2)], "providerKeys": {"LOCAL_API_KEY": "sk-local"}},
        "autoscaling": {"enabled": False},
        "podDisruptionBudget": {"enabled": False},
        "replicaCount": 3,
        "serviceAccount": {"create": False},
        "imagePullSecrets": [],
    },
}

# What a Secret the chart did not make holds, for the gateway's own validator.
EXISTING_SECRET_ENV = {
    "GATEWAY_AUTH__API_KEYS": '[{"key": "sk-team-a", "tenant": "team-a"}]',
    "GATEWAY_COMPACTION__KEYS": f'["{key()}"]',
}


def render(values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Every manifest the chart renders with ``values``, in template order (HelmRenderError if a
    template fails, ``fail`` included)."""
    helm = need("helm_python")
    with helm.Chart.load(str(CHART)) as chart:
        files = chart.render(values or {}, name=RELEASE, namespace=NAMESPACE)
    docs: list[dict[str, Any]] = []
    for path in sorted(files):
        if path.endswith(".yaml"):
            docs.extend(d for d in yaml.safe_load_all(files[path]) if d)
    return docs


def one(docs: list[dict[str, Any]], kind: str, name_suffix: str = "") -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"].endswith(name_suffix)]
    assert len(found) == 1, f"{kind} *{name_suffix}: {len(found)} rendered"
    return found[0]


def gateway_part(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    """The gateway's (not the internal Redis') manifest of ``kind``."""
    found = [
        d
        for d in docs
        if d["kind"] == kind and d["metadata"]["labels"].get("app.kubernetes.io/component") == "gateway"
    ]
    assert len(found) == 1, f"{kind} of the gateway: {len(found)} rendered"
    return found[0]


def gateway_deployment(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return gateway_part(docs, "Deployment")


def gateway_container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    containers = gateway_deployment(docs)["spec"]["template"]["spec"]["containers"]
    return next(c for c in containers if c["name"] == "gateway")


def config_of(docs: list[dict[str, Any]]) -> dict[str, Any]:
    cm = one(docs, "ConfigMap")
    config: dict[str, Any] = yaml.safe_load(cm["data"]["config.yaml"])
    return config


def secret_env(docs: list[dict[str, Any]]) -> dict[str, str]:
    """The variables the chart's Secret gives the pod (none when it uses an existing Secret)."""
    secrets = [d for d in docs if d["kind"] == "Secret"]
    if not secrets:
        return {}
    data = secrets[0].get("data") or {}
    return {k: base64.b64decode(v).decode() for k, v in data.items()}
