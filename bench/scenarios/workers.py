"""Workers benchmark: ``serve --workers 2`` against one worker and against the direct upstream, in
one run (bench/README.md, "Workers").

Processes on loopback: the fake upstream (bench/lib/upstream.py), a one-worker gateway, a two-worker
gateway (supervisor + two workers) and the load generator (bench/lib/load.py). Non-streaming JSON at
concurrency 64, the targets interleaved in rounds (direct, 1 worker, 2 workers, ...), each round
time-capped, so that drift on the shared machine hits all alike; then the built-in ``mock`` model
(no upstream) on both gateways. Gateway CPU is the sum over its processes (every worker and the
supervisor) from /proc.

    python -m bench workers            # about 1.5 minutes
    python -m bench workers --quick    # about half a minute

Output: a table on stdout and ``bench/results/workers-<UTC time>.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

from bench.lib.load import cpu_seconds
from bench.lib.procs import (
    HOST,
    RESULTS,
    ROOT,
    LoadWorker,
    Proc,
    cpu_times,
    free_port,
    http_get,
    machine_share,
    start_upstream,
    write_config,
)

PROMPT = "Say hello in one short sentence."
CONCURRENCY = 64


def children(pid: int) -> list[int]:
    """The child processes of ``pid`` (its workers)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                stat = Path(f"/proc/{entry}/stat").read_text()
                if int(stat.rpartition(")")[2].split()[1]) == pid:
                    found.append(int(entry))
    return sorted(found)


def start(config: Path, log: Path, workers: int) -> tuple[Proc, int, list[int]]:
    """A gateway with ``workers`` workers, once healthy and (each worker) done starting; its pids."""
    port = free_port()
    argv = [sys.executable, "-m", "gateway", "serve", "--config", str(config)]
    argv += ["--host", HOST, "--port", str(port), "--workers", str(workers)]
    with log.open("wb") as out:
        proc = Proc(f"gateway-{workers}w", argv, stdout=out, stderr=out)
    deadline = time.monotonic() + 60
    while True:
        if not proc.alive() or time.monotonic() > deadline:
            proc.stop()
            raise RuntimeError(f"the {workers}-worker gateway did not start:\n{log.read_text()[-2000:]}")
        with contextlib.suppress(OSError):
            if http_get(port, "/healthz")[0] == 200:
                break
        time.sleep(0.1)
    servers = [proc.pid] if workers == 1 else children(proc.pid)
    # each worker has imported and started: it is idle (below 10% of a core over half a second)
    while len(servers) != workers or any(busy(pid) for pid in servers):
        if time.monotonic() > deadline:
            raise RuntimeError(f"the {workers}-worker gateway's workers did not settle")
        servers = [proc.pid] if workers == 1 else children(proc.pid)
    pids = servers if workers == 1 else [proc.pid, *servers]
    return proc, port, pids


def busy(pid: int) -> bool:
    before = cpu_seconds(pid)
    time.sleep(0.5)
    return cpu_seconds(pid) - before > 0.05


def target(port: int, path: str, body: dict[str, Any]) -> dict[str, Any]:
    return {"port": port, "path": path, "body": body}


def measure(
    load: LoadWorker,
    targets: dict[str, dict[str, Any]],
    pids: dict[str, int],
    rounds: int,
    seconds: float,
) -> dict[str, Any]:
    """Each target ``rounds`` times (interleaved), ``seconds`` per target in all; CPU of ``pids``."""
    cmd = {
        "cmd": "http",
        "concurrency": CONCURRENCY,
        "requests": 10_000_000,  # time-capped: throughput is what completes in the time
        "max_seconds": seconds,
        "rounds": rounds,
        "warmup": 256,
        "match": False,
        "targets": targets,
        "pids": pids,
    }
    result: dict[str, Any] = load.run(cmd, timeout=len(targets) * (2 * seconds + 60 * rounds) + 30)
    return result


def cpu_ms(summary: dict[str, Any], names: list[str]) -> float:
    """Milliseconds of CPU per completed request, summed over the processes ``names``."""
    done = summary["requests"]
    return 1000 * sum(summary["cpu_s"].get(n, 0.0) for n in names) / done if done else float("nan")


def figures(res: dict[str, Any], groups: dict[str, list[str]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, summary in res.items():
        out[name] = {
            "rps": round(summary["rps"], 1),
            "requests": summary["requests"],
            "errors": summary["errors"],
            "p50_ms": summary["latency_ms"].get("p50"),
            "p99_ms": summary["latency_ms"].get("p99"),
            "gateway_cpu_ms_per_request": round(cpu_ms(summary, groups[name]), 3) if groups[name] else None,
            "upstream_cpu_ms_per_request": round(cpu_ms(summary, ["upstream"]), 3),
            "client_cpu_ms_per_request": round(cpu_ms(summary, ["client"]), 3),
        }
    return out


def render(r: dict[str, Any]) -> str:
    lines = [f"machine CPU during the run: {r['machine_cpu_percent']}", ""]
    for stage, label in (("fake", "JSON via the fake upstream"), ("mock", "JSON, built-in mock model")):
        rows = r[stage]
        lines.append(f"{label}, concurrency {CONCURRENCY}")
        lines.append(
            f"  {'target':<12}{'req/s':>10}{'p50 ms':>9}{'p99 ms':>9}{'gw CPU ms/req':>15}{'errors':>8}"
        )
        for name, f in rows.items():
            cpu = f["gateway_cpu_ms_per_request"]
            lines.append(
                f"  {name:<12}{f['rps']:>10.0f}{f['p50_ms'] or 0:>9.2f}{f['p99_ms'] or 0:>9.2f}"
                f"{'-' if cpu is None else f'{cpu:.3f}':>15}{f['errors']:>8}"
            )
        for k, v in r["ratios"][stage].items():
            lines.append(f"  {k}: {v}")
        lines.append("")
    return "\n".join(lines)


def ratio(a: float, b: float) -> float | None:
    return round(a / b, 3) if b else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    rounds, seconds = (1, 4.0) if args.quick else (3, 12.0)
    tmp = Path(tempfile.mkdtemp(prefix="gw-bench-workers-"))
    procs: list[Proc] = []
    load: LoadWorker | None = None
    cpu0 = cpu_times()
    try:
        up, up_port = start_upstream(16)
        procs.append(up)
        config = tmp / "gateway.yaml"
        write_config(config, up_port, "warning", {"bench": "fake", "mock": ("mock", "mock")})
        one, port1, pids1 = start(config, tmp / "gateway-1.log", 1)
        procs.append(one)
        two, port2, pids2 = start(config, tmp / "gateway-2.log", 2)
        procs.append(two)
        load = LoadWorker()
        procs.append(load.proc)
        pids = {"upstream": up.pid, "gw1": pids1[0]}
        pids.update({f"gw2_{i}": pid for i, pid in enumerate(pids2)})  # gw2_0: the supervisor
        group1, group2 = ["gw1"], [f"gw2_{i}" for i in range(len(pids2))]
        gw_body = {"model": "bench", "input": PROMPT, "store": False}
        direct = {"model": "fake", "messages": [{"role": "user", "content": PROMPT}]}
        fake = measure(
            load,
            {
                "direct": target(up_port, "/v1/chat/completions", direct),
                "1 worker": target(port1, "/v1/responses", gw_body),
                "2 workers": target(port2, "/v1/responses", gw_body),
            },
            pids,
            rounds,
            seconds,
        )
        mock_body = {"model": "mock", "input": PROMPT, "store": False}
        mock = measure(
            load,
            {
                "1 worker": target(port1, "/v1/responses", mock_body),
                "2 workers": target(port2, "/v1/responses", mock_body),
            },
            pids,
            rounds,
            seconds * 2 / 3,
        )
        groups = {"direct": [], "1 worker": group1, "2 workers": group2}
        r: dict[str, Any] = {
            "meta": {
                "time": dt.datetime.now(dt.UTC).isoformat(),
                "cpus": os.cpu_count(),
                "rounds": rounds,
                "seconds_per_target": seconds,
                "concurrency": CONCURRENCY,
            },
            "fake": figures(fake, groups),
            "mock": figures(mock, groups),
            "raw": {"fake": fake, "mock": mock},
        }
        f, m = r["fake"], r["mock"]
        r["ratios"] = {
            "fake": {
                "2 workers / 1 worker, req/s": ratio(f["2 workers"]["rps"], f["1 worker"]["rps"]),
                "1 worker / direct, req/s": ratio(f["1 worker"]["rps"], f["direct"]["rps"]),
                "2 workers / direct, req/s": ratio(f["2 workers"]["rps"], f["direct"]["rps"]),
                "2 workers / 1 worker, gateway CPU per request": ratio(
                    f["2 workers"]["gateway_cpu_ms_per_request"], f["1 worker"]["gateway_cpu_ms_per_request"]
                ),
            },
            "mock": {
                "2 workers / 1 worker, req/s": ratio(m["2 workers"]["rps"], m["1 worker"]["rps"]),
                "2 workers / 1 worker, gateway CPU per request": ratio(
                    m["2 workers"]["gateway_cpu_ms_per_request"], m["1 worker"]["gateway_cpu_ms_per_request"]
                ),
            },
        }
        r["machine_cpu_percent"] = machine_share(cpu0, cpu_times())
        r["meta"]["loadavg_end"] = os.getloadavg()
    finally:
        if load is not None:
            load.stop()
        for p in reversed(procs):
            p.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"workers-{dt.datetime.now(dt.UTC).strftime('%Y%m%d-%H%M%S')}.json"
    out.write_bytes(orjson.dumps(r, option=orjson.OPT_INDENT_2))
    print(render(r))
    print(f"results: {out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
