"""Observability overhead: tracing off vs on vs metrics scraped, against the direct upstream and the
gateway before observability (the merge base), in the same run.

Targets, interleaved in rounds by the load generator (``bench/lib/load.py``) with equal request counts:

* ``direct``: the fake upstream itself (``bench/lib/upstream.py``), the baseline of every ratio;
* ``before``: the gateway at ``--base`` (default: the merge base with ``main``, exported with
  ``git archive``: the code without this branch's observability);
* ``off``: this gateway, tracing off (metrics are always recorded, never scraped here);
* ``tracing``: this gateway, tracing on, every span exported over OTLP/HTTP in batches to a
  receiver in this process (it decodes nothing, answers 200);
* ``scraped``: this gateway in multiprocess mode (``PROMETHEUS_MULTIPROC_DIR`` set: every sample is
  written to a file, as with ``serve --workers``), /metrics scraped once a second during the load.

    python -m bench overhead            # about 3 minutes
    python -m bench overhead --quick    # about a minute

Prints a table and writes ``bench/results/overhead-<UTC time>.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import http.server
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import orjson

from bench.lib.procs import HOST, RESULTS, ROOT, LoadWorker, free_port, http_get, start_upstream

PROMPT = "Say hello in one short sentence."
CHUNKS = 16
NAMES = ("direct", "before", "off", "tracing", "scraped")
SSE = {"marker": "event: response.output_text.delta\n", "events": "\nevent: "}
DIRECT_SSE = {"marker": '"content":"tok ', "events": "\ndata: {"}


class Receiver(http.server.ThreadingHTTPServer):
    """A stand-in OTLP/HTTP collector: reads each export, answers 200, counts bytes."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__((HOST, 0), _Handler)
        self.exports = 0
        self.bytes = 0


class _Handler(http.server.BaseHTTPRequestHandler):
    server: Receiver
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        n = int(self.headers.get("content-length", "0"))
        self.rfile.read(n)
        self.server.exports += 1
        self.server.bytes += n
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


class Gateway:
    """One gateway process (``cwd``: the source tree it runs), stopped by ``stop``."""

    def __init__(self, name: str, cwd: Path, config: Path, env: dict[str, str], log: Path) -> None:
        self.name = name
        self.port = free_port()
        with log.open("wb") as out:
            self.popen = subprocess.Popen(
                [sys.executable, "-m", "gateway", "serve", "--config", str(config), "--port", str(self.port)],
                cwd=cwd,
                env=env,
                stdout=out,
                stderr=out,
            )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.popen.poll() is not None:
                raise RuntimeError(f"{name}: the gateway exited:\n{log.read_text()[-2000:]}")
            with contextlib.suppress(OSError):
                if http_get(self.port, "/healthz")[0] == 200:
                    return
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"{name}: the gateway did not start")

    @property
    def pid(self) -> int:
        return self.popen.pid

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(15)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(5)


def config_text(upstream_port: int, extra: str = "") -> str:
    return (
        "log:\n  level: warning\n"
        "providers:\n  up:\n    kind: openai-chat\n"
        f"    base_url: http://{HOST}:{upstream_port}/v1\n    api_key: sk-bench\n"
        "models:\n  bench: {provider: up, upstream_model: fake}\n"
        f"  bench-sse: {{provider: up, upstream_model: fake-{CHUNKS}}}\n" + extra
    )


def clean_env(**extra: str) -> dict[str, str]:
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("GATEWAY_", "OTEL_", "PROMETHEUS_"))}
    return {**keep, "PYTHONDONTWRITEBYTECODE": "1", **extra}


def export_base(ref: str, into: Path) -> str:
    """The source tree at ``ref`` (default: the merge base with main) in ``into``; its commit."""
    if ref == "merge-base":
        ref = subprocess.run(
            ["git", "merge-base", "HEAD", "main"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
    archive = subprocess.run(["git", "archive", ref], cwd=ROOT, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return ref


class Scraper(threading.Thread):
    """GET /metrics every ``interval`` seconds until stopped; counts scrapes and bytes."""

    def __init__(self, port: int, interval: float = 1.0) -> None:
        super().__init__(daemon=True)
        self.port = port
        self.interval = interval
        self.done = threading.Event()
        self.scrapes = 0
        self.bytes = 0

    def run(self) -> None:
        while not self.done.wait(self.interval):
            with contextlib.suppress(OSError):
                status, body = http_get(self.port, "/metrics", timeout=5)
                if status == 200:
                    self.scrapes += 1
                    self.bytes = len(body)


def targets(up: int, gws: dict[str, Gateway], stream: bool) -> dict[str, Any]:
    direct_body: dict[str, Any] = {"model": "fake", "messages": [{"role": "user", "content": PROMPT}]}
    gw_body: dict[str, Any] = {"model": "bench", "input": PROMPT, "store": False}
    if stream:
        direct_body.update(model=f"fake-{CHUNKS}", stream=True, stream_options={"include_usage": True})
        gw_body.update(model="bench-sse", stream=True)
    out = {
        "direct": {
            "port": up,
            "path": "/v1/chat/completions",
            "body": direct_body,
            **(DIRECT_SSE if stream else {}),
        }
    }
    for name, gw in gws.items():
        out[name] = {"port": gw.port, "path": "/v1/responses", "body": gw_body, **(SSE if stream else {})}
    return out


def table(results: dict[str, Any]) -> str:
    lines = []
    for stage, res in results["stages"].items():
        direct = res["direct"]
        lines.append(f"\n{stage}")
        lines.append(
            f"  {'target':<9} {'n':>6} {'p50 ms':>8} {'p99 ms':>8} {'p50/direct':>11} "
            f"{'+p50 vs before':>15} {'rps':>8} {'gw CPU ms/req':>14}"
        )
        before = res.get("before", {}).get("latency_ms", {}).get("p50")
        for name in NAMES:
            r = res.get(name)
            if not r or "latency_ms" not in r:
                continue
            lat = r["latency_ms"]
            if lat.get("n", 0) == 0:
                lines.append(f"  {name:<9} no samples ({r.get('errors')} errors)")
                continue
            ratio = lat["p50"] / direct["latency_ms"]["p50"]
            added = f"{lat['p50'] - before:+.3f}" if before is not None and name != "direct" else "-"
            cpu = r.get("cpu_ms_per_request", {}).get(name)
            cpu_text = f"{cpu:.3f}" if cpu is not None else "-"
            lines.append(
                f"  {name:<9} {lat['n']:>6} {lat['p50']:>8.3f} {lat['p99']:>8.3f} {ratio:>11.3f} "
                f"{added:>15} {r['rps']:>8.0f} {cpu_text:>14}"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--base", default="merge-base", help="the 'before' source: a git ref")
    args = parser.parse_args(argv)
    scale = 0.3 if args.quick else 1.0
    stages = {
        "JSON c=1": (False, 1, int(3000 * scale), 4),
        "SSE 16 chunks c=1": (True, 1, int(2000 * scale), 4),
        "JSON c=32": (False, 32, int(12000 * scale), 3),
    }
    tmp = Path(tempfile.mkdtemp(prefix="gw-overhead-"))
    receiver = Receiver()
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    upstream, up_port = start_upstream(CHUNKS)
    gws: dict[str, Gateway] = {}
    load: LoadWorker | None = None
    results: dict[str, Any] = {"stages": {}}
    try:
        base_dir = tmp / "before"
        base_dir.mkdir()
        results["before_commit"] = export_base(args.base, base_dir)
        plain = tmp / "plain.yaml"
        plain.write_text(config_text(up_port))
        traced = tmp / "traced.yaml"
        traced.write_text(
            config_text(up_port, f"tracing:\n  endpoint: http://{HOST}:{receiver.server_address[1]}\n")
        )
        mp_dir = tmp / "multiproc"
        mp_dir.mkdir()
        gws["before"] = Gateway("before", base_dir, plain, clean_env(), tmp / "before.log")
        gws["off"] = Gateway("off", ROOT, plain, clean_env(), tmp / "off.log")
        gws["tracing"] = Gateway("tracing", ROOT, traced, clean_env(), tmp / "tracing.log")
        gws["scraped"] = Gateway(
            "scraped", ROOT, plain, clean_env(PROMETHEUS_MULTIPROC_DIR=str(mp_dir)), tmp / "scraped.log"
        )
        scraper = Scraper(gws["scraped"].port)
        scraper.start()
        load = LoadWorker()
        pids = {name: gw.pid for name, gw in gws.items()}
        for stage, (stream, concurrency, requests, rounds) in stages.items():
            print(f"{stage}: {requests} requests per target, {rounds} rounds", file=sys.stderr, flush=True)
            cmd = {
                "cmd": "http",
                "concurrency": concurrency,
                "requests": requests,
                "max_seconds": 30 * scale * rounds,
                "rounds": rounds,
                "warmup": 100,
                "match": True,
                "targets": targets(up_port, gws, stream),
                "pids": pids,
            }
            results["stages"][stage] = load.run(cmd, timeout=600)
        scraper.done.set()
        results["scrapes"] = {"count": scraper.scrapes, "last_bytes": scraper.bytes}
        results["otlp"] = {"exports": receiver.exports, "bytes": receiver.bytes}
    finally:
        if load is not None:
            load.stop()
        for gw in gws.values():
            gw.stop()
        upstream.stop()
        receiver.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)
    results["when"] = dt.datetime.now(dt.UTC).isoformat()
    results["cpus"] = os.cpu_count()
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"overhead-{dt.datetime.now(dt.UTC).strftime('%Y%m%d-%H%M%S')}.json"
    out.write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2))
    print(table(results))
    print(f"\nscrapes of 'scraped': {results['scrapes']}; OTLP exports received: {results['otlp']}")
    print(f"before = {results['before_commit'][:12]}; results in {out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
