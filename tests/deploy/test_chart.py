"""The Helm chart, rendered and linted offline by the real Helm engine for several value
combinations: every manifest validates against Kubernetes' own schemas, the pods are locked down
and probed, shutdown outlasts the drain, a config change rolls the pods, nothing it references is
missing, and the gateway's own validator accepts the config it ships."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.kernel.settings import Settings, StateSettings
from tests.api.helpers import cli_env, run_cli
from tests.deploy.chart import (
    CHART,
    COMBOS,
    EXISTING_SECRET_ENV,
    KUBE_VERSION,
    MINIMAL,
    NAMESPACE,
    config_of,
    gateway_container,
    gateway_deployment,
    gateway_part,
    need,
    render,
    secret_env,
)

# Kinds kubernetes-validate has no schema for: the Prometheus operator's CRD, checked by hand below.
CRD_KINDS = {("monitoring.coreos.com/v1", "ServiceMonitor")}


def merged(*parts: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for part in parts:
        for k, v in part.items():
            out[k] = merged(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


@pytest.fixture(scope="module", params=sorted(COMBOS))
def combo(request: pytest.FixtureRequest) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(values, the manifests they render), for each of COMBOS."""
    return COMBOS[request.param], render(COMBOS[request.param])


def test_helm_lint_is_clean_with_every_combination() -> None:
    helm = need("helm_python")
    for name, values in COMBOS.items():
        report = helm.lint(str(CHART), values, strict=True, kube_version=f"v{KUBE_VERSION}")
        assert report["errors"] == [], (name, report)
        # severity 2 = warning, 3 = error (1 = info: e.g. "icon is recommended")
        assert [m for m in report["messages"] if m["severity"] >= 2] == [], (name, report)


def test_values_schema_accepts_the_combinations_and_refuses_bad_values() -> None:
    helm = need("helm_python")
    with helm.Chart.load(str(CHART)) as chart:
        assert chart.schema is not None
        for values in COMBOS.values():
            chart.validate_schema(values)
        for bad in (
            {"workers": 0},
            {"redis": {"mode": "replica"}},
            {"metrics": {"port": "x"}},
            {"port": 70000},
        ):
            with pytest.raises(helm.HelmError):
                chart.validate_schema(merged(MINIMAL, bad))


def test_every_manifest_validates_against_the_kubernetes_schema(combo: Any) -> None:
    kv = need("kubernetes_validate")
    _, docs = combo
    for doc in docs:
        if (doc["apiVersion"], doc["kind"]) in CRD_KINDS:
            with pytest.raises(kv.utils.SchemaNotFoundError):  # not a built-in kind: see below
                kv.validate(doc, KUBE_VERSION, strict=True)
            continue
        # strict: no field Kubernetes does not know (a typo would be silently dropped by the API)
        kv.validate(doc, KUBE_VERSION, strict=True)


def test_the_pod_is_locked_down(combo: Any) -> None:
    values, docs = combo
    pod = gateway_deployment(docs)["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["automountServiceAccountToken"] is False
    c = gateway_container(docs)
    sc = c["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"] == {"drop": ["ALL"]} and sc["seccompProfile"] == {"type": "RuntimeDefault"}
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert "emptyDir" in volumes[mounts["/tmp"]]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["TMPDIR"] == "/tmp"
    # the supervisor of --workers makes the workers' metric directory under TMPDIR, and names it
    # in each worker's PROMETHEUS_MULTIPROC_DIR itself
    assert "PROMETHEUS_MULTIPROC_DIR" not in env
    workers = values.get("workers", 1)
    if workers > 1:
        assert f"--workers={workers}" in c["args"]
        assert volumes[mounts["/tmp"]]["emptyDir"]["medium"] == "Memory"  # mmap'd metric files
    else:
        assert not any(a.startswith("--workers") for a in c["args"])  # today's serve, unchanged
        assert "medium" not in volumes[mounts["/tmp"]]["emptyDir"]
    assert c["resources"]["requests"]["cpu"] and c["resources"]["limits"]["memory"]


def test_probes_and_shutdown_outlast_the_drain(combo: Any) -> None:
    values, docs = combo
    c = gateway_container(docs)
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert c["startupProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    pre_stop = c["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep" and int(pre_stop[1]) > 0
    drain = values.get("config", {}).get("limits", {}).get("ws_drain_seconds", 10)
    assert config_of(docs)["limits"]["ws_drain_seconds"] == drain  # the gateway drains what we computed
    grace = gateway_deployment(docs)["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    # SIGTERM comes after the preStop sleep; then the gateway drains for up to `drain` seconds
    assert grace > int(pre_stop[1]) + math.ceil(drain), (grace, drain)


def test_the_grace_period_follows_the_configured_drain() -> None:
    docs = render(merged(MINIMAL, {"config": {"limits": {"ws_drain_seconds": 120}}}))
    assert gateway_deployment(docs)["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] > 125


def checksums(values: dict[str, Any]) -> dict[str, str]:
    annotations = gateway_deployment(render(values))["spec"]["template"]["metadata"]["annotations"]
    return {k: v for k, v in annotations.items() if k.startswith("checksum/")}


def test_a_config_or_secret_change_rolls_the_pods_and_nothing_else_does() -> None:
    base = checksums(MINIMAL)
    assert base == checksums(copy.deepcopy(MINIMAL))  # deterministic
    assert checksums(merged(MINIMAL, {"replicaCount": 5, "podAnnotations": {"a": "b"}})) == base
    body = checksums(merged(MINIMAL, {"config": {"limits": {"max_body_bytes": 2 * 1024 * 1024}}}))
    assert body["checksum/config"] != base["checksum/config"]
    redis = checksums(merged(MINIMAL, {"redis": {"url": "redis://elsewhere:6379/0"}}))
    assert redis["checksum/config"] != base["checksum/config"]
    rotated = checksums(
        merged(
            MINIMAL,
            {"secrets": {"compactionKeys": [COMBOS["defaults"]["secrets"]["compactionKeys"][0], "x" * 44]}},
        )
    )
    assert rotated["checksum/secret"] != base["checksum/secret"]
    assert rotated["checksum/config"] == base["checksum/config"]


def labels_match(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def test_everything_referenced_is_rendered(combo: Any) -> None:
    check_references(*combo)


def check_references(values: dict[str, Any], docs: list[dict[str, Any]]) -> None:
    """Every ConfigMap, Secret, ServiceAccount, volume, port and selector a manifest names is
    rendered too (or is the existing Secret the values name)."""
    by_kind: dict[str, set[str]] = {}
    for d in docs:
        by_kind.setdefault(d["kind"], set()).add(d["metadata"]["name"])
    existing = values.get("secrets", {}).get("existingSecret")
    secrets = by_kind.get("Secret", set()) | ({existing} if existing else set())
    deployments = [d for d in docs if d["kind"] == "Deployment"]
    pods = {d["metadata"]["name"]: d["spec"]["template"] for d in deployments}
    for dname, tpl in pods.items():
        spec = tpl["spec"]
        assert labels_match(
            next(d for d in deployments if d["metadata"]["name"] == dname)["spec"]["selector"]["matchLabels"],
            tpl["metadata"]["labels"],
        )
        sa = spec.get("serviceAccountName")
        if sa is not None and values.get("serviceAccount", {}).get("create", True):
            assert sa in by_kind.get("ServiceAccount", set())
        for v in spec.get("volumes", []):
            if "configMap" in v:
                assert v["configMap"]["name"] in by_kind["ConfigMap"]
            if "secret" in v:
                assert v["secret"]["secretName"] in secrets
        for c in spec["containers"]:
            mounted = {m["name"] for m in c.get("volumeMounts", [])}
            assert mounted <= {v["name"] for v in spec.get("volumes", [])}
            for ef in c.get("envFrom", []):
                assert ef["secretRef"]["name"] in secrets
            for e in c.get("env", []):
                ref = e.get("valueFrom", {})
                assert "secretKeyRef" not in ref or ref["secretKeyRef"]["name"] in secrets
                assert "configMapKeyRef" not in ref or ref["configMapKeyRef"]["name"] in by_kind["ConfigMap"]
            for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
                port = c.get(probe, {}).get("httpGet", {}).get("port")
                assert port is None or port in {p["name"] for p in c["ports"]}
    for svc in (d for d in docs if d["kind"] == "Service"):
        backing = [t for t in pods.values() if labels_match(svc["spec"]["selector"], t["metadata"]["labels"])]
        assert len(backing) == 1, svc["metadata"]["name"]
        ports = {p["name"] for c in backing[0]["spec"]["containers"] for p in c.get("ports", [])}
        assert {p["targetPort"] for p in svc["spec"]["ports"]} <= ports
    gw_labels = gateway_deployment(docs)["spec"]["template"]["metadata"]["labels"]
    for kind in ("PodDisruptionBudget", "NetworkPolicy"):
        for d in (d for d in docs if d["kind"] == kind):
            sel = d["spec"].get("selector", d["spec"].get("podSelector"))["matchLabels"]
            assert any(labels_match(sel, t["metadata"]["labels"]) for t in pods.values()), d["metadata"][
                "name"
            ]
    for hpa in (d for d in docs if d["kind"] == "HorizontalPodAutoscaler"):
        assert hpa["spec"]["scaleTargetRef"]["name"] in pods
        assert "replicas" not in gateway_deployment(docs)["spec"]  # the HPA owns the count
    for sm in (d for d in docs if d["kind"] == "ServiceMonitor"):
        svc = gateway_part(docs, "Service")
        assert labels_match(sm["spec"]["selector"]["matchLabels"], svc["metadata"]["labels"])
        assert sm["spec"]["namespaceSelector"]["matchNames"] == [NAMESPACE]
        assert {e["port"] for e in sm["spec"]["endpoints"]} <= {p["name"] for p in svc["spec"]["ports"]}
        assert all(e["path"] == "/metrics" for e in sm["spec"]["endpoints"])
    # a Redis URL the chart writes names a Service it renders
    url = config_of(docs)["state"].get("redis_url", "")
    if "-redis:" in url:
        assert url.split("//")[1].split(":")[0] in by_kind["Service"]
    assert gw_labels["app.kubernetes.io/component"] == "gateway"


def test_the_gateway_accepts_the_config_it_is_shipped(combo: Any, tmp_path: Path) -> None:
    """``check-config --host 0.0.0.0`` (exactly as the pod's ``serve`` would validate) on the
    ConfigMap's file with the Secret's variables."""
    _, docs = combo
    config = config_of(docs)
    pending = [f"state.{f}" for f in config.get("state", {}) if f not in StateSettings.model_fields]
    pending += [top for top in config if top not in Settings.model_fields]
    assert not pending, f"the chart writes settings the gateway does not have: {pending}"
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    env = secret_env(docs) or EXISTING_SECRET_ENV
    assert json.loads(env["GATEWAY_COMPACTION__KEYS"])
    host = next(a for a in gateway_container(docs)["args"] if a.startswith("--host=")).split("=", 1)[1]
    out = run_cli("check-config", "--config", str(path), "--host", host, env=cli_env(**env))
    assert out.returncode == 0, out.stderr
    assert "configuration ok" in out.stdout


@pytest.mark.parametrize(
    ("values", "says"),
    [
        ({}, "no client keys"),
        ({"secrets": {"apiKeys": [{"key": "k", "tenant": "t"}]}}, "no compaction keys"),
        (
            merged(MINIMAL, {"config": {"auth": {"api_keys": [{"key": "sk-plain", "tenant": "t"}]}}}),
            "plain key",
        ),
        (merged(MINIMAL, {"config": {"compaction": {"keys": ["abc"]}}}), "secrets.compactionKeys"),
        (
            merged(MINIMAL, {"config": {"providers": {"p": {"kind": "openai-chat", "api_key": "sk"}}}}),
            "api_key",
        ),
        (merged(MINIMAL, {"config": {"state": {"redis_url": "redis://x:6379"}}}), "redis.url"),
        (merged(MINIMAL, {"redis": {"mode": "cluster"}}), "external Redis"),
        (merged(MINIMAL, {"redis": {"mode": "sentinel", "internal": {"enabled": False}}}), "sentinelMaster"),
        (merged(MINIMAL, {"redis": {"internal": {"enabled": False}}}), "no Redis"),
        (
            merged(MINIMAL, {"redis": {"mode": "sentinel", "sentinels": ["s:26379"], "sentinelMaster": "m"}}),
            "external Redis",
        ),
        (merged(MINIMAL, {"secrets": {"sentinelPassword": "pw"}}), "only used with redis.mode sentinel"),
        (merged(MINIMAL, {"serviceMonitor": {"enabled": True}}), "serviceMonitor.enabled needs metrics.port"),
        (
            merged(MINIMAL, {"config": {"auth": {"api_keys": [{"sha256": "ab" * 32, "tenant": "t"}]}}}),
            "in one place",
        ),
    ],
)
def test_values_that_cannot_run_or_would_leak_are_refused_at_render(
    values: dict[str, Any], says: str
) -> None:
    helm = need("helm_python")
    with pytest.raises(helm.HelmError) as err:
        render(values)
    assert says in str(err.value)


def test_an_existing_secret_replaces_the_charts() -> None:
    docs = render(COMBOS["existing-secret"])
    assert not [d for d in docs if d["kind"] == "Secret"]
    c = gateway_container(docs)
    assert c["envFrom"] == [{"secretRef": {"name": "gateway-keys"}}]
    assert "checksum/secret" not in gateway_deployment(docs)["spec"]["template"]["metadata"]["annotations"]


def test_the_secret_carries_keys_as_the_gateway_reads_them() -> None:
    docs = render(
        merged(
            MINIMAL,
            {"secrets": {"providerKeys": {"OPENAI_API_KEY": "sk-o"}, "redisUrl": "redis://:pw@r:6379/0"}},
        )
    )
    env = secret_env(docs)
    assert json.loads(env["GATEWAY_AUTH__API_KEYS"]) == MINIMAL["secrets"]["apiKeys"]
    assert json.loads(env["GATEWAY_COMPACTION__KEYS"]) == MINIMAL["secrets"]["compactionKeys"]
    assert env["OPENAI_API_KEY"] == "sk-o" and env["GATEWAY_STATE__REDIS_URL"] == "redis://:pw@r:6379/0"
    assert "redis_url" not in config_of(docs)["state"]  # the secret's URL, not a second one
    for d in docs:
        if d["kind"] != "Secret":
            assert "sk-team-a" not in yaml.safe_dump(d) and "pw@" not in yaml.safe_dump(d)


def test_the_modes_reach_the_gateway_config() -> None:
    sentinel = config_of(render(COMBOS["sentinel"]))["state"]
    assert sentinel["redis_mode"] == "sentinel" and sentinel["sentinel_master"] == "mymaster"
    assert sentinel["sentinels"] == COMBOS["sentinel"]["redis"]["sentinels"]
    assert sentinel["redis_url"] == COMBOS["sentinel"]["redis"]["url"]
    assert secret_env(render(COMBOS["sentinel"]))["GATEWAY_STATE__SENTINEL_PASSWORD"] == "sentinel-pw"
    cluster = config_of(render(COMBOS["cluster"]))["state"]
    assert cluster == {**cluster, "redis_mode": "cluster", "redis_url": "redis://redis-cluster:6379/0"}
    default = config_of(render(MINIMAL))
    assert "redis_mode" not in default["state"] and "metrics" not in default  # valid today, unchanged
    monitoring = render(COMBOS["monitoring"])
    assert config_of(monitoring)["metrics"] == {"port": 9464}
    assert {"name": "metrics", "containerPort": 9464, "protocol": "TCP"} in gateway_container(monitoring)[
        "ports"
    ]


def test_the_network_policy_admits_callers_scrapers_and_what_the_gateway_calls() -> None:
    ingress_from = COMBOS["monitoring"]["networkPolicy"]["ingressFrom"]
    metrics_from = COMBOS["monitoring"]["networkPolicy"]["metricsFrom"]
    policy = gateway_part_policy(render(COMBOS["monitoring"]))
    rules = {r["ports"][0]["port"]: r.get("from") for r in policy["spec"]["ingress"]}
    assert rules == {"http": ingress_from, "metrics": metrics_from}
    egress = policy["spec"]["egress"]
    assert {"port": 53, "protocol": "UDP"} in egress[0]["ports"]
    assert any(
        "podSelector" in str(r.get("to")) and r["ports"] == [{"port": 6379, "protocol": "TCP"}]
        for r in egress
    )
    # /metrics on the API port: the scrapers are admitted to that port
    main_port = merged(
        COMBOS["monitoring"], {"metrics": {"port": None}, "serviceMonitor": {"enabled": False}}
    )
    rules = {
        r["ports"][0]["port"]: r.get("from")
        for r in gateway_part_policy(render(main_port))["spec"]["ingress"]
    }
    assert rules == {"http": ingress_from + metrics_from}
    # the internal Redis admits the gateway only
    docs = render(COMBOS["monitoring"])
    redis_policy = next(
        d for d in docs if d["kind"] == "NetworkPolicy" and d["metadata"]["name"].endswith("-redis")
    )
    assert redis_policy["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "redis"
    sources = redis_policy["spec"]["ingress"][0]["from"]
    assert sources == [
        {"podSelector": {"matchLabels": gateway_deployment(docs)["spec"]["selector"]["matchLabels"]}}
    ]


def gateway_part_policy(docs: list[dict[str, Any]]) -> dict[str, Any]:
    policies = [d for d in docs if d["kind"] == "NetworkPolicy"]
    return next(
        p
        for p in policies
        if p["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "gateway"
    )
