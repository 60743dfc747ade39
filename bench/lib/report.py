"""The stdout table of a benchmark run (``python -m bench report bench/results/run-….json`` re-prints one)."""

from __future__ import annotations

import math
import statistics
import sys
from pathlib import Path
from typing import Any

import orjson

AIMS = {
    "added_p50_c1_ms": 1.0,
    "json_rps_c64": 2000.0,
    "events_per_s": 50000.0,
    "peak_rss_mb": 100.0,
    "ws_idle_kib": 50.0,
}


def num(x: Any, digits: int = 2) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    if isinstance(x, float | int) and abs(x) >= 1000:
        return f"{x:,.0f}"
    return f"{x:.{digits}f}"


def signed(x: float | None, digits: int = 2) -> str:
    if x is None or not math.isfinite(x):
        return "-"
    return f"{x:+.{digits}f}"


def ratio(a: float | None, b: float | None) -> str:
    if a is None or b is None or not b or not math.isfinite(a) or not math.isfinite(b):
        return "-"
    return f"{a / b:.2f}x"


def get(d: Any, *path: str) -> Any:
    for p in path:
        if not isinstance(d, dict) or p not in d:
            return None
        d = d[p]
    return d


class Table:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def title(self, text: str) -> None:
        self.lines += ["", text, "-" * len(text)]

    def header(self, *cols: str) -> None:
        self.row(*cols)

    def row(self, label: str, *cols: str) -> None:
        self.lines.append(f"  {label:<34}" + "".join(f"{c:>13}" for c in cols))

    def text(self, line: str) -> None:
        self.lines.append("  " + line)


def _cmp_rows(t: Table, res: dict[str, Any], conc: str, key: str, label: str) -> None:
    for q in ("p50", "p99"):
        d = get(res, "direct", key, q)
        g = get(res, "gateway", key, q)
        added = g - d if d is not None and g is not None else None
        t.row(f"{conc} {label} {q} (ms)", num(d, 3), num(g, 3), signed(added, 3), ratio(g, d))


def _cpu_rows(t: Table, res: dict[str, Any], conc: str, unit: str = "request") -> None:
    """CPU time per request of each process (from /proc, so it does not depend on how busy the machine
    is), and what it implies: requests per second one core could serve."""
    for proc in ("gateway", "upstream", "client"):
        d = get(res, "direct", "cpu_ms_per_request", proc)
        g = get(res, "gateway", "cpu_ms_per_request", proc)
        if proc == "gateway":
            d = None
        t.row(f"{conc} CPU ms/{unit}: {proc}", num(d, 3), num(g, 3), signed(_sub(g, d), 3), ratio(g, d))
    g = get(res, "gateway", "cpu_ms_per_request", "gateway")
    if g:
        t.row(f"{conc} gateway {unit}s per CPU-second", "", num(1000 / g, 0))


def _errors(res: dict[str, Any] | None) -> str:
    if not res:
        return ""
    bad = {k: v.get("errors") for k, v in res.items() if isinstance(v, dict) and v.get("errors")}
    capped = [k for k, v in res.items() if isinstance(v, dict) and v.get("time_capped")]
    hung = {k: v["abandoned"] for k, v in res.items() if isinstance(v, dict) and v.get("abandoned")}
    out = []
    if bad:
        out.append(f"errors: {bad}")
    if capped:
        out.append(f"stopped by the time cap: {', '.join(capped)}")
    if hung:
        out.append(f"requests unanswered at the deadline + grace, abandoned: {hung}")
    return "; ".join(out)


def render(r: dict[str, Any]) -> str:
    t = Table()
    m = r.get("meta", {})
    t.lines.append(
        f"Gateway benchmark ({m.get('mode')}, {m.get('cpus')} CPUs, load average "
        f"{num(get(m, 'loadavg_start') and m['loadavg_start'][0])} -> "
        f"{num(get(m, 'loadavg_end') and m['loadavg_end'][0])}, commit {m.get('commit')}"
        f"{' + uncommitted changes' if m.get('uncommitted_files_in_gateway_adapters') else ''}, "
        f"{m.get('seconds')} s)"
    )
    share = m.get("machine_cpu_percent")
    if share:
        busy = 100 - share.get("idle", 0) - share.get("iowait", 0)
        t.lines.append(
            f"Machine CPUs during the run: {busy:.0f}% busy (user {share.get('user')}%, system "
            f"{share.get('system')}%, softirq {share.get('softirq')}%, steal {share.get('steal')}%) - "
            "other work on the machine competes with all three processes."
        )
    if r.get("gateway_idle_cpu_percent") is not None:
        t.lines.append(
            f"The idle gateway was charged {r['gateway_idle_cpu_percent']}% of a core before the load "
            "(a baseline included in its CPU figures)."
        )
    t.lines.append(
        "Latencies in ms. added = gateway - direct (same request count, interleaved rounds); "
        "ratio = gateway / direct."
    )
    pre = r.get("preflight")
    if pre and any(v != {"200": 1} for v in pre.values()):
        t.lines.append(f"PREFLIGHT FAILED: {pre}")

    cols = ("direct", "gateway", "added", "ratio")
    if "json_c1" in r:
        t.title("JSON (non-streaming) via openai-chat to the fake upstream")
        t.header("", *cols)
        _cmp_rows(t, r["json_c1"], "c=1 ", "latency_ms", "latency")
        _cmp_rows(t, r["json_c64"], "c=64", "latency_ms", "latency")
        d, g = get(r, "json_c64", "direct", "rps"), get(r, "json_c64", "gateway", "rps")
        t.row("c=64 throughput (req/s)", num(d, 0), num(g, 0), "", ratio(g, d))
        _cpu_rows(t, r["json_c1"], "c=1 ")
        _cpu_rows(t, r["json_c64"], "c=64")
        for k in ("json_c1", "json_c64"):
            if e := _errors(r.get(k)):
                t.text(f"{k}: {e}")

    if "sse_c1" in r:
        chunks = get(m, "chunks", "short")
        t.title(
            f"SSE, {chunks} content chunks per stream (first delta: output_text.delta vs first direct chunk)"
        )
        t.header("", *cols)
        _cmp_rows(t, r["sse_c1"], "c=1 ", "first_delta_ms", "first delta")
        _cmp_rows(t, r["sse_c1"], "c=1 ", "latency_ms", "total")
        _cmp_rows(t, r["sse_c64"], "c=64", "first_delta_ms", "first delta")
        _cmp_rows(t, r["sse_c64"], "c=64", "latency_ms", "total")
        d, g = get(r, "sse_c64", "direct", "rps"), get(r, "sse_c64", "gateway", "rps")
        t.row("c=64 streams/s", num(d, 0), num(g, 0), "", ratio(g, d))
        d, g = (
            get(r, "sse_c64", "direct", "events_per_response"),
            get(r, "sse_c64", "gateway", "events_per_response"),
        )
        t.row("events per stream", num(d, 1), num(g, 1))
        _cpu_rows(t, r["sse_c64"], "c=64", "stream")
        for k in ("sse_c1", "sse_c64"):
            if e := _errors(r.get(k)):
                t.text(f"{k}: {e}")

    if "sse_long_c64" in r:
        res = r["sse_long_c64"]
        t.title(f"SSE, {get(m, 'chunks', 'long')} content chunks per stream, c=64 (relayed events)")
        t.header("", *cols)
        for key, label in (
            ("rps", "streams/s"),
            ("events_per_s", "events/s (all)"),
            ("deltas_per_s", "text deltas/s"),
        ):
            d, g = get(res, "direct", key), get(res, "gateway", key)
            t.row(label, num(d, 0), num(g, 0), "", ratio(g, d))
        t.row(
            "events per stream",
            num(get(res, "direct", "events_per_response"), 1),
            num(get(res, "gateway", "events_per_response"), 1),
        )
        _cmp_rows(t, res, "c=64", "first_delta_ms", "first delta")
        _cmp_rows(t, res, "c=64", "latency_ms", "total")
        _cpu_rows(t, res, "c=64", "stream")
        ev, cpu = get(res, "gateway", "events"), get(res, "gateway", "cpu_s", "gateway")
        if ev and cpu:
            t.row("gateway events per CPU-second", "", num(ev / cpu, 0))
        t.text("direct events are upstream chunks (data: lines); gateway events are all SSE events it sent")
        if e := _errors(res):
            t.text(e)

    if "mock_json_c1" in r:
        t.title("Embedded mock model (gateway alone, no upstream)")
        t.row(
            "JSON c=1 latency p50 / p99 (ms)",
            f"{num(get(r, 'mock_json_c1', 'gateway', 'latency_ms', 'p50'), 3)} / "
            f"{num(get(r, 'mock_json_c1', 'gateway', 'latency_ms', 'p99'), 3)}",
        )
        t.row("JSON c=64 requests/s", num(get(r, "mock_json_c64", "gateway", "rps"), 0))
        ml = r.get("mock_sse_long_c64", {}).get("gateway", {})
        t.row("SSE c=64 events/s (all)", num(ml.get("events_per_s"), 0))
        t.row("SSE c=64 text deltas/s", num(ml.get("deltas_per_s"), 0))
        t.row("SSE events per stream", num(ml.get("events_per_response"), 1))
        for key, label in (("mock_json_c64", "JSON requests"), ("mock_sse_long_c64", "SSE events")):
            res = r.get(key, {}).get("gateway", {})
            cpu = get(res, "cpu_s", "gateway")
            n = res.get("events") if "SSE" in label else res.get("requests")
            if cpu and n:
                t.row(f"{label} per gateway CPU-second", num(n / cpu, 0))
        for k in ("mock_json_c1", "mock_json_c64", "mock_sse_long_c64"):
            if e := _errors(r.get(k)):
                t.text(f"{k}: {e}")

    if "per_adapter" in r:
        _per_adapter(t, r["per_adapter"])
    if "chat_ingress" in r:
        _chat_ingress(t, r["chat_ingress"])
    if "messages_ingress" in r:
        mi = r["messages_ingress"]
        _per_adapter(
            t,
            mi,
            title=f"Messages ingress, c=1: POST /v1/messages and POST /v1/responses via the anthropic "
            f"adapter vs the Messages request direct to the fake (SSE: {mi.get('chunks')} chunks)",
        )

    mem = r.get("memory", {})
    if mem:
        t.title("Memory (MB)")
        t.row(
            "gateway RSS after start",
            num(get(mem, "gateway_start_kb", "VmRSS") and mem["gateway_start_kb"]["VmRSS"] / 1024, 1),
        )
        t.row("gateway peak RSS after HTTP+SSE", num(_mb(mem, "gateway_after_http_kb", "VmHWM"), 1))
        t.row("gateway peak RSS at end (incl. WS)", num(_mb(mem, "gateway_end_kb", "VmHWM"), 1))
        t.row("fake upstream peak RSS", num(_mb(mem, "upstream_end_kb", "VmHWM"), 1))
        st = r.get("stored") or {}
        b, a = get(st, "before_kb", "VmRSS"), get(st, "after_kb", "VmRSS")
        if b and a and st.get("completed"):
            t.row(
                f"gateway RSS before / after {st['completed']:,} stored", num(b / 1024, 1), num(a / 1024, 1)
            )
            t.row("KiB of RSS per stored response", num((a - b) / st["completed"], 2))
        t.text("relay stages send store=false; the stored responses are store=true mock JSON answers")

    lim = r.get("limits")
    if isinstance(lim, dict) and lim:
        t.title("Tenancy limits in Redis (loopback): limited vs unlimited tenant, one gateway, mock JSON")
        if "skipped" in lim:
            t.text(f"skipped: {lim['skipped']}")
        else:
            t.header("", "unlimited p50", "limited p50", "added p50 (ms)", "unl. p99", "lim. p99")
            for key in ("c1", "c64"):
                res = lim.get(key) or {}
                u, m = get(res, "unlimited", "latency_ms"), get(res, "limited", "latency_ms")
                t.row(
                    f"c={key[1:]} latency (ms)",
                    num(get(u, "p50"), 3),
                    num(get(m, "p50"), 3),
                    signed(lim.get(f"added_p50_{key}_ms"), 3),
                    num(get(u, "p99"), 3),
                    num(get(m, "p99"), 3),
                )
                if e := _errors(res):
                    t.text(f"c={key[1:]}: {e}")
            t.text("limited: key + tenant RPM, TPM, concurrency and a budget (admit + settle: 2 EVALSHA)")

    if "info_json_c1" in r:
        t.title("With info-level access logs (a second gateway process, log to a file)")
        t.header("", *cols)
        _cmp_rows(t, r["info_json_c1"], "c=1 ", "latency_ms", "latency")
        d, g = get(r, "info_json_c64", "direct", "rps"), get(r, "info_json_c64", "gateway", "rps")
        t.row("c=64 throughput (req/s)", num(d, 0), num(g, 0), "", ratio(g, d))
        t.text(
            f"log lines written: {get(r, 'info_log', 'lines')}; peak RSS "
            f"{num(get(r, 'info_memory_kb', 'VmHWM') and r['info_memory_kb']['VmHWM'] / 1024, 1)} MB"
        )

    agent = r.get("agent")
    ws_added_med = http_added_med = None
    ws_bytes: list[float] = []
    if agent:
        t.title("Agent conversation: WebSocket + previous_response_id vs HTTP replaying the history (SSE)")
        if "skipped" in agent or "error" in agent:
            t.text(str(agent.get("skipped") or agent.get("error")))
        else:
            turns = {k: _per_turn(v) for k, v in agent.items() if not k.endswith("_errors")}
            for k, v in agent.items():
                if k.endswith("_errors"):
                    t.text(f"{k}: {v[0][0].get('error')}")
            t.header(
                "turn", "direct ms", "HTTP ms", "WS ms", "HTTP added", "WS added", "HTTP bytes", "WS bytes"
            )
            n = max((len(v["latency"]) for v in turns.values()), default=0)
            show = sorted({0, 1, 4, 9, 14, n - 1} & set(range(n)))
            lat = {k: v["latency"] for k, v in turns.items()}
            sent = {k: v["sent"] for k, v in turns.items()}
            for i in show:
                dl, hl, wl = (_at(lat, k, i) for k in ("direct", "http", "ws"))
                t.row(
                    str(i + 1),
                    num(dl, 3),
                    num(hl, 3),
                    num(wl, 3),
                    signed(_sub(hl, dl), 3),
                    signed(_sub(wl, dl), 3),
                    num(_at(sent, "http", i), 0),
                    num(_at(sent, "ws", i), 0),
                )
            http_added_med = _median_added(lat, "http")
            ws_added_med = _median_added(lat, "ws")
            ws_bytes = sent.get("ws", [])
            t.row(
                "mean over turns",
                num(_mean(lat.get("direct")), 3),
                num(_mean(lat.get("http")), 3),
                num(_mean(lat.get("ws")), 3),
                signed(_mean_added(lat, "http"), 3),
                signed(_mean_added(lat, "ws"), 3),
                num(_mean(sent.get("http")), 0),
                num(_mean(sent.get("ws")), 0),
            )
            t.row(
                "median over turns",
                num(_median(lat.get("direct")), 3),
                num(_median(lat.get("http")), 3),
                num(_median(lat.get("ws")), 3),
                signed(_median_added(lat, "http"), 3),
                signed(_median_added(lat, "ws"), 3),
                num(_median(sent.get("http")), 0),
                num(_median(sent.get("ws")), 0),
            )
            reps = {k: len(v) for k, v in agent.items()}
            t.text(
                f"median per turn over {reps} conversations; bytes = what the client sends per turn "
                "(HTTP: request incl. headers; WS: frame incl. header and mask)"
            )
            okc = {
                k: sum(x["ok"] for rep in v for x in rep)
                for k, v in agent.items()
                if not k.endswith("_errors")
            }
            t.text(f"successful turns: {okc}")

    idle = r.get("ws_idle")
    per_conn_kib = None
    if idle:
        t.title("Idle WebSocket connections")
        if "error" in idle:
            t.text(idle["error"])
        else:
            opened = get(idle, "open", "open") or 0
            before = get(idle, "gateway_before_kb", "VmRSS")
            during = get(idle, "gateway_during_kb", "VmRSS")
            if opened and before is not None and during is not None:
                per_conn_kib = (during - before) / opened
            t.row("connections open", str(opened), f"(errors {get(idle, 'open', 'errors')})")
            t.row(
                "gateway RSS before / with them (MB)",
                num(before and before / 1024, 1),
                num(during and during / 1024, 1),
            )
            t.row("RSS per idle connection (KiB)", num(per_conn_kib, 1))
            t.row("gateway fds with them open", str(idle.get("gateway_fds_during")))

    busy = [k for k, v in (r.get("settle_seconds") or {}).items() if v is None]
    if busy:
        t.lines.append("")
        t.lines.append(
            "Note: the gateway was still busy (>25% of a core) with the leftovers of the previous stage "
            f"(abandoned requests) when these began: {', '.join(busy)}."
        )
    for restart in r.get("gateway_restarts") or []:
        t.lines.append(f"Note: the gateway died and was restarted before {restart['before']}.")

    # aims
    t.title("Aims (issue 2 / issue 4)")
    t.header("", "measured", "aim", "met")
    added = _sub(
        get(r, "json_c1", "gateway", "latency_ms", "p50"), get(r, "json_c1", "direct", "latency_ms", "p50")
    )
    peak = _mb(mem, "gateway_after_http_kb", "VmHWM")
    checks = [
        ("added p50 JSON c=1 (ms)", added, AIMS["added_p50_c1_ms"], "<"),
        ("JSON req/s c=64 (gateway)", get(r, "json_c64", "gateway", "rps"), AIMS["json_rps_c64"], ">="),
        (
            "relayed events/s c=64 (gateway)",
            get(r, "sse_long_c64", "gateway", "events_per_s"),
            AIMS["events_per_s"],
            ">=",
        ),
        ("peak RSS after HTTP+SSE (MB)", peak, AIMS["peak_rss_mb"], "<"),
        ("KiB per idle WebSocket", per_conn_kib, AIMS["ws_idle_kib"], "<"),
    ]
    for label, value, aim, op in checks:
        met = "-" if value is None else ("yes" if (value < aim if op == "<" else value >= aim) else "NO")
        t.row(label, num(value, 2), f"{op} {num(aim, 0)}", met)
    if ws_added_med is not None and http_added_med is not None:
        t.row(
            "WS added/turn < HTTP (median, ms)",
            f"{ws_added_med:.3f}",
            f"< {http_added_med:.3f}",
            "yes" if ws_added_med < http_added_med else "NO",
        )
    if len(ws_bytes) >= 2:
        growth = ws_bytes[-1] / ws_bytes[1]
        t.row("WS bytes turn 20 / turn 2", f"{growth:.2f}", "~ 1.00", "yes" if growth < 1.1 else "NO")
    return "\n".join(t.lines)


def _per_adapter(t: Table, pa: dict[str, Any], title: str | None = None) -> None:
    """Issue 6: one row per adapter; gateway (a model routed through the adapter) vs direct (the
    adapter's native request sent straight to the fake), c=1. ``title``: another table of the same
    shape (issue 24's, one row per ingress)."""
    t.title(
        title
        or f"Per adapter, c=1: gateway via each adapter vs the native request direct to the fake "
        f"(SSE: {pa.get('chunks')} chunks)"
    )
    cols = ("direct p50", "gateway p50", "added p50", "ratio", "added p99")
    sections = (
        ("json_c1", "latency_ms", "JSON latency (ms)", "request"),
        ("sse_c1", "first_delta_ms", "SSE first delta (ms)", None),
        ("sse_c1", "latency_ms", "SSE total (ms)", "stream"),
    )
    for key, metric, label, cpu_unit in sections:
        res = pa.get(key)
        if not isinstance(res, dict):
            continue
        if "error" in res:
            t.text(f"{label}: {res['error']}")
            continue
        json_rows = key == "json_c1"
        t.header(label, *cols, "gw CPU ms" if cpu_unit else "", "upstream" if json_rows else "")
        for kind, pair in res.items():
            call = get(pa, "check", kind, "json gateway answer", "upstream_call") if json_rows else None
            d50, g50 = get(pair, "direct", metric, "p50"), get(pair, "gateway", metric, "p50")
            d99, g99 = get(pair, "direct", metric, "p99"), get(pair, "gateway", metric, "p99")
            cpu = get(pair, "gateway", "cpu_ms_per_request", "gateway") if cpu_unit else None
            t.row(
                f"  {kind}",
                num(d50, 3),
                num(g50, 3),
                signed(_sub(g50, d50), 3),
                ratio(g50, d50),
                signed(_sub(g99, d99), 3),
                num(cpu, 3) if cpu_unit else "",
                call or "",
            )
    for key in ("json_c1", "sse_c1"):
        res = pa.get(key)
        if isinstance(res, dict) and "error" not in res:
            for kind, pair in res.items():
                if e := _errors(pair):
                    t.text(f"{key} {kind}: {e}")
    sse = pa.get("sse_c1")
    if isinstance(sse, dict) and "error" not in sse:
        events = ", ".join(
            f"{kind} {num(get(pair, 'direct', 'events_per_response'), 0)}"
            f"/{num(get(pair, 'gateway', 'events_per_response'), 0)}"
            for kind, pair in sse.items()
        )
        t.text(f"events per stream direct/gateway: {events}")
    for kind, problem in (pa.get("skipped") or {}).items():
        t.text(f"{kind} LEFT OUT (its check failed): {problem}")
    t.text(
        "gw CPU ms = gateway CPU per request (JSON) / per stream (SSE). upstream = the call the "
        "adapter made for a JSON client (json: one unstreamed reply; stream: 16 chunks); direct JSON "
        "is always the format's unstreamed call."
    )


def _chat_ingress(t: Table, ci: dict[str, Any]) -> None:
    """The Chat Completions ingress and the Responses route to the same upstream, each against the
    direct upstream (what each adds), c=1."""
    t.title("Chat Completions ingress vs the Responses route, openai-chat upstream, c=1")
    t.header("", "direct", "responses", "chat", "chat added", "resp added")
    for key, label, metric in (
        ("json_c1", "JSON latency", "latency_ms"),
        ("sse_c1", "SSE first delta", "first_delta_ms"),
        ("sse_c1", "SSE total", "latency_ms"),
    ):
        for q in ("p50", "p99"):
            d = get(ci, key, "direct", metric, q)
            resp = get(ci, key, "responses", metric, q)
            chat = get(ci, key, "gateway", metric, q)
            t.row(
                f"{label} {q} (ms)",
                num(d, 3),
                num(resp, 3),
                num(chat, 3),
                signed(_sub(chat, d), 3),
                signed(_sub(resp, d), 3),
            )
    for key in ("json_c1", "sse_c1"):
        resp = get(ci, key, "responses", "cpu_ms_per_request", "gateway")
        chat = get(ci, key, "gateway", "cpu_ms_per_request", "gateway")
        t.row(f"{key} gateway CPU ms/request", "", num(resp, 3), num(chat, 3))
        if e := _errors(ci.get(key)):
            t.text(f"chat ingress {key}: {e}")


def _mb(mem: dict[str, Any], key: str, field: str) -> float | None:
    v = get(mem, key, field)
    return v / 1024 if v is not None else None


def _per_turn(reps: list[list[dict[str, Any]]]) -> dict[str, list[float]]:
    n = min(len(rep) for rep in reps) if reps else 0
    lat = [statistics.median(rep[i]["latency"] for rep in reps) * 1000 for i in range(n)]
    sent = [reps[0][i]["sent"] for i in range(n)]
    return {"latency": lat, "sent": sent}


def _at(d: dict[str, list[float]], k: str, i: int) -> float | None:
    v = d.get(k)
    return v[i] if v is not None and i < len(v) else None


def _sub(a: float | None, b: float | None) -> float | None:
    return a - b if a is not None and b is not None else None


def _mean(xs: list[float] | None) -> float | None:
    return sum(xs) / len(xs) if xs else None


def _median(xs: list[float] | None) -> float | None:
    return statistics.median(xs) if xs else None


def _median_added(lat: dict[str, list[float]], k: str) -> float | None:
    a, d = lat.get(k), lat.get("direct")
    if not a or not d:
        return None
    return statistics.median(x - y for x, y in zip(a, d, strict=False))


def _mean_added(lat: dict[str, list[float]], k: str) -> float | None:
    a, d = lat.get(k), lat.get("direct")
    if not a or not d:
        return None
    n = min(len(a), len(d))
    return sum(a[i] - d[i] for i in range(n)) / n


def main(argv: list[str]) -> int:
    for path in argv:
        print(render(orjson.loads(Path(path).read_bytes())))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
