"""Gateway benchmark: the gateway against the direct upstream, measured in the same run.

Three processes on loopback (plus a fourth for a few stages): the fake upstream
(``bench/lib/upstream.py``, speaking Chat Completions, Responses, Anthropic Messages and Gemini), the
gateway (``python -m gateway serve``, one uvicorn worker) routing models to it through the
``openai-chat`` adapter (and, in the per-adapter stage, through each of the four HTTP adapters), and
the load generator (``bench/lib/load.py``), which sends the same load to the fake directly (the baseline)
and through the gateway, interleaved in rounds. Figures are reported as absolute numbers and as
gateway-vs-direct differences/ratios, because this 2-core machine is shared and noisy.

    python -m bench run            # full run, about 4-5 minutes
    python -m bench run --quick    # about 1 minute, fewer requests
    python -m bench run --profile  # also py-spy profiles of the gateway under load (+~1 min)
    python -m bench run --profile-only  # only the profiles (~2 min)

Output: a table on stdout and ``bench/results/run-<UTC time>.json``. See bench/README.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from bench.lib import report
from bench.lib.load import cpu_seconds
from bench.lib.procs import (
    ADAPTER_PROVIDERS,
    RESULTS,
    ROOT,
    LoadWorker,
    Proc,
    cpu_times,
    fd_count,
    free_port,
    http_get,
    http_request,
    machine_share,
    proc_status,
    start_gateway,
    start_upstream,
    write_config,
)
from bench.lib.spy import Recorder, format_summary, summarize

PROMPT = "Say hello in one short sentence."
SHORT_CHUNKS = 16  # content chunks of an ordinary stream
LONG_CHUNKS = 500  # content chunks of a long stream (relayed events per second)
AGENT_CHUNKS = 32  # content chunks of each text answer in the agent conversation
MOCK_LONG_TEXT = "x" * (4 * LONG_CHUNKS - len("Hello! You said: "))  # mock: 4 characters per chunk

ADAPTERS = tuple(ADAPTER_PROVIDERS)  # openai-chat, openai-responses, anthropic, gemini

GATEWAY_MODELS: dict[str, str | tuple[str, str]] = {
    "bench": "fake",  # JSON (the fake's default stream length applies if the adapter streams upstream)
    "bench-sse": f"fake-{SHORT_CHUNKS}",
    "bench-long": f"fake-{LONG_CHUNKS}",
    "bench-agent": ("up-merged", f"fake-{AGENT_CHUNKS}"),  # the default merge_deltas (procs.py)
    "mock": ("mock", "mock"),  # the built-in model is served beside providers only when listed
}
for _kind, (_provider, _) in ADAPTER_PROVIDERS.items():  # the per-adapter stage
    GATEWAY_MODELS[f"adapter-{_kind}"] = (_provider, "fake")
    GATEWAY_MODELS[f"adapter-{_kind}-sse"] = (_provider, f"fake-{SHORT_CHUNKS}")

# Byte patterns the load generator counts (see bench/lib/load.py).
GW_SSE = {
    "marker": "event: response.output_text.delta\n",
    "events": "\nevent: ",
    "deltas": "event: response.output_text.delta\n",
}
# The Messages ingress's stream: Anthropic's events, the gateway's own (the same patterns as direct).
GW_MESSAGES_SSE = {"marker": '"type":"text_delta"', "events": "\nevent: ", "deltas": '"type":"text_delta"'}
DIRECT_SSE = {"marker": '"content":"tok ', "events": "\ndata: {", "deltas": '"content":"tok '}
# The direct baseline of each adapter's native format: the marker matches its first text delta.
DIRECT_SSE_BY_ADAPTER = {
    "openai-chat": DIRECT_SSE,
    "openai-responses": {
        "marker": "event: response.output_text.delta\n",
        "events": "\nevent: ",
        "deltas": "event: response.output_text.delta\n",
    },
    "anthropic": {"marker": '"type":"text_delta"', "events": "\nevent: ", "deltas": '"type":"text_delta"'},
    "gemini": {"marker": '{"text":"tok "}', "events": "\ndata: {", "deltas": '{"text":"tok "}'},
}


@dataclass(frozen=True)
class Stage:
    requests: int
    seconds: float  # cap for the first (gateway) target, over all rounds
    rounds: int = 2
    warmup: int = 50


@dataclass(frozen=True)
class Plan:
    json_c1: Stage
    json_c64: Stage
    sse_c1: Stage
    sse_c64: Stage
    sse_long_c64: Stage
    mock_json_c1: Stage
    mock_json_c64: Stage
    mock_sse_long_c64: Stage
    info_json_c1: Stage
    info_json_c64: Stage
    adapter_json_c1: Stage  # per adapter: every adapter's gateway and direct targets, interleaved
    adapter_sse_c1: Stage
    agent_reps: int
    agent_turns: int
    ws_idle: int
    profile_seconds: float
    stored: int  # store=true requests of the stored-responses stage
    limits_c1: Stage  # tenancy limits in Redis vs none, one gateway, mock JSON
    limits_c64: Stage
    settle_seconds: float  # at most this long waiting for the gateway to go idle before a stage


FULL = Plan(
    json_c1=Stage(3000, 10, rounds=2, warmup=100),
    json_c64=Stage(30000, 12, rounds=2, warmup=256),
    sse_c1=Stage(2000, 8, rounds=2, warmup=50),
    sse_c64=Stage(10000, 10, rounds=2, warmup=128),
    sse_long_c64=Stage(2000, 12, rounds=2, warmup=64),
    mock_json_c1=Stage(2000, 4, rounds=1, warmup=100),
    mock_json_c64=Stage(20000, 6, rounds=1, warmup=256),
    mock_sse_long_c64=Stage(2000, 6, rounds=1, warmup=64),
    info_json_c1=Stage(1500, 6, rounds=2, warmup=100),
    info_json_c64=Stage(20000, 8, rounds=2, warmup=256),
    adapter_json_c1=Stage(1500, 4, rounds=2, warmup=50),
    adapter_sse_c1=Stage(1000, 4, rounds=2, warmup=30),
    agent_reps=5,
    agent_turns=20,
    ws_idle=1000,
    stored=10_000,
    limits_c1=Stage(2000, 6, rounds=2, warmup=100),
    limits_c64=Stage(16000, 8, rounds=2, warmup=256),
    profile_seconds=8,
    settle_seconds=4,
)


QUICK = Plan(
    json_c1=Stage(800, 3, rounds=1, warmup=50),
    json_c64=Stage(8000, 3, rounds=1, warmup=128),
    sse_c1=Stage(500, 2, rounds=1, warmup=20),
    sse_c64=Stage(3000, 2, rounds=1, warmup=64),
    sse_long_c64=Stage(500, 3, rounds=1, warmup=64),
    mock_json_c1=Stage(500, 1.5, rounds=1, warmup=50),
    mock_json_c64=Stage(5000, 2, rounds=1, warmup=128),
    mock_sse_long_c64=Stage(500, 2, rounds=1, warmup=64),
    info_json_c1=Stage(0, 0),
    info_json_c64=Stage(0, 0),
    adapter_json_c1=Stage(300, 1, rounds=1, warmup=20),
    adapter_sse_c1=Stage(200, 1, rounds=1, warmup=20),
    agent_reps=2,
    agent_turns=20,
    ws_idle=250,
    stored=3000,
    limits_c1=Stage(800, 2, rounds=2, warmup=50),
    limits_c64=Stage(6000, 3, rounds=2, warmup=128),
    profile_seconds=4,
    settle_seconds=2,
)


def direct_json() -> dict[str, Any]:
    return {"model": "fake", "messages": [{"role": "user", "content": PROMPT}]}


def direct_sse(chunks: int) -> dict[str, Any]:
    return {
        "model": f"fake-{chunks}",
        "messages": [{"role": "user", "content": PROMPT}],
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def direct_native(kind: str, stream: bool, chunks: int = SHORT_CHUNKS) -> tuple[str, dict[str, Any]]:
    """(path, body) of the request an adapter of ``kind`` makes, in that provider's format, for sending
    straight to the fake: non-streaming for JSON (like ``direct_json``), else ``chunks`` content chunks."""
    model = f"fake-{chunks}" if stream else "fake"
    if kind == "openai-chat":
        return "/v1/chat/completions", direct_sse(chunks) if stream else direct_json()
    if kind == "gemini":  # the model and the streaming choice are in the path
        method = "streamGenerateContent?alt=sse" if stream else "generateContent"
        body: dict[str, Any] = {"contents": [{"role": "user", "parts": [{"text": PROMPT}]}]}
        return f"/v1beta/models/{model}:{method}", body
    if kind == "openai-responses":
        path, body = "/v1/responses", {"model": model, "input": PROMPT, "store": False}
    elif kind == "anthropic":
        messages = [{"role": "user", "content": PROMPT}]
        path, body = "/v1/messages", {"model": model, "max_tokens": 4096, "messages": messages}
    else:
        raise ValueError(f"unknown adapter kind {kind!r}")
    if stream:
        body["stream"] = True
    return path, body


def get_n(summary: dict[str, Any], key: str) -> int:
    """The sample count of one of a load summary's percentile blocks."""
    block = summary.get(key)
    return int(block.get("n", 0)) if isinstance(block, dict) else 0


def gw_body(model: str, stream: bool, text: str = PROMPT, store: bool = False) -> dict[str, Any]:
    """A gateway request. The relay stages send ``store: false`` (what a proxy benchmark
    measures); the stored-responses stage measures what ``store: true`` (the default) holds."""
    body: dict[str, Any] = {"model": model, "input": text, "store": store}
    if stream:
        body["stream"] = True
    return body


def target(
    port: int, path: str, body: dict[str, Any], patterns: dict[str, str] | None = None
) -> dict[str, Any]:
    return {"port": port, "path": path, "body": body, **(patterns or {})}


class GatewayHandle:
    """The gateway process of one configuration, restartable on the same port."""

    def __init__(self, bench: Bench, log_level: str, tag: str, extra: list[str] | None = None) -> None:
        self.bench = bench
        self.tag = tag
        self.config = bench.tmp / f"gateway-{tag}.yaml"
        write_config(self.config, bench.up_port, log_level, GATEWAY_MODELS)
        if extra:
            with self.config.open("a") as f:
                f.write("\n".join(extra) + "\n")
        self.log = bench.tmp / f"gateway-{tag}.log"
        self.port = free_port()
        self.restarts: list[dict[str, Any]] = []
        self.proc = self._start()

    def _start(self) -> Proc:
        proc, _ = start_gateway(self.config, self.log, port=self.port)
        self.bench.procs.append(proc)
        return proc

    @property
    def pid(self) -> int:
        return self.proc.pid

    def ensure(self, stage: str) -> None:
        """Restart the gateway if it died (something outside the benchmark may have killed it)."""
        if self.proc.alive():
            return
        rc = self.proc.popen.returncode
        tail = self.log.read_text(errors="replace")[-800:]
        self.bench.say(f"the gateway ({self.tag}) exited with {rc} before {stage}; restarting it")
        self.restarts.append({"before": stage, "returncode": rc, "log_tail": tail})
        self.log = self.bench.tmp / f"gateway-{self.tag}-{len(self.restarts)}.log"
        self.proc = self._start()

    def stop(self) -> None:
        self.proc.stop()


class Bench:
    def __init__(
        self, plan: Plan, quick: bool, profile: bool, info_logs: bool, profile_only: bool = False
    ) -> None:
        self.plan = plan
        self.quick = quick
        self.profile = profile or profile_only
        self.profile_only = profile_only
        self.info_logs = info_logs
        self.tmp = Path(tempfile.mkdtemp(prefix="gw-bench-"))
        self.procs: list[Proc] = []
        self.load: LoadWorker | None = None
        self.results: dict[str, Any] = {}
        self.stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M%S")
        self.t0 = time.monotonic()
        self.up_port = 0
        self.up_pid = 0

    # -- helpers -------------------------------------------------------------------------------
    def say(self, msg: str) -> None:
        print(f"[{time.monotonic() - self.t0:6.1f}s] {msg}", file=sys.stderr, flush=True)

    def http(
        self,
        name: str,
        stage: Stage,
        concurrency: int,
        gw: GatewayHandle,
        targets: dict[str, Any],
        match: bool = True,
        settle: float | None = None,
    ) -> Any:
        """One paired (or gateway-only) load stage; CPU time of gateway and upstream is measured."""
        assert self.load is not None
        gw.ensure(name)
        waited = self.settle(gw.pid, self.plan.settle_seconds if settle is None else settle)
        self.results.setdefault("settle_seconds", {})[name] = waited
        self.say(f"{name}: concurrency {concurrency}, up to {stage.requests} requests / {stage.seconds:g} s")
        cmd = {
            "cmd": "http",
            "concurrency": concurrency,
            "requests": stage.requests,
            "max_seconds": stage.seconds,
            "rounds": stage.rounds,
            "warmup": stage.warmup,
            "match": match,
            "targets": targets,
            "pids": {"gateway": gw.pid, "upstream": self.up_pid},
        }
        budget = 2 * stage.seconds + 60 * stage.rounds * len(targets) + 30
        try:
            return self.load.run(cmd, timeout=budget)
        except (RuntimeError, TimeoutError) as exc:
            self.say(f"{name}: {exc}")
            return {"error": str(exc)}

    def stored_responses(self, gw: GatewayHandle) -> dict[str, Any]:
        """RSS before and after ``plan.stored`` store=true mock JSON requests (the in-process
        store keeps each one; its default bound is 10,000 entries / 256 MiB)."""
        n = self.plan.stored
        before = proc_status(gw.pid)
        body = gw_body("mock", False, store=True)
        out = self.http(
            f"{n} stored responses",
            Stage(n, 60, rounds=1, warmup=0),
            64,
            gw,
            {"gateway": target(gw.port, "/v1/responses", body)},
        )
        after = proc_status(gw.pid)
        done = get_n(out.get("gateway", {}), "latency_ms") if isinstance(out, dict) else 0
        return {"requests": n, "completed": done, "before_kb": before, "after_kb": after}

    def settle(self, pid: int, limit: float) -> float | None:
        """Wait (at most ``limit`` s) until the gateway is about idle: below 25% of a core over 0.25 s,
        so one stage's leftovers (streams of abandoned requests) do not eat into the next one. (Not
        lower: on this shared VM an idle gateway is charged 5-10% of a core.)"""
        if limit <= 0:
            return 0.0
        start = time.monotonic()
        while time.monotonic() < start + limit:
            before = cpu_seconds(pid)
            time.sleep(0.25)
            if not cpu_seconds(pid) - before > 0.0625:  # also stops on nan (process gone)
                return round(time.monotonic() - start, 2)
        self.say(f"the gateway is still busy after {limit:g} s; going on")
        return None

    def idle_cpu(self, pid: int, seconds: float = 2.0) -> float:
        """The gateway's CPU use while idle, in % of a core (the baseline inside every CPU figure)."""
        before = cpu_seconds(pid)
        time.sleep(seconds)
        return round(100 * (cpu_seconds(pid) - before) / seconds, 1)

    # -- the run -------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        try:
            return self._run()
        finally:
            if self.load is not None:
                self.load.stop()
            for p in reversed(self.procs):
                p.stop()
            shutil.rmtree(self.tmp, ignore_errors=True)  # configs and logs (their tails are in the results)

    def _run(self) -> dict[str, Any]:
        r = self.results
        r["meta"] = self.meta()
        cpu0 = cpu_times()
        up, self.up_port = start_upstream(SHORT_CHUNKS)
        self.up_pid = up.pid
        self.procs.append(up)
        gw = GatewayHandle(self, "warning", "main")
        port, up_port, plan = gw.port, self.up_port, self.plan
        self.say(f"upstream pid {up.pid} port {up_port}; gateway pid {gw.pid} port {port}")
        self.load = LoadWorker()
        self.procs.append(self.load.proc)
        r["memory"] = {"gateway_start_kb": proc_status(gw.pid)}
        r["gateway_idle_cpu_percent"] = self.idle_cpu(gw.pid, 1.0 if self.quick else 2.0)
        chat = "/v1/chat/completions"

        if not self.preflight(port):
            r["memory"]["gateway_end_kb"] = proc_status(gw.pid)
            return r

        gwj = target(port, "/v1/responses", gw_body("bench", False))
        dj = target(up_port, chat, direct_json())
        gwl = target(port, "/v1/responses", gw_body("bench-long", True), GW_SSE)
        mj = target(port, "/v1/responses", gw_body("mock", False))
        ml = target(port, "/v1/responses", gw_body("mock", True, MOCK_LONG_TEXT), GW_SSE)
        if self.profile_only:
            self.profiles(
                gw,
                {
                    "json_c1": (1, gwj),
                    "json_c64": (64, gwj),
                    "sse_long_c64": (64, gwl),
                    "mock_json_c64": (64, mj),
                    "mock_sse_long_c64": (64, ml),
                },
            )
            gw.stop()
            r["meta"]["seconds"] = round(time.monotonic() - self.t0, 1)
            r["meta"]["machine_cpu_percent"] = machine_share(cpu0, cpu_times())
            return r

        # 1. JSON
        r["json_c1"] = self.http("JSON c=1", plan.json_c1, 1, gw, {"gateway": gwj, "direct": dj})
        r["json_c64"] = self.http("JSON c=64", plan.json_c64, 64, gw, {"gateway": gwj, "direct": dj})
        # 2. SSE
        gws = target(port, "/v1/responses", gw_body("bench-sse", True), GW_SSE)
        ds = target(up_port, chat, direct_sse(SHORT_CHUNKS), DIRECT_SSE)
        both = {"gateway": gws, "direct": ds}
        r["sse_c1"] = self.http(f"SSE {SHORT_CHUNKS} chunks c=1", plan.sse_c1, 1, gw, both)
        r["sse_c64"] = self.http(f"SSE {SHORT_CHUNKS} chunks c=64", plan.sse_c64, 64, gw, both)
        dl = target(up_port, chat, direct_sse(LONG_CHUNKS), DIRECT_SSE)
        both = {"gateway": gwl, "direct": dl}
        r["sse_long_c64"] = self.http(f"SSE {LONG_CHUNKS} chunks c=64", plan.sse_long_c64, 64, gw, both)
        # 3. the embedded mock model: gateway alone
        r["mock_json_c1"] = self.http("mock JSON c=1", plan.mock_json_c1, 1, gw, {"gateway": mj})
        r["mock_json_c64"] = self.http("mock JSON c=64", plan.mock_json_c64, 64, gw, {"gateway": mj})
        r["mock_sse_long_c64"] = self.http(
            "mock SSE long c=64", plan.mock_sse_long_c64, 64, gw, {"gateway": ml}
        )
        # 3b. every HTTP adapter against the fake in its own wire format (issue 6)
        r["per_adapter"] = self.per_adapter(gw)
        # 3c. the Chat Completions ingress (issue 24), beside the Responses route and the direct upstream
        r["chat_ingress"] = self.chat_ingress(gw)
        # 3c. the Anthropic Messages ingress (issue 24) beside the Responses route, same upstream
        r["messages_ingress"] = self.messages_ingress(gw)
        r["memory"]["gateway_after_http_kb"] = proc_status(gw.pid)
        r["upstream_stats"] = orjson.loads(http_get(up_port, "/stats")[1])

        # 4. WebSocket (issue 4)
        if (ROOT / "gateway" / "api" / "ws.py").exists():
            self.websocket(gw)
        else:
            r["agent"] = {"skipped": "gateway/api/ws.py does not exist yet"}
        # 4b. what the in-process store holds: store=true responses, up to its entry bound
        r["stored"] = self.stored_responses(gw)
        # 4c. tenancy limits: the limiter's added latency (issue 9)
        r["limits"] = self.limits()
        r["memory"]["gateway_end_kb"] = proc_status(gw.pid)
        r["memory"]["upstream_end_kb"] = proc_status(up.pid)
        r["memory"]["load_end_kb"] = proc_status(self.load.proc.pid)

        # 5. profiles (optional), on the same gateway process, after the measurements
        if self.profile:
            self.profiles(gw, {"json_c64": (64, gwj), "json_c1": (1, gwj), "sse_long_c64": (64, gwl)})
        gw.stop()
        r["gateway_restarts"] = gw.restarts
        r["gateway_log_tail"] = gw.log.read_text(errors="replace")[-1500:]

        # 6. info-level access logs (a second gateway process)
        if self.info_logs and plan.info_json_c1.requests:
            gwi = GatewayHandle(self, "info", "info")
            ij = target(gwi.port, "/v1/responses", gw_body("bench", False))
            r["info_json_c1"] = self.http(
                "info logs: JSON c=1", plan.info_json_c1, 1, gwi, {"gateway": ij, "direct": dj}
            )
            r["info_json_c64"] = self.http(
                "info logs: JSON c=64", plan.info_json_c64, 64, gwi, {"gateway": ij, "direct": dj}
            )
            r["info_memory_kb"] = proc_status(gwi.pid)
            gwi.stop()
            text = gwi.log.read_bytes()
            r["info_log"] = {
                "lines": text.count(b"\n"),
                "bytes": len(text),
                "sample": text[:400].decode(errors="replace"),
                "restarts": gwi.restarts,
            }
        r["meta"]["machine_cpu_percent"] = machine_share(cpu0, cpu_times())
        r["meta"]["seconds"] = round(time.monotonic() - self.t0, 1)
        r["meta"]["loadavg_end"] = os.getloadavg()
        return r

    def limits(self) -> dict[str, Any]:
        """The tenancy limiter's added latency: one gateway process with a Redis on loopback and two
        tenants, ``lim`` (every limit and a budget, set high enough never to refuse: each request
        pays an admission and a settlement, two EVALSHA round trips) and ``free`` (no limits), the
        same mock JSON request (store: false) for both, interleaved in rounds."""
        binary = shutil.which("redis-server")
        if binary is None:
            return {"skipped": "no redis-server on PATH"}
        rport = free_port()
        redis = Proc(
            "redis",
            [binary, "--port", str(rport), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.procs.append(redis)
        time.sleep(0.3)
        gw = GatewayHandle(
            self,
            "warning",
            "limits",
            extra=[
                "auth:",
                "  api_keys:",
                "    - {key: sk-free, tenant: free}",
                "    - {key: sk-lim, tenant: lim, limits: {requests_per_minute: 1000000000}}",
                "tenants:",
                "  lim:",
                "    limits: {requests_per_minute: 1000000000, tokens_per_minute: 1000000000000,",
                "             concurrent_requests: 1000000}",
                "    budget: {tokens: 1000000000000000, period: month}",
                "state:",
                f"  redis_url: redis://127.0.0.1:{rport}/0",
            ],
        )
        body = gw_body("mock", False)
        lim = {**target(gw.port, "/v1/responses", body), "headers": {"Authorization": "Bearer sk-lim"}}
        free = {**target(gw.port, "/v1/responses", body), "headers": {"Authorization": "Bearer sk-free"}}
        out: dict[str, Any] = {}
        for key, stage, c in (("c1", self.plan.limits_c1, 1), ("c64", self.plan.limits_c64, 64)):
            res = self.http(f"limits c={c}", stage, c, gw, {"limited": lim, "unlimited": free})
            out[key] = res
            if isinstance(res, dict) and "limited" in res:
                p50 = [report.get(res, name, "latency_ms", "p50") for name in ("limited", "unlimited")]
                if None not in p50:
                    out[f"added_p50_{key}_ms"] = round(p50[0] - p50[1], 4)
        gw.stop()
        redis.stop()
        return out

    def preflight(self, port: int) -> bool:
        """One request per route, so that a broken route is reported at once, not as a wall of errors."""
        assert self.load is not None
        checks = {
            "bench (openai-chat, JSON)": target(port, "/v1/responses", gw_body("bench", False)),
            "bench-sse (openai-chat, SSE)": target(port, "/v1/responses", gw_body("bench-sse", True), GW_SSE),
            "mock (JSON)": target(port, "/v1/responses", gw_body("mock", False)),
        }
        ok = True
        self.results["preflight"] = {}
        for name, t in checks.items():
            res = self.load.run(
                {"cmd": "http", "concurrency": 1, "requests": 1, "max_seconds": 10, "targets": {"t": t}}, 60
            )["t"]
            good = res["requests"] == 1
            self.results["preflight"][name] = res["statuses"]
            if not good:
                self.say(f"preflight: {name} failed: statuses {res['statuses']}")
                ok = ok and not name.startswith("bench")
        if not ok:
            self.say("the openai-chat route does not work (is adapters/openai_chat finished?); stopping")
        return ok

    def per_adapter(self, gw: GatewayHandle) -> dict[str, Any]:
        """Issue 6: each HTTP adapter's added latency at c=1. For every adapter kind a gateway model
        routed through it to the fake (which answers in that adapter's wire format), against the
        direct baseline: the native request of that format sent straight to the fake. JSON and SSE
        (``SHORT_CHUNKS`` chunks) are one load command each, with all adapters' gateway and direct
        targets interleaved (gateway, direct, next adapter, ...; the same request count for all), so
        that drift on the machine hits every adapter alike."""
        assert self.load is not None
        gw.ensure("per adapter")
        port, up = gw.port, self.up_port
        out: dict[str, Any] = {"adapters": list(ADAPTERS), "chunks": SHORT_CHUNKS, "check": {}, "skipped": {}}
        json_targets: dict[str, Any] = {}
        sse_targets: dict[str, Any] = {}
        for kind in ADAPTERS:
            t = {
                "json gateway": target(port, "/v1/responses", gw_body(f"adapter-{kind}", False)),
                "json direct": target(up, *direct_native(kind, False)),
                "sse gateway": target(port, "/v1/responses", gw_body(f"adapter-{kind}-sse", True), GW_SSE),
                "sse direct": target(up, *direct_native(kind, True), DIRECT_SSE_BY_ADAPTER[kind]),
            }
            problem, out["check"][kind] = self.check_adapter(port, t)
            if problem:
                out["skipped"][kind] = problem
                self.say(f"per adapter: {kind} left out: {problem}")
                continue
            json_targets[f"{kind} gateway"] = t["json gateway"]
            json_targets[f"{kind} direct"] = t["json direct"]
            sse_targets[f"{kind} gateway"] = t["sse gateway"]
            sse_targets[f"{kind} direct"] = t["sse direct"]
        if not json_targets:
            return out
        plan = self.plan
        for key, name, stage, targets in (
            ("json_c1", "per adapter: JSON c=1", plan.adapter_json_c1, json_targets),
            ("sse_c1", f"per adapter: SSE {SHORT_CHUNKS} chunks c=1", plan.adapter_sse_c1, sse_targets),
        ):
            res = self.http(name, stage, 1, gw, targets)
            if "error" in res:
                out[key] = res
                continue
            out[key] = {
                kind: {"gateway": res[f"{kind} gateway"], "direct": res[f"{kind} direct"]}
                for kind in ADAPTERS
                if f"{kind} gateway" in res
            }
        return out

    def chat_ingress(self, gw: GatewayHandle) -> dict[str, Any]:
        """Issue 24: the same conversation by ``POST /v1/chat/completions`` (the Chat Completions
        ingress, to the openai-chat route) and by ``POST /v1/responses``, against the direct
        upstream, at c=1, JSON and SSE (``SHORT_CHUNKS`` chunks), the three targets interleaved in
        one load command each."""
        port, up, chat = gw.port, self.up_port, "/v1/chat/completions"
        out: dict[str, Any] = {"chunks": SHORT_CHUNKS}
        for key, name, stage, targets in (
            (
                "json_c1",
                "chat ingress: JSON c=1",
                self.plan.adapter_json_c1,
                {
                    "gateway": target(port, chat, {**direct_json(), "model": "bench"}),
                    "responses": target(port, "/v1/responses", gw_body("bench", False)),
                    "direct": target(up, chat, direct_json()),
                },
            ),
            (
                "sse_c1",
                f"chat ingress: SSE {SHORT_CHUNKS} chunks c=1",
                self.plan.adapter_sse_c1,
                {
                    "gateway": target(
                        port, chat, {**direct_sse(SHORT_CHUNKS), "model": "bench-sse"}, DIRECT_SSE
                    ),
                    "responses": target(port, "/v1/responses", gw_body("bench-sse", True), GW_SSE),
                    "direct": target(up, chat, direct_sse(SHORT_CHUNKS), DIRECT_SSE),
                },
            ),
        ):
            out[key] = self.http(name, stage, 1, gw, targets)
        return out

    def messages_ingress(self, gw: GatewayHandle) -> dict[str, Any]:
        """Issue 24: ``POST /v1/messages`` through the anthropic adapter against the same request
        sent straight to the fake, beside ``POST /v1/responses`` on the same route: what the
        Messages ingress adds, and whether it adds more than the Responses route does. c=1, JSON and
        SSE (``SHORT_CHUNKS`` chunks), the three targets interleaved in rounds."""
        assert self.load is not None
        gw.ensure("messages ingress")
        port, up = gw.port, self.up_port
        kind = "anthropic"
        out: dict[str, Any] = {"chunks": SHORT_CHUNKS, "check": {}, "skipped": {}}
        _, json_native = direct_native(kind, False)
        _, sse_native = direct_native(kind, True)
        routes = {
            "responses→anthropic": {
                "json gateway": target(port, "/v1/responses", gw_body(f"adapter-{kind}", False)),
                "sse gateway": target(port, "/v1/responses", gw_body(f"adapter-{kind}-sse", True), GW_SSE),
            },
            "messages→anthropic": {
                "json gateway": target(port, "/v1/messages", {**json_native, "model": f"adapter-{kind}"}),
                "sse gateway": target(
                    port, "/v1/messages", {**sse_native, "model": f"adapter-{kind}-sse"}, GW_MESSAGES_SSE
                ),
            },
        }
        direct = {
            "json direct": target(up, *direct_native(kind, False)),
            "sse direct": target(up, *direct_native(kind, True), DIRECT_SSE_BY_ADAPTER[kind]),
        }
        json_targets: dict[str, Any] = {"direct": direct["json direct"]}
        sse_targets: dict[str, Any] = {"direct": direct["sse direct"]}
        for name, t in routes.items():
            res = self.load.run(
                {"cmd": "http", "concurrency": 1, "requests": 1, "max_seconds": 10, "targets": t}, 90
            )
            out["check"][name] = {
                k: {"statuses": v["statuses"], "deltas": v.get("deltas")} for k, v in res.items()
            }
            bad = [k for k, v in res.items() if v["requests"] != 1]
            if bad or res["sse gateway"].get("deltas") != SHORT_CHUNKS:
                out["skipped"][name] = f"check failed: {out['check'][name]}"
                self.say(f"messages ingress: {name} left out: {out['skipped'][name]}")
                continue
            json_targets[name] = t["json gateway"]
            sse_targets[name] = t["sse gateway"]
        plan = self.plan
        for key, label, stage, targets in (
            ("json_c1", "messages ingress: JSON c=1", plan.adapter_json_c1, json_targets),
            ("sse_c1", f"messages ingress: SSE {SHORT_CHUNKS} chunks c=1", plan.adapter_sse_c1, sse_targets),
        ):
            if len(targets) < 2:
                continue
            res = self.http(label, stage, 1, gw, targets)
            if "error" in res:
                out[key] = res
                continue
            out[key] = {
                name: {"gateway": res[name], "direct": res["direct"]} for name in targets if name != "direct"
            }
        return out

    def check_adapter(self, port: int, targets: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """One request per target (and the gateway's JSON answer read), so that a broken route or a
        wrong fake format is reported once instead of measured. Returns (problem or "", details)."""
        assert self.load is not None
        try:
            res = self.load.run(
                {"cmd": "http", "concurrency": 1, "requests": 1, "max_seconds": 10, "targets": targets}, 90
            )
        except (RuntimeError, TimeoutError) as exc:
            return str(exc), {}
        check: dict[str, Any] = {name: {"statuses": v["statuses"]} for name, v in res.items()}
        for name in ("sse gateway", "sse direct"):
            v = res[name]
            check[name].update(
                events=v["events"], deltas=v["deltas"], first_delta_seen=get_n(v, "first_delta_ms") == 1
            )
        problems = [f"{name}: statuses {v['statuses']}" for name, v in res.items() if v["requests"] != 1]
        for name in ("sse gateway", "sse direct"):
            c = check[name]
            if res[name]["requests"] == 1 and (c["deltas"] != SHORT_CHUNKS or not c["first_delta_seen"]):
                seen = c["first_delta_seen"]
                problems.append(f"{name}: {c['deltas']} text deltas, first delta seen: {seen}")
        try:  # the gateway's JSON answer: completed, with the fake's text; which upstream call it made
            before = orjson.loads(http_get(self.up_port, "/stats")[1])
            status, body = http_request(
                port, "POST", "/v1/responses", orjson.dumps(targets["json gateway"]["body"]), timeout=10
            )
            after = orjson.loads(http_get(self.up_port, "/stats")[1])
            calls = [k for k in ("json", "stream") if after[k] > before[k]]
            obj = orjson.loads(body) if status == 200 else {}
            text = "".join(
                c.get("text", "")
                for item in obj.get("output") or []
                for c in item.get("content") or []
                if c.get("type") == "output_text"
            )
            check["json gateway answer"] = {
                "http": status,
                "status": obj.get("status"),
                "text_chars": len(text),
                "usage": obj.get("usage"),
                "upstream_call": "+".join(calls) or "none",  # the adapter's choice for a JSON client
            }
            if status != 200 or obj.get("status") != "completed" or not text:
                problems.append(f"json gateway answer: {check['json gateway answer']} {body[:200]!r}")
        except (OSError, ValueError) as exc:
            problems.append(f"json gateway answer: {exc!r}")
        return "; ".join(problems), check

    def websocket(self, gw: GatewayHandle) -> None:
        assert self.load is not None
        gw.ensure("websocket")
        port = gw.port
        r = self.results
        p = self.plan
        self.say(
            f"agent conversation: {p.agent_turns} turns x {p.agent_reps} (direct, HTTP replay, WebSocket)"
        )
        try:
            r["agent"] = self.load.run(
                {
                    "cmd": "agent",
                    "turns": p.agent_turns,
                    "reps": p.agent_reps,
                    "max_seconds": 60,
                    "direct": {"port": self.up_port, "model": f"fake-{AGENT_CHUNKS}"},
                    "http": {"port": port, "model": "bench-agent"},
                    "ws": {"port": port, "model": "bench-agent", "path": "/v1/responses"},
                },
                timeout=180,
            )
        except (RuntimeError, TimeoutError) as exc:
            r["agent"] = {"error": str(exc)}
        self.say(f"{p.ws_idle} idle WebSocket connections")
        time.sleep(0.5)
        gw.ensure("idle websockets")
        gw_pid = gw.pid
        before = proc_status(gw_pid)
        try:
            opened = self.load.run(
                {"cmd": "ws_idle_open", "port": port, "count": p.ws_idle, "max_seconds": 90}, 120
            )
            time.sleep(1.0)  # let the server side settle
            during = proc_status(gw_pid)
            fds = fd_count(gw_pid)
            closed = self.load.run({"cmd": "ws_idle_close"}, 60)
            time.sleep(0.5)
            r["ws_idle"] = {
                "requested": p.ws_idle,
                "open": opened,
                "closed": closed,
                "gateway_before_kb": before,
                "gateway_during_kb": during,
                "gateway_after_kb": proc_status(gw_pid),
                "gateway_fds_during": fds,
            }
        except (RuntimeError, TimeoutError) as exc:
            r["ws_idle"] = {"error": str(exc)}

    def profiles(self, gw: GatewayHandle, stages: dict[str, tuple[int, dict[str, Any]]]) -> None:
        """py-spy on the gateway during each stage (name: (concurrency, target))."""
        assert self.load is not None
        secs = self.plan.profile_seconds
        out: dict[str, Any] = {}
        for name, (conc, t) in stages.items():
            path = RESULTS / f"profile-{self.stamp}-{name}.txt"
            stage = Stage(10**7, secs + 1, rounds=1, warmup=conc * 2)
            self.say(f"profiling the gateway: {name} for {secs:g} s")
            gw.ensure(f"profile {name}")
            self.settle(gw.pid, 15)  # leftovers of earlier stages must not be in the profile
            rec = Recorder(gw.pid, path, secs)
            time.sleep(0.3)
            load = self.http(f"profile {name}", stage, conc, gw, {"gateway": t}, settle=0)
            err = rec.wait()
            if not path.exists():
                out[name] = {"error": err}
                continue
            summary = summarize(path.read_text())
            out[name] = {"raw": str(path.relative_to(ROOT)), "load": load.get("gateway"), **summary}
        self.results["profile"] = out

    def meta(self) -> dict[str, Any]:
        def git(*args: str) -> str:
            try:
                return subprocess.run(
                    ["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10
                ).stdout.strip()
            except (OSError, subprocess.TimeoutExpired):
                return ""

        return {
            "started_utc": self.stamp,
            "mode": "quick" if self.quick else "full",
            "commit": git("rev-parse", "--short", "HEAD"),
            "uncommitted_files_in_gateway_adapters": len(
                [
                    ln
                    for ln in git("status", "--porcelain", "--", "gateway", "adapters", "state").splitlines()
                    if ln
                ]
            ),
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "loadavg_start": os.getloadavg(),
            "chunks": {"short": SHORT_CHUNKS, "long": LONG_CHUNKS, "agent": AGENT_CHUNKS},
        }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--quick", action="store_true", help="about a minute: fewer requests, no info-log run"
    )
    parser.add_argument("--profile", action="store_true", help="py-spy profiles of the gateway under load")
    parser.add_argument(
        "--profile-only",
        action="store_true",
        help="only the profiles (openai-chat JSON c=1/c=64, SSE c=64, mock JSON/SSE c=64), 12 s each",
    )
    parser.add_argument(
        "--no-info-logs", action="store_true", help="skip the run with info-level access logs"
    )
    parser.add_argument(
        "--output", type=Path, help="JSON results file (default bench/results/run-<time>.json)"
    )
    args = parser.parse_args(argv)
    plan = QUICK if args.quick else FULL
    if args.profile_only:
        plan = dataclasses.replace(plan, profile_seconds=12)
    bench = Bench(plan, args.quick, args.profile, not args.no_info_logs, args.profile_only)
    results = bench.run()
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = args.output or RESULTS / f"run-{bench.stamp}.json"
    out.write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS))
    print(report.render(results))
    if "profile" in results:
        for name, prof in results["profile"].items():
            if "samples" in prof:
                print()
                print(format_summary(f"profile {name} ({prof['raw']})", prof, top=12))
    print(f"\nresults: {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
