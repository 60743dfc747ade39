"""The benchmark's load generator: its own process, so client CPU is separate from the servers'.

It speaks HTTP/1.1 over raw asyncio (uvloop) sockets with one keep-alive connection per
concurrent worker, and identical code for the direct-upstream and the gateway paths; only the
request bytes and the byte patterns it looks for differ. Responses are scanned, not parsed:

* the end of a body is its ``content-length`` or the chunked terminator ``\\r\\n0\\r\\n\\r\\n``;
* time to first delta is when ``marker`` first appears in the body;
* events are counted by occurrences of byte patterns (counted across read boundaries).

``bench/run.py`` drives it as a worker: one JSON command per stdin line, one JSON answer per
stdout line (``python -m bench load``). Commands: ``http`` (paired direct/gateway runs or a
single target), ``agent`` (the 20-turn conversation), ``ws_idle_open`` / ``ws_idle_close``,
``quit``. Every loop is bounded by a request count and a deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import re
import resource
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import orjson

_TERMINATOR = b"\r\n0\r\n\r\n"
_TAIL = 64  # bytes carried between reads: longer than every pattern and the terminator
REQUEST_TIMEOUT = 30.0


def grace_seconds(max_seconds: float) -> float:
    """How long requests in flight at the deadline may still take before they are abandoned."""
    return min(REQUEST_TIMEOUT, max(1.0, max_seconds / 2))


_CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """CPU time a process has run so far, nan if it is gone: the scheduler's nanosecond count summed
    over its threads (``/proc/PID/task/*/schedstat``), else user + system ticks (``/proc/PID/stat``)."""
    try:
        total = 0
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(FileNotFoundError):  # a thread that just ended
                total += int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0])
        return total / 1e9
    except (OSError, ValueError, IndexError):
        pass
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return math.nan
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK


# --------------------------------------------------------------------------------------------
# One keep-alive HTTP/1.1 connection
# --------------------------------------------------------------------------------------------


@dataclass(slots=True)
class Patterns:
    marker: bytes | None = None  # time to first delta: first occurrence
    events: bytes | None = None  # counted: all events
    deltas: bytes | None = None  # counted: text deltas


@dataclass(slots=True)
class Reply:
    status: int
    latency: float  # seconds from the write of the request to the last byte of the response
    first: float  # seconds to the first marker; nan without one
    events: int
    deltas: int
    body: bytes  # only with keep_body


class Conn(asyncio.Protocol):
    """Sends one request at a time and scans the response as it arrives."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.waiter: asyncio.Future[Reply] | None = None
        self.lost: BaseException | None = None
        self._reset(Patterns(), False)

    def _reset(self, patterns: Patterns, keep_body: bool) -> None:
        self.patterns = patterns
        self.keep_body = keep_body
        self.head = b""
        self.in_body = False
        self.chunked = False
        self.remaining = 0
        self.tail = b""
        self.status = 0
        self.t0 = 0.0
        self.first = math.nan
        self.seen = False
        self.events = 0
        self.deltas = 0
        self.parts: list[bytes] = []

    @classmethod
    async def open(cls, host: str, port: int) -> Conn:
        loop = asyncio.get_running_loop()
        _, proto = await loop.create_connection(cls, host, port)
        return proto

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = exc or ConnectionResetError("connection closed")
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(self.lost)

    def request(self, data: bytes, patterns: Patterns, keep_body: bool = False) -> asyncio.Future[Reply]:
        if self.lost is not None or self.transport is None:
            raise ConnectionError("connection is closed")
        self._reset(patterns, keep_body)
        self.waiter = asyncio.get_running_loop().create_future()
        self.t0 = time.perf_counter()
        self.transport.write(data)
        return self.waiter

    @property
    def usable(self) -> bool:
        """Open and idle: not closed by the server, no response still arriving."""
        return self.lost is None and (self.waiter is None or self.waiter.done())

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
        if self.waiter is not None and not self.waiter.done():
            self.waiter.cancel()

    def data_received(self, data: bytes) -> None:
        if self.waiter is None or self.waiter.done():
            return
        if not self.in_body:
            self.head += data
            end = self.head.find(b"\r\n\r\n")
            if end < 0:
                return
            head, data = self.head[:end].lower(), self.head[end + 4 :]
            if not head.startswith(b"http/1.") or not head[9:12].isdigit():
                self.waiter.set_exception(ConnectionError(f"not an HTTP response: {head[:40]!r}"))
                if self.transport is not None:
                    self.transport.close()
                return
            self.status = int(head[9:12])
            self.in_body = True
            if b"transfer-encoding: chunked" in head:
                self.chunked = True
                self.tail = b"\r\n"
            else:
                m = re.search(rb"content-length: *(\d+)", head)
                self.remaining = int(m.group(1)) if m else 0
        if self.keep_body:
            self.parts.append(data)
        if not self.chunked:
            self.remaining -= len(data)
            if self.remaining <= 0:
                self._finish()
            return
        tail = self.tail
        scan = tail + data
        p = self.patterns
        if p.marker is not None and not self.seen and p.marker in scan:
            self.seen = True
            self.first = time.perf_counter() - self.t0
        if p.events is not None:
            self.events += scan.count(p.events) - tail.count(p.events)
        if p.deltas is not None:
            self.deltas += scan.count(p.deltas) - tail.count(p.deltas)
        self.tail = scan[-_TAIL:]
        if scan.endswith(_TERMINATOR):
            self._finish()

    def _finish(self) -> None:
        latency = time.perf_counter() - self.t0
        waiter = self.waiter
        assert waiter is not None
        body = b"".join(self.parts) if self.keep_body else b""
        waiter.set_result(Reply(self.status, latency, self.first, self.events, self.deltas, body))


def post(host: str, port: int, path: str, body: bytes, extra: str = "") -> bytes:
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
        f"Accept: */*\r\n{extra}Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


def decode_chunked(raw: bytes) -> bytes:
    out: list[bytes] = []
    pos = 0
    while True:
        eol = raw.index(b"\r\n", pos)
        size = int(raw[pos:eol].split(b";")[0], 16)
        if size == 0:
            return b"".join(out)
        out.append(raw[eol + 2 : eol + 2 + size])
        pos = eol + 2 + size + 2


# --------------------------------------------------------------------------------------------
# Statistics
# --------------------------------------------------------------------------------------------


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an already sorted list; nan when empty."""
    if not sorted_values:
        return math.nan
    k = max(0, min(len(sorted_values) - 1, math.ceil(q / 100 * len(sorted_values)) - 1))
    return sorted_values[k]


def summarize_ms(values: list[float]) -> dict[str, float]:
    xs = sorted(v * 1000 for v in values if v == v)
    if not xs:
        return {"n": 0}
    return {
        "n": len(xs),
        "p50": percentile(xs, 50),
        "p90": percentile(xs, 90),
        "p99": percentile(xs, 99),
        "mean": sum(xs) / len(xs),
        "max": xs[-1],
    }


@dataclass
class Samples:
    latencies: list[float] = field(default_factory=list)
    firsts: list[float] = field(default_factory=list)
    events: int = 0
    deltas: int = 0
    errors: int = 0
    statuses: dict[int, int] = field(default_factory=dict)
    wall: float = 0.0
    time_capped: bool = False  # stopped by the deadline before the request count
    abandoned: int = 0  # requests still unanswered a grace time after the deadline (not in latencies)
    reconnects: int = 0
    cpu: dict[str, float] = field(default_factory=dict)  # CPU seconds per process during the run

    def add(self, reply: Reply) -> None:
        self.statuses[reply.status] = self.statuses.get(reply.status, 0) + 1
        if reply.status != 200:
            self.errors += 1
            return
        self.latencies.append(reply.latency)
        self.firsts.append(reply.first)
        self.events += reply.events
        self.deltas += reply.deltas

    def summary(self) -> dict[str, Any]:
        ok = len(self.latencies)
        wall = self.wall or math.nan
        return {
            "requests": ok,
            "errors": self.errors,
            "statuses": {str(k): v for k, v in sorted(self.statuses.items())},
            "wall_s": self.wall,
            "rps": ok / wall,
            "latency_ms": summarize_ms(self.latencies),
            "first_delta_ms": summarize_ms(self.firsts),
            "events": self.events,
            "events_per_s": self.events / wall,
            "deltas": self.deltas,
            "deltas_per_s": self.deltas / wall,
            "events_per_response": self.events / ok if ok else math.nan,
            "time_capped": self.time_capped,
            "abandoned": self.abandoned,
            "reconnects": self.reconnects,
            "cpu_s": self.cpu,
            "cpu_ms_per_request": {k: 1000 * v / ok for k, v in self.cpu.items()} if ok else {},
        }


# --------------------------------------------------------------------------------------------
# HTTP load
# --------------------------------------------------------------------------------------------


@dataclass
class Target:
    host: str
    port: int
    data: bytes
    patterns: Patterns

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Target:
        def b(key: str) -> bytes | None:
            v = d.get(key)
            return v.encode() if isinstance(v, str) else None

        body = orjson.dumps(d["body"])
        extra = "".join(f"{k}: {v}\r\n" for k, v in (d.get("headers") or {}).items())
        return cls(
            d.get("host", "127.0.0.1"),
            int(d["port"]),
            post(d.get("host", "127.0.0.1"), int(d["port"]), d["path"], body, extra),
            Patterns(b("marker"), b("events"), b("deltas")),
        )


async def run_load(
    target: Target,
    concurrency: int,
    requests: int,
    max_seconds: float,
    warmup: int,
    pids: dict[str, int] | None = None,
) -> Samples:
    """``requests`` requests over ``concurrency`` keep-alive connections, stopping early at the deadline.

    The warm-up gets at most 3 s; requests still in flight ``grace_seconds`` after the deadline are
    abandoned (their connections closed) and counted in ``abandoned``. A connection the server
    closed (uvicorn drops keep-alive connections idle for 5 s), or one left with a response still
    arriving when the warm-up's time ran out, is replaced by a new one before its next request
    (counted in ``reconnects``); a request whose connection dies under it counts as an error
    (status 0). ``pids`` names processes whose CPU time is measured over the run (this
    process is always measured as ``client``)."""
    conns = [await Conn.open(target.host, target.port) for _ in range(concurrency)]
    samples = Samples()

    async def send(i: int) -> Reply:
        if not conns[i].usable:
            conns[i].close()
            conns[i] = await Conn.open(target.host, target.port)
            samples.reconnects += 1
        try:
            return await conns[i].request(target.data, target.patterns)
        except (ConnectionError, OSError):
            return Reply(0, math.nan, math.nan, 0, 0, b"")

    try:
        # warm-up: a few requests per connection, not recorded, bounded in time
        per_conn = max(1, math.ceil(warmup / concurrency)) if warmup else 0

        async def warm(i: int) -> None:
            for _ in range(per_conn):
                await send(i)

        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(min(max(0.5, max_seconds / 4), 3.0)):
                await asyncio.gather(*(warm(i) for i in range(concurrency)))

        procs = {"client": os.getpid(), **(pids or {})}
        cpu0 = {name: cpu_seconds(pid) for name, pid in procs.items()}
        issued = 0
        start = time.perf_counter()
        deadline = start + max_seconds

        async def worker(i: int) -> None:
            nonlocal issued
            while issued < requests and time.perf_counter() < deadline:
                issued += 1
                samples.add(await send(i))

        try:
            async with asyncio.timeout(max_seconds + grace_seconds(max_seconds)):
                await asyncio.gather(*(worker(i) for i in range(concurrency)))
        except TimeoutError:
            samples.abandoned = issued - len(samples.latencies) - samples.errors
        samples.wall = time.perf_counter() - start
        samples.cpu = {name: cpu_seconds(pid) - cpu0[name] for name, pid in procs.items()}
        samples.time_capped = issued < requests
    finally:
        for c in conns:
            c.close()
    return samples


async def cmd_http(cmd: dict[str, Any]) -> dict[str, Any]:
    """Run each named target ``rounds`` times, interleaved (a, b, a, b, …), pooling the samples, so that
    slow drift on a noisy machine hits every target alike. Each round gets requests/rounds requests and
    max_seconds/rounds seconds; with ``match`` the other targets then run exactly as many requests as
    the first one completed in that round (same request count for gateway and direct)."""
    targets = {name: Target.from_json(t) for name, t in cmd["targets"].items()}
    rounds = max(1, int(cmd.get("rounds", 1)))
    per_round = max(1, int(cmd["requests"]) // rounds)
    seconds = float(cmd["max_seconds"]) / rounds
    pooled = {name: Samples() for name in targets}
    for _ in range(rounds):
        count, cap = per_round, seconds
        for i, (name, target) in enumerate(targets.items()):
            s = await run_load(
                target, int(cmd["concurrency"]), count, cap, int(cmd.get("warmup", 0)), cmd.get("pids")
            )
            if i == 0 and cmd.get("match"):  # the others run as many requests as the first completed
                count, cap = max(1, len(s.latencies) + s.errors), 2 * seconds
            p = pooled[name]
            p.latencies += s.latencies
            p.firsts += s.firsts
            p.events += s.events
            p.deltas += s.deltas
            p.errors += s.errors
            for status, n in s.statuses.items():
                p.statuses[status] = p.statuses.get(status, 0) + n
            p.wall += s.wall
            p.time_capped |= s.time_capped
            p.abandoned += s.abandoned
            p.reconnects += s.reconnects
            for proc, cpu_s in s.cpu.items():  # not ``seconds``: that is the round's time cap
                p.cpu[proc] = p.cpu.get(proc, 0.0) + cpu_s
    return {name: s.summary() for name, s in pooled.items()}


# --------------------------------------------------------------------------------------------
# The agent conversation: direct vs gateway HTTP (full replay) vs gateway WebSocket
# --------------------------------------------------------------------------------------------

AGENT_TOOL = {
    "type": "function",
    "name": "lookup",
    "description": "Look something up in the knowledge base.",
    "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
}
CHAT_TOOL = {
    "type": "function",
    "function": {k: AGENT_TOOL[k] for k in ("name", "description", "parameters")},
}
INSTRUCTIONS = "You are a helpful agent. Use the lookup tool when you need facts."
_TERMINAL = (b"response.completed", b"response.failed", b"response.incomplete")


def user_text(turn: int) -> str:
    return f"Question {turn}: " + "please look this up and summarise it for me. " * 4


def tool_output(turn: int) -> str:
    return f"Result for turn {turn}: " + "the knowledge base says the answer is forty-two. " * 6


def sse_events(body: bytes) -> list[dict[str, Any]]:
    out = []
    for frame in body.split(b"\n\n"):
        for line in frame.split(b"\n"):
            if line.startswith(b"data: {"):
                out.append(orjson.loads(line[6:]))
    return out


async def agent_direct(host: str, port: int, model: str, turns: int) -> list[dict[str, Any]]:
    conn = await Conn.open(host, port)
    messages: list[dict[str, Any]] = [{"role": "system", "content": INSTRUCTIONS}]
    out = []
    pending_call: str | None = None
    try:
        for t in range(turns):
            if pending_call is None:
                messages.append({"role": "user", "content": user_text(t)})
            else:
                messages.append({"role": "tool", "tool_call_id": pending_call, "content": tool_output(t)})
            body = orjson.dumps(
                {
                    "model": model,
                    "messages": messages,
                    "tools": [CHAT_TOOL],
                    "stream": True,
                    "stream_options": {"include_usage": True},
                }
            )
            data = post(host, port, "/v1/chat/completions", body)
            reply = await asyncio.wait_for(conn.request(data, Patterns(), keep_body=True), REQUEST_TIMEOUT)
            text = decode_chunked(reply.body)
            chunks = sse_events(text)
            call_ids = [
                tc["id"]
                for c in chunks
                for ch in c.get("choices", [])
                for tc in ch.get("delta", {}).get("tool_calls") or []
                if tc.get("id")
            ]
            if call_ids:
                pending_call = call_ids[0]
                args = "".join(
                    tc["function"].get("arguments", "")
                    for c in chunks
                    for ch in c.get("choices", [])
                    for tc in ch.get("delta", {}).get("tool_calls") or []
                )
                messages.append(
                    {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {
                                "id": pending_call,
                                "type": "function",
                                "function": {"name": "lookup", "arguments": args},
                            }
                        ],
                    }
                )
            else:
                pending_call = None
                content = "".join(
                    ch.get("delta", {}).get("content") or "" for c in chunks for ch in c.get("choices", [])
                )
                messages.append({"role": "assistant", "content": content})
            out.append(
                {
                    "latency": reply.latency,
                    "sent": len(data),
                    "status": reply.status,
                    "ok": reply.status == 200,
                }
            )
    finally:
        conn.close()
    return out


def _new_input(t: int, pending_call: str | None) -> list[dict[str, Any]]:
    if pending_call is None:
        return [{"type": "message", "role": "user", "content": user_text(t)}]
    return [{"type": "function_call_output", "call_id": pending_call, "output": tool_output(t)}]


def _call_of(output: list[dict[str, Any]]) -> str | None:
    calls = [o["call_id"] for o in output if o.get("type") == "function_call"]
    return calls[0] if calls else None


async def agent_http(host: str, port: int, model: str, turns: int) -> list[dict[str, Any]]:
    """The stateless client: every turn replays the whole history (``store: false``)."""
    conn = await Conn.open(host, port)
    history: list[dict[str, Any]] = []
    out = []
    pending_call: str | None = None
    try:
        for t in range(turns):
            history += _new_input(t, pending_call)
            body = orjson.dumps(
                {
                    "model": model,
                    "instructions": INSTRUCTIONS,
                    "input": history,
                    "tools": [AGENT_TOOL],
                    "store": False,
                    "stream": True,
                }
            )
            data = post(host, port, "/v1/responses", body)
            reply = await asyncio.wait_for(conn.request(data, Patterns(), keep_body=True), REQUEST_TIMEOUT)
            ok = reply.status == 200
            output: list[dict[str, Any]] = []
            if ok:
                events = sse_events(decode_chunked(reply.body))
                terminal = [e for e in events if e.get("type") in ("response.completed",)]
                ok = bool(terminal)
                output = terminal[0]["response"]["output"] if terminal else []
            history += output
            pending_call = _call_of(output)
            out.append({"latency": reply.latency, "sent": len(data), "status": reply.status, "ok": ok})
    finally:
        conn.close()
    return out


async def agent_ws(host: str, port: int, model: str, turns: int, path: str) -> list[dict[str, Any]]:
    """One WebSocket; each turn sends only the new items plus ``previous_response_id`` (``store: false``)."""
    from websockets.asyncio.client import connect

    out = []
    pending_call: str | None = None
    previous: str | None = None
    async with connect(
        f"ws://{host}:{port}{path}", compression=None, max_size=None, ping_interval=None, open_timeout=10
    ) as ws:
        for t in range(turns):
            msg: dict[str, Any] = {
                "type": "response.create",
                "model": model,
                "instructions": INSTRUCTIONS,
                "input": _new_input(t, pending_call),
                "tools": [AGENT_TOOL],
                "store": False,
            }
            if previous is not None:
                msg["previous_response_id"] = previous
            frame = orjson.dumps(msg).decode()
            # client frames: 2-byte header, +2 (126..65535) or +8 length bytes, +4 mask
            n = len(frame.encode())
            sent = n + 2 + (0 if n < 126 else 2 if n < 65536 else 8) + 4
            t0 = time.perf_counter()
            await ws.send(frame)
            ok = False
            output: list[dict[str, Any]] = []
            async with asyncio.timeout(REQUEST_TIMEOUT):
                while True:
                    raw = await ws.recv(decode=False)
                    head = raw[:60]
                    if b'"type":"error"' in head:
                        break
                    if any(k in head for k in _TERMINAL):
                        ev = orjson.loads(raw)
                        ok = ev["type"] == "response.completed"
                        output = ev["response"]["output"]
                        previous = ev["response"]["id"]
                        break
            latency = time.perf_counter() - t0
            pending_call = _call_of(output)
            out.append({"latency": latency, "sent": sent, "status": 200 if ok else 0, "ok": ok})
    return out


async def cmd_agent(cmd: dict[str, Any]) -> dict[str, Any]:
    """``reps`` conversations of ``turns`` turns per mode, interleaved; per turn: latency and bytes."""
    host = cmd.get("host", "127.0.0.1")
    turns = int(cmd["turns"])
    modes: dict[str, list[list[dict[str, Any]]]] = {}
    deadline = time.perf_counter() + float(cmd["max_seconds"])
    for _ in range(int(cmd["reps"])):
        if time.perf_counter() > deadline:
            break
        runs: dict[str, Any] = {}
        if cmd.get("direct"):
            d = cmd["direct"]
            runs["direct"] = agent_direct(host, d["port"], d["model"], turns)
        if cmd.get("http"):
            h = cmd["http"]
            runs["http"] = agent_http(host, h["port"], h["model"], turns)
        if cmd.get("ws"):
            w = cmd["ws"]
            runs["ws"] = agent_ws(host, w["port"], w["model"], turns, w.get("path", "/v1/responses"))
        for name, coro in runs.items():
            try:
                modes.setdefault(name, []).append(await coro)
            except Exception as exc:  # report, do not abort the whole benchmark
                modes.setdefault(name + "_errors", []).append([{"error": repr(exc)[:300]}])
    return modes


# --------------------------------------------------------------------------------------------
# Idle WebSocket connections
# --------------------------------------------------------------------------------------------

_idle: list[Any] = []


def raise_fd_limit(want: int) -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < want:
        new = want if hard == resource.RLIM_INFINITY else min(want, hard)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


async def cmd_ws_idle_open(cmd: dict[str, Any]) -> dict[str, Any]:
    from websockets.asyncio.client import connect

    n = int(cmd["count"])
    limit = raise_fd_limit(n + 256)
    url = f"ws://{cmd.get('host', '127.0.0.1')}:{cmd['port']}{cmd.get('path', '/v1/responses')}"
    sem = asyncio.Semaphore(int(cmd.get("parallel", 32)))
    errors: list[str] = []

    async def one() -> None:
        async with sem:
            try:
                ws = await connect(url, compression=None, ping_interval=None, open_timeout=15)
                _idle.append(ws)
            except Exception as exc:
                errors.append(repr(exc)[:200])

    t0 = time.perf_counter()
    async with asyncio.timeout(float(cmd.get("max_seconds", 60))):
        await asyncio.gather(*(one() for _ in range(n)))
    return {
        "open": len(_idle),
        "errors": len(errors),
        "first_error": errors[:1],
        "fd_limit": limit,
        "seconds": time.perf_counter() - t0,
    }


async def cmd_ws_idle_close(cmd: dict[str, Any]) -> dict[str, Any]:
    n = len(_idle)
    sem = asyncio.Semaphore(64)

    async def close(ws: Any) -> None:
        async with sem:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(ws.close(), 5)

    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(30):
            await asyncio.gather(*(close(ws) for ws in _idle))
    _idle.clear()
    return {"closed": n}


# --------------------------------------------------------------------------------------------
# Worker loop
# --------------------------------------------------------------------------------------------

COMMANDS = {
    "http": cmd_http,
    "agent": cmd_agent,
    "ws_idle_open": cmd_ws_idle_open,
    "ws_idle_close": cmd_ws_idle_close,
}


async def worker() -> None:
    loop = asyncio.get_running_loop()
    while True:
        line = await loop.run_in_executor(None, sys.stdin.buffer.readline)
        if not line:
            return
        cmd = orjson.loads(line)
        if cmd.get("cmd") == "quit":
            return
        try:
            result: Any = await COMMANDS[cmd["cmd"]](cmd)
            answer = {"ok": True, "result": result}
        except Exception as exc:
            answer = {"ok": False, "error": repr(exc)[:500]}
        sys.stdout.buffer.write(orjson.dumps(answer) + b"\n")
        sys.stdout.flush()


def main() -> int:
    try:
        import uvloop

        uvloop.run(worker())
    except ImportError:  # pragma: no cover
        asyncio.run(worker())
    return 0


if __name__ == "__main__":
    sys.exit(main())
