"""The chart's pod, run as a process: the gateway's real CLI with the container's arguments, the
ConfigMap's file and the Secret's variables starts, takes the client keys from the Secret, is ready,
and on SIGTERM exits well inside the grace period the chart computed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import yaml
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from tests.api.helpers import ROOT, cli_env, wait_until_up
from tests.deploy.chart import MINIMAL, config_of, gateway_container, gateway_deployment, render, secret_env
from tests.harness import free_port
from tests.redis_server import delete_prefix, redis_url, unique_prefix


def test_the_pod_serves_with_its_config_and_secret_and_stops_within_its_grace(tmp_path: Path) -> None:
    docs = render({**MINIMAL, "config": {"limits": {"ws_drain_seconds": 3}}})  # Helm merges in the defaults
    container = gateway_container(docs)
    pod = gateway_deployment(docs)["spec"]["template"]["spec"]
    pre_stop = int(container["lifecycle"]["preStop"]["exec"]["command"][1])
    grace = pod["terminationGracePeriodSeconds"]
    config = config_of(docs)
    prefix = unique_prefix()
    # the chart's own Redis Service is not here: the test Redis stands in for it
    config["state"] = {**config["state"], "redis_url": redis_url(), "key_prefix": prefix}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    port = free_port()
    args = []
    for arg in container["args"]:
        if arg.startswith("--config="):
            arg = f"--config={path}"
        elif arg.startswith("--port="):
            arg = f"--port={port}"
        args.append(arg)
    env = cli_env(**secret_env(docs), **{e["name"]: e["value"] for e in container["env"] if "value" in e})
    env["TMPDIR"] = str(tmp_path)  # the pod's emptyDir
    log = (tmp_path / "stderr").open("wb")  # its JSON log lines, for a failing run
    proc = subprocess.Popen([sys.executable, "-m", "gateway", *args], cwd=ROOT, env=env, stderr=log)
    try:
        wait_until_up(proc, port)
        base = f"http://127.0.0.1:{port}"
        ready = httpx.get(f"{base}/readyz", timeout=10)
        assert ready.status_code == 200 and ready.json()["status"] == "ok"
        key = MINIMAL["secrets"]["apiKeys"][0]["key"]
        assert httpx.get(f"{base}/v1/models", timeout=10).status_code == 401  # keys are on
        models = httpx.get(f"{base}/v1/models", headers={"authorization": f"Bearer {key}"}, timeout=10)
        assert [m["id"] for m in models.json()["data"]] == sorted(config["models"])
        with connect(
            f"ws://127.0.0.1:{port}/v1/responses",
            additional_headers={"authorization": f"Bearer {key}"},
            proxy=None,
            open_timeout=20,
        ) as ws:
            t0 = time.monotonic()
            os.kill(proc.pid, signal.SIGTERM)  # what the kubelet sends after the preStop sleep
            try:
                ws.recv(timeout=30)
            except ConnectionClosed as closed:
                assert closed.rcvd is not None and closed.rcvd.code == 1001  # going away: reconnect elsewhere
            # uvicorn re-raises the signal once shut down: the exit status says SIGTERM, not a crash
            assert proc.wait(timeout=60) in (0, -signal.SIGTERM)
            took = time.monotonic() - t0
        assert took < grace - pre_stop, (took, grace)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        log.close()
        delete_prefix(redis_url(), prefix)
