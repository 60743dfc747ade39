"""Metrics across processes: two real ``python -m gateway serve`` processes share one
PROMETHEUS_MULTIPROC_DIR (as ``serve --workers`` workers do); a scrape of either renders both,
as does ``gateway.observability.multiprocess.serve_port`` (the supervisor's listener); a worker
marked dead leaves its counts but not its live gauges."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import httpx
import orjson
from prometheus_client import multiprocess
from prometheus_client.parser import text_string_to_metric_families
from websockets.sync.client import connect

from gateway.observability.multiprocess import serve_port, stop_serving
from tests.api.helpers import cli_env, serve_cli, wait_until_up
from tests.harness import free_port
from tests.observability.helpers import dashboard_queries, metric_names


def scrape(url: str) -> dict[str, Any]:
    r = httpx.get(url, timeout=30)
    assert r.status_code == 200, r.text
    return {f.name: f for f in text_string_to_metric_families(r.text)}


def total(fams: dict[str, Any], family: str, sample: str, **labels: str) -> float:
    return sum(
        s.value
        for s in fams[family].samples
        if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items())
    )


def ask(port: int, n: int) -> None:
    for _ in range(n):
        r = httpx.post(
            f"http://127.0.0.1:{port}/v1/responses", json={"model": "mock", "input": "hi"}, timeout=30
        )
        assert r.status_code == 200


def test_two_processes_render_as_one(tmp_path: Path) -> None:
    env = cli_env(PROMETHEUS_MULTIPROC_DIR=str(tmp_path))
    ports = [free_port(), free_port()]
    procs = [serve_cli(port, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for port in ports]
    try:
        for proc, port in zip(procs, ports, strict=True):
            wait_until_up(proc, port)
        ask(ports[0], 3)
        ask(ports[1], 2)
        completed = {"transport": "http", "model": "mock", "status": "completed"}
        with connect(f"ws://127.0.0.1:{ports[1]}/v1/responses", proxy=None) as ws:
            ws.send(orjson.dumps({"type": "response.create", "model": "mock", "input": "hi"}).decode())
            while orjson.loads(ws.recv(timeout=30))["type"] != "response.completed":
                pass
            fams = scrape(f"http://127.0.0.1:{ports[0]}/metrics")  # the other process's socket counts
            assert total(fams, "gateway_websocket_connections", "gateway_websocket_connections") == 1
        assert total(fams, "gateway_requests", "gateway_requests_total", **completed) == 5
        hist = "gateway_request_duration_seconds"
        assert total(fams, hist, hist + "_count", transport="http", model="mock") == 5
        for family in fams.values():
            assert family.documentation, family.name
        pids = {
            s.labels["pid"]
            for s in fams["gateway_worker_resident_memory_bytes"].samples
            if s.name == "gateway_worker_resident_memory_bytes"
        }
        assert pids == {str(p.pid) for p in procs}
        assert total(fams, "process_resident_memory_bytes", "process_resident_memory_bytes") > 0
        names = {s.name for family in fams.values() for s in family.samples}
        worker = {n for q in dashboard_queries() for n in metric_names(q) if n.startswith("gateway_worker_")}
        assert worker and worker <= names  # the dashboard's per-worker panels

        # the supervisor's listener renders the same directory
        port = free_port()
        server = serve_port("127.0.0.1", port, str(tmp_path))
        try:
            fams = scrape(f"http://127.0.0.1:{port}/metrics")
            assert total(fams, "gateway_requests", "gateway_requests_total", **completed) == 5
            assert (
                total(fams, "gateway_websocket_turns", "gateway_websocket_turns_total", status="completed")
                == 1
            )
            assert total(fams, "gateway_websocket_connections", "gateway_websocket_connections") == 0

            procs[1].terminate()
            procs[1].wait(timeout=60)
            multiprocess.mark_process_dead(procs[1].pid, str(tmp_path))
            fams = scrape(f"http://127.0.0.1:{port}/metrics")
            assert total(fams, "gateway_requests", "gateway_requests_total", **completed) == 5  # counts stay
            pids = {s.labels["pid"] for s in fams["gateway_worker_resident_memory_bytes"].samples}
            assert pids == {str(procs[0].pid)}  # live gauges of a dead worker go
        finally:
            stop_serving(server)
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=60)
