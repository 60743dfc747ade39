"""The cost of resuming a background response's stream (issue 22): a whole 4,096-event replay.

A ``background: true`` response of ``--deltas`` upstream deltas (one event each: ``merge_deltas:
false``) is made through the gateway and left to finish; then ``GET /v1/responses/{id}?stream=true
&starting_after=0`` replays its log, ``--reps`` times, from the in-process store and from Redis (a
second gateway on ``REDIS_URL``, else 127.0.0.1:6379, else a ``redis-server`` it starts). Measured
per replay: the wall time to the last byte and the gateway's CPU (scheduler ns), against the same
stream read directly from the fake upstream in the same run (the direct baseline: what a client
pays for the generation's own bytes).

    python -m bench resume              # about half a minute
    python -m bench resume --deltas 4096 --reps 5

Prints a table, writes ``bench/results/resume-<UTC time>.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import orjson

from bench.lib.load import cpu_seconds
from bench.lib.procs import HOST, RESULTS, Proc, start_gateway, start_upstream
from bench.lib.redis_server import delete_prefix, redis_url, unique_prefix
from bench.scenarios.relay import config

TIMEOUT = 120.0


def _background(base: str, deltas: int) -> str:
    body = {"model": "relay-long", "input": "Count.", "background": True, "store": True}
    with httpx.Client(base_url=base, timeout=TIMEOUT) as http:
        created = http.post("/v1/responses", json=body).json()
        rid = str(created["id"])
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            status = http.get(f"/v1/responses/{rid}").json()["status"]
            if status not in ("queued", "in_progress"):
                if status != "completed":
                    raise RuntimeError(f"the background response ended {status}")
                return rid
            time.sleep(0.05)
    raise RuntimeError("the background response did not finish")


def _replay(base: str, rid: str, pid: int) -> tuple[float, float, int, int]:
    """(wall seconds, gateway CPU seconds, events, bytes) of one whole replay."""
    chunks: list[bytes] = []
    cpu0, t0 = cpu_seconds(pid), time.perf_counter()
    with (
        httpx.Client(base_url=base, timeout=TIMEOUT) as http,
        http.stream("GET", f"/v1/responses/{rid}", params={"stream": "true", "starting_after": 0}) as reply,
    ):
        chunks.extend(reply.iter_bytes())
    wall, cpu = time.perf_counter() - t0, cpu_seconds(pid) - cpu0
    body = b"".join(chunks)
    events = sum(1 for line in body.split(b"\n") if line.startswith(b"data: {"))
    return wall, cpu, events, len(body)


def _direct(up_port: int, deltas: int) -> float:
    body = {"model": f"fake-{deltas}", "messages": [{"role": "user", "content": "Count."}], "stream": True}
    t0 = time.perf_counter()
    with (
        httpx.Client(timeout=TIMEOUT) as http,
        http.stream("POST", f"http://{HOST}:{up_port}/v1/chat/completions", json=body) as reply,
    ):
        for _ in reply.iter_bytes():
            pass
    return time.perf_counter() - t0


def measure(name: str, cfg: str, up_port: int, args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    path = scratch / f"{name}.yaml"
    path.write_text(cfg)
    proc: Proc
    proc, port = start_gateway(path, scratch / f"{name}.log")
    try:
        base = f"http://{HOST}:{port}"
        rid = _background(base, args.deltas)
        _replay(base, rid, proc.popen.pid)  # warm-up
        runs = [_replay(base, rid, proc.popen.pid) for _ in range(args.reps)]
    finally:
        proc.stop()
    _direct(up_port, args.deltas)  # warm-up
    direct = [_direct(up_port, args.deltas) for _ in range(args.reps)]
    wall = statistics.median(r[0] for r in runs)
    return {
        "store": name,
        "events": runs[0][2],
        "bytes": runs[0][3],
        "replay_ms_p50": wall * 1000,
        "gateway_cpu_ms_p50": statistics.median(r[1] for r in runs) * 1000,
        "direct_stream_ms_p50": statistics.median(direct) * 1000,
        "replay_over_direct": wall / statistics.median(direct),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench resume", description=__doc__.split("\n")[0])
    parser.add_argument("--deltas", type=int, default=4096, help="upstream deltas, one event each (4096)")
    parser.add_argument("--reps", type=int, default=5, help="replays measured per store (5)")
    args = parser.parse_args(argv)
    rows = []
    up, up_port = start_upstream(args.deltas)
    try:
        with tempfile.TemporaryDirectory(prefix="bench-resume-") as tmp, contextlib.ExitStack() as stack:
            scratch = Path(tmp)
            base_cfg = config(up_port, 8, args.deltas, False)
            rows.append(measure("memory", base_cfg, up_port, args, scratch))
            url = stack.enter_context(redis_url())
            prefix = unique_prefix()
            stack.callback(delete_prefix, url, prefix)
            redis_cfg = base_cfg + f"state:\n  redis_url: {url}\n  key_prefix: {prefix}\n"
            rows.append(measure("redis", redis_cfg, up_port, args, scratch))
    finally:
        up.stop()
    print(f"{'store':<8} {'events':>7} {'KB':>7} {'replay ms':>10} {'gw CPU ms':>10}", end="")
    print(f" {'direct ms':>10} {'x direct':>9}")
    for r in rows:
        print(
            f"{r['store']:<8} {r['events']:>7} {r['bytes'] / 1024:>7.0f} {r['replay_ms_p50']:>10.1f}"
            f" {r['gateway_cpu_ms_p50']:>10.1f} {r['direct_stream_ms_p50']:>10.1f}"
            f" {r['replay_over_direct']:>9.2f}"
        )
    RESULTS.mkdir(exist_ok=True)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    out = RESULTS / f"resume-{stamp}.json"
    out.write_bytes(orjson.dumps({"args": vars(args), "rows": rows}))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
