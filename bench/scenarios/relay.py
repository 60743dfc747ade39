"""Relay cost (issue 14): what the gateway adds per WebSocket turn and per relayed event, in one run.

Processes: the fake upstream (``bench/lib/upstream.py``), one gateway (``python -m gateway serve``, one
uvicorn worker, ``log.level: warning``) and, when the gateway supports ``merge_deltas``, a second one
with ``merge_deltas: false`` on its provider (one event per upstream delta, however they arrive).
This process is the client (uvloop, raw HTTP/1.1 from ``bench/lib/load.py``, the ``websockets`` client).

* **conversation**: ``--reps`` × a ``--turns``-turn text conversation (a ~1 KB user message per turn,
  ``--answer``-delta answers, ``store: false``), three ways, interleaved per rep (rotating order):
  direct Chat Completions replaying the messages to the fake; the gateway over HTTP+SSE replaying the
  whole history; the gateway over one WebSocket sending only the new message +
  ``previous_response_id``. Per turn: latency (send → terminal event), gateway CPU per turn.
* **long streams**: ``--streams`` × one ``--deltas``-delta answer over SSE and over a WebSocket; the
  gateway's CPU (scheduler ns, ``/proc/PID/task/*/schedstat``) per stream ÷ deltas = CPU µs per
  relayed upstream delta, and the events it sent.

    python -m bench relay            # about a minute
    python -m bench relay --quick    # fewer reps and streams

Prints a table, writes ``bench/results/relay-<UTC time>.json``. See bench/README.md ("relay.py").
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

from bench.lib.load import Conn, Patterns, cpu_seconds, decode_chunked, post, sse_events
from bench.lib.procs import HOST, RESULTS, ROOT, Proc, cpu_times, machine_share, start_gateway, start_upstream

TIMEOUT = 60.0
USER_KB = "Please read this carefully and answer briefly. " * 22  # ~1 KB (1,034 bytes)
_TERMINAL = (b"response.completed", b"response.failed", b"response.incomplete")
_DELTA = b'"type":"response.output_text.delta"'


def user_text(turn: int) -> str:
    return f"Turn {turn}. {USER_KB}"


def config(up_port: int, answer: int, deltas: int, merge: bool | None) -> str:
    """One openai-chat provider on the fake; ``merge``: the provider's ``merge_deltas`` (None: unset)."""
    lines = [
        "log:",
        "  level: warning",
        "providers:",
        "  up:",
        "    kind: openai-chat",
        f"    base_url: http://{HOST}:{up_port}/v1",
        "    api_key: sk-bench",
    ]
    if merge is not None:
        lines.append(f"    merge_deltas: {'true' if merge else 'false'}")
    lines += [
        "models:",
        f"  relay-chat: {{provider: up, upstream_model: fake-{answer}}}",
        f"  relay-long: {{provider: up, upstream_model: fake-{deltas}}}",
    ]
    return "\n".join(lines) + "\n"


def merge_supported() -> bool:
    try:
        from gateway.kernel.settings import ProviderSettings
    except ImportError:
        return False
    return "merge_deltas" in ProviderSettings.model_fields


# -- the conversation -------------------------------------------------------------------------------


async def conv_direct(port: int, model: str, turns: int) -> list[float]:
    conn = await Conn.open(HOST, port)
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are terse."}]
    out = []
    try:
        for t in range(turns):
            messages.append({"role": "user", "content": user_text(t)})
            body = orjson.dumps({"model": model, "messages": messages, "stream": True})
            reply = await asyncio.wait_for(
                conn.request(post(HOST, port, "/v1/chat/completions", body), Patterns(), keep_body=True),
                TIMEOUT,
            )
            if reply.status != 200:
                raise RuntimeError(f"direct: status {reply.status}")
            chunks = sse_events(decode_chunked(reply.body))
            text = "".join(
                ch.get("delta", {}).get("content") or "" for c in chunks for ch in c.get("choices", [])
            )
            messages.append({"role": "assistant", "content": text})
            out.append(reply.latency)
    finally:
        conn.close()
    return out


async def conv_http(port: int, model: str, turns: int) -> list[float]:
    conn = await Conn.open(HOST, port)
    history: list[dict[str, Any]] = []
    out = []
    try:
        for t in range(turns):
            history.append({"type": "message", "role": "user", "content": user_text(t)})
            body = orjson.dumps(
                {
                    "model": model,
                    "instructions": "You are terse.",
                    "input": history,
                    "store": False,
                    "stream": True,
                }
            )
            reply = await asyncio.wait_for(
                conn.request(post(HOST, port, "/v1/responses", body), Patterns(), keep_body=True), TIMEOUT
            )
            events = sse_events(decode_chunked(reply.body)) if reply.status == 200 else []
            done = [e for e in events if e.get("type") == "response.completed"]
            if not done:
                raise RuntimeError(f"http: status {reply.status}, no response.completed")
            history += done[0]["response"]["output"]
            out.append(reply.latency)
    finally:
        conn.close()
    return out


class RawWS(asyncio.Protocol):
    """A minimal WebSocket client, as lean as the raw HTTP client (``bench.lib.load.Conn``), so that
    the client's own per-message cost (the ``websockets`` library's is ~20-30 µs a message) is not
    counted as the gateway's: one upgrade, text frames out (masked with the all-zero key RFC 6455
    allows), server frames parsed by their 2-10 byte headers; ``turn()`` returns the terminal
    event's payload and the number of frames of the turn."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.upgraded = False
        self.waiter: asyncio.Future[Any] | None = None
        self.frames = 0
        self.deltas = 0

    @classmethod
    async def open(cls, port: int) -> RawWS:
        loop = asyncio.get_running_loop()
        _, proto = await loop.create_connection(cls, HOST, port)
        proto.waiter = loop.create_future()
        assert proto.transport is not None
        proto.transport.write(
            f"GET /v1/responses HTTP/1.1\r\nHost: {HOST}:{port}\r\nUpgrade: websocket\r\n"
            "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
            "Sec-WebSocket-Version: 13\r\n\r\n".encode()
        )
        await asyncio.wait_for(proto.waiter, TIMEOUT)
        return proto

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(ConnectionError("websocket closed"))

    def turn(self, text: bytes) -> asyncio.Future[Any]:
        n = len(text)
        head = bytes((0x81, 0x80 | n)) if n < 126 else b"\x81\xfe" + n.to_bytes(2, "big")
        if n >= 65536:
            head = b"\x81\xff" + n.to_bytes(8, "big")
        self.waiter = asyncio.get_running_loop().create_future()
        self.frames = self.deltas = 0
        assert self.transport is not None
        self.transport.write(head + b"\0\0\0\0" + text)
        return self.waiter

    def close(self) -> None:
        if self.transport is not None:
            self.transport.write(b"\x88\x82\0\0\0\0\x03\xe8")  # close 1000
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        if not self.upgraded:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                return
            if not buf.startswith(b"HTTP/1.1 101"):
                raise RuntimeError(f"no upgrade: {bytes(buf[:80])!r}")
            self.upgraded = True
            del buf[: end + 4]
            if self.waiter is not None and not self.waiter.done():
                self.waiter.set_result(None)
        pos = 0
        while len(buf) - pos >= 2:
            n = buf[pos + 1] & 0x7F
            start = pos + 2
            if n == 126:
                if len(buf) - pos < 4:
                    break
                n, start = int.from_bytes(buf[pos + 2 : pos + 4], "big"), pos + 4
            elif n == 127:
                if len(buf) - pos < 10:
                    break
                n, start = int.from_bytes(buf[pos + 2 : pos + 10], "big"), pos + 10
            if len(buf) < start + n:
                break
            opcode = buf[pos] & 0x0F
            pos = start + n
            if opcode != 1:
                continue
            self.frames += 1
            head = bytes(buf[start : start + 60])
            if _DELTA in head:
                self.deltas += 1
            if b'"type":"error"' in head or any(k in head for k in _TERMINAL):
                if self.waiter is not None and not self.waiter.done():
                    self.waiter.set_result(bytes(buf[start:pos]))
        del buf[:pos]


async def conv_ws(port: int, model: str, turns: int) -> list[float]:
    out = []
    previous: str | None = None
    ws = await RawWS.open(port)
    try:
        for t in range(turns):
            msg: dict[str, Any] = {
                "type": "response.create",
                "model": model,
                "instructions": "You are terse.",
                "input": [{"type": "message", "role": "user", "content": user_text(t)}],
                "store": False,
            }
            if previous is not None:
                msg["previous_response_id"] = previous
            frame = orjson.dumps(msg)
            t0 = time.perf_counter()
            raw = await asyncio.wait_for(ws.turn(frame), TIMEOUT)
            out.append(time.perf_counter() - t0)
            ev = orjson.loads(raw)
            if ev["type"] != "response.completed":
                raise RuntimeError(f"ws: {raw[:300]!r}")
            previous = ev["response"]["id"]
    finally:
        ws.close()
    return out


async def conversation(
    gw: tuple[int, int], up_port: int, turns: int, reps: int, answer: int
) -> dict[str, Any]:
    """``reps`` + 1 (the first is a warm-up, dropped) conversations per mode, in rotating order."""
    port, pid = gw
    runs = {
        "direct": lambda: conv_direct(up_port, f"fake-{answer}", turns),
        "http": lambda: conv_http(port, "relay-chat", turns),
        "ws": lambda: conv_ws(port, "relay-chat", turns),
    }
    names = list(runs)
    lat: dict[str, list[list[float]]] = {n: [] for n in names}
    cpu: dict[str, list[float]] = {n: [] for n in names}
    for rep in range(reps + 1):
        order = names[rep % 3 :] + names[: rep % 3]
        for name in order:
            c0 = cpu_seconds(pid)
            turns_s = await runs[name]()
            c1 = cpu_seconds(pid)
            if rep:
                lat[name].append(turns_s)
                cpu[name].append((c1 - c0) / turns)
    out: dict[str, Any] = {"turns": turns, "reps": reps, "answer_deltas": answer}
    for name in names:
        flat = sorted(x for conv in lat[name] for x in conv)
        totals = [sum(conv) for conv in lat[name]]
        out[name] = {
            "turn_ms_p50": 1000 * statistics.median(flat),
            "turn_ms_p90": 1000 * flat[int(0.9 * (len(flat) - 1))],
            "total_ms_p50": 1000 * statistics.median(totals),
            "total_ms_sum": 1000 * sum(totals),
            "gateway_cpu_ms_per_turn": 1000 * statistics.median(cpu[name]),
        }
    d = out["direct"]["turn_ms_p50"]
    for name in ("http", "ws"):
        out[name]["added_ms_p50"] = out[name]["turn_ms_p50"] - d
    # the same rep's totals, paired: WS conversation total / HTTP-replay conversation total
    pairs = [sum(w) / sum(h) for w, h in zip(lat["ws"], lat["http"], strict=True)]
    out["ws_over_http_total"] = statistics.median(pairs)
    out["ws_over_http_total_all"] = out["ws"]["total_ms_sum"] / out["http"]["total_ms_sum"]
    out["ws_over_http_cpu"] = out["ws"]["gateway_cpu_ms_per_turn"] / out["http"]["gateway_cpu_ms_per_turn"]
    return out


# -- long streams ----------------------------------------------------------------------------------


async def long_sse(port: int, deltas: int) -> tuple[int, int]:
    conn = await Conn.open(HOST, port)
    try:
        body = orjson.dumps({"model": "relay-long", "input": "go", "store": False, "stream": True})
        pats = Patterns(events=b"\nevent: ", deltas=b"event: response.output_text.delta\n")
        reply = await asyncio.wait_for(conn.request(post(HOST, port, "/v1/responses", body), pats), TIMEOUT)
    finally:
        conn.close()
    if reply.status != 200:
        raise RuntimeError(f"long sse: status {reply.status}")
    return reply.events + 1, reply.deltas  # the first event has no leading newline


async def long_ws(port: int, deltas: int) -> tuple[int, int]:
    ws = await RawWS.open(port)
    try:
        msg = {"type": "response.create", "model": "relay-long", "input": "go", "store": False}
        raw = await asyncio.wait_for(ws.turn(orjson.dumps(msg)), TIMEOUT)
        if b'"type":"response.completed"' not in raw[:60]:
            raise RuntimeError(f"long ws: {raw[:300]!r}")
        return ws.frames, ws.deltas
    finally:
        ws.close()


async def long_streams(gw: tuple[int, int], deltas: int, streams: int) -> dict[str, Any]:
    port, pid = gw
    out: dict[str, Any] = {"deltas": deltas, "streams": streams}
    before = cpu_seconds(pid)
    await asyncio.sleep(1.0)
    out["idle_cpu_percent"] = round(100 * (cpu_seconds(pid) - before), 1)
    for name, fn in (("sse", long_sse), ("ws", long_ws)):
        per: list[float] = []
        wall: list[float] = []
        seen: list[tuple[int, int]] = []
        for i in range(streams + 1):
            c0, t0 = cpu_seconds(pid), time.perf_counter()
            seen.append(await fn(port, deltas))
            c1, t1 = cpu_seconds(pid), time.perf_counter()
            if i:  # the first is a warm-up
                per.append(c1 - c0)
                wall.append(t1 - t0)
        out[name] = {
            "cpu_us_per_delta_p50": 1e6 * statistics.median(per) / deltas,
            "cpu_us_per_delta_min": 1e6 * min(per) / deltas,
            "cpu_ms_per_stream_p50": 1000 * statistics.median(per),
            "wall_ms_p50": 1000 * statistics.median(wall),
            "events_sent": seen[-1][0],
            "delta_events_sent": seen[-1][1],
            "cpu_us_per_event_sent_p50": 1e6 * statistics.median(per) / max(1, seen[-1][0]),
        }
    return out


# -- the run ---------------------------------------------------------------------------------------


def table(r: dict[str, Any]) -> str:
    m = r["meta"]
    lines = [
        f"relay cost, {m['time']} ({m['git']}), machine CPU busy {m['machine_busy_percent']}% "
        f"(loadavg {m['loadavg_start'][0]:.2f} -> {m['loadavg_end'][0]:.2f}), idle gateway "
        f"{r['long']['idle_cpu_percent']}% of a core",
    ]
    c = r["conversation"]
    lines += [
        "",
        f"conversation: {c['turns']} turns x {c['reps']} reps, ~1 KB user message, "
        f"{c['answer_deltas']}-delta answers",
        f"{'':10} {'turn p50 ms':>12} {'added p50':>10} {'turn p90':>9} {'total p50 ms':>13} "
        f"{'gw CPU ms/turn':>15}",
    ]
    for name in ("direct", "http", "ws"):
        x = c[name]
        added = f"{x['added_ms_p50']:+.3f}" if "added_ms_p50" in x else "-"
        lines.append(
            f"{name:10} {x['turn_ms_p50']:12.3f} {added:>10} {x['turn_ms_p90']:9.3f} "
            f"{x['total_ms_p50']:13.2f} {x['gateway_cpu_ms_per_turn']:15.3f}"
        )
    lines.append(
        f"WS total / HTTP-replay total: {c['ws_over_http_total']:.3f} (paired per rep, median); "
        f"{c['ws_over_http_total_all']:.3f} (all reps); gateway CPU per turn WS/HTTP "
        f"{c['ws_over_http_cpu']:.3f}"
    )
    for key, label in (("long", "merge on (default)"), ("long_unmerged", "merge_deltas: false")):
        g = r.get(key)
        if not g:
            continue
        lines += [
            "",
            f"long stream: {g['deltas']} upstream deltas x {g['streams']} streams, {label}",
            f"{'':6} {'CPU us/delta p50':>17} {'min':>7} {'CPU ms/stream':>14} {'wall ms':>8} "
            f"{'events sent':>12} {'us/event sent':>14}",
        ]
        for name in ("sse", "ws"):
            x = g[name]
            lines.append(
                f"{name:6} {x['cpu_us_per_delta_p50']:17.2f} {x['cpu_us_per_delta_min']:7.2f} "
                f"{x['cpu_ms_per_stream_p50']:14.2f} {x['wall_ms_p50']:8.1f} {x['events_sent']:12d} "
                f"{x['cpu_us_per_event_sent_p50']:14.2f}"
            )
    return "\n".join(lines)


def git(*args: str) -> str:
    with contextlib.suppress(Exception):
        return subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=5
        ).stdout.strip()
    return ""


async def measure(args: argparse.Namespace, up_port: int, gws: dict[str, tuple[int, int]]) -> dict[str, Any]:
    r: dict[str, Any] = {}
    r["conversation"] = await conversation(gws["main"], up_port, args.turns, args.reps, args.answer)
    r["long"] = await long_streams(gws["main"], args.deltas, args.streams)
    if "unmerged" in gws:
        r["long_unmerged"] = await long_streams(gws["unmerged"], args.deltas, args.streams)
    return r


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--turns", type=int, default=20)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--answer", type=int, default=64, help="deltas per conversation answer")
    p.add_argument("--deltas", type=int, default=4096, help="deltas of the long stream")
    p.add_argument("--streams", type=int, default=9)
    p.add_argument("--quick", action="store_true")
    args = p.parse_args(argv)
    if args.quick:
        args.reps, args.streams = 2, 3
    tmp = Path(tempfile.mkdtemp(prefix="gw-relay-"))
    procs: list[Proc] = []
    meta: dict[str, Any] = {
        "time": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "git": git("rev-parse", "--short", "HEAD") + (" +dirty" if git("status", "--porcelain") else ""),
        "loadavg_start": os.getloadavg(),
    }
    cpu0 = cpu_times()
    try:
        up, up_port = start_upstream(16)
        procs.append(up)
        variants: dict[str, bool | None] = {"main": None}
        if merge_supported():
            variants["unmerged"] = False
        gws: dict[str, tuple[int, int]] = {}
        for name, merge in variants.items():
            cfg = tmp / f"{name}.yaml"
            cfg.write_text(config(up_port, args.answer, args.deltas, merge))
            proc, port = start_gateway(cfg, tmp / f"{name}.log")
            procs.append(proc)
            gws[name] = (port, proc.pid)
        try:
            import uvloop

            r = uvloop.run(measure(args, up_port, gws))
        except ImportError:  # pragma: no cover
            r = asyncio.run(measure(args, up_port, gws))
    finally:
        for proc in reversed(procs):
            proc.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    share = machine_share(cpu0, cpu_times())
    meta["machine_cpu_percent"] = share
    meta["machine_busy_percent"] = round(100 - share["idle"] - share["iowait"], 1)
    meta["loadavg_end"] = os.getloadavg()
    r["meta"] = meta
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"relay-{dt.datetime.now(dt.UTC).strftime('%Y%m%d-%H%M%S')}.json"
    path.write_bytes(orjson.dumps(r, option=orjson.OPT_INDENT_2))
    print(table(r))
    print(f"\nresults: {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
