"""WebSocket lanes and steering, measured: two responses on two lanes of one socket vs on two
sockets vs FIFO on one lane (and the direct upstream: the same two streams fetched concurrently),
and the time from ``response.steer`` to the successor's ``response.created`` (vs a fresh create's
``response.created`` on an idle socket, and the upstream's own time to first byte).

Two upstreams: the benchmark's fast fake (bench/lib/upstream.py, every stream written at once: the
gateway is CPU-bound) and a paced one in this process (``--pace-ms`` between chunks, as a model
generates: the gateway mostly waits), both speaking Chat Completions to the openai-chat adapter.

Run from the repo root: ``python -m bench lanes [--pairs 40] [--steers 30]``. Starts the fast
fake and a gateway on loopback and stops them (only them) at the end. Prints a table and writes
bench/results/lanes-<time>.json. Asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson
from websockets.asyncio.client import ClientConnection, connect

from bench.lib.procs import ADAPTER_PROVIDERS, HOST, RESULTS, start_gateway, start_upstream

_HEAD = b'{"id":"c","object":"chat.completion.chunk","created":1,"model":"p","choices":'
CHUNK = _HEAD + b'[{"index":0,"delta":%s,"finish_reason":%s}]}'
USAGE = _HEAD + b'[],"usage":{"prompt_tokens":9,"completion_tokens":%d,"total_tokens":%d}}'

TERMINAL = frozenset({"response.completed", "response.incomplete", "response.failed", "error"})
LONG = 100_000  # chunks of the stream a steer interrupts (it never gets near the end)


def ms(values: list[float]) -> dict[str, float]:
    v = sorted(values)
    return {
        "p50": round(1000 * statistics.median(v), 2),
        "p95": round(1000 * v[min(len(v) - 1, int(0.95 * len(v)))], 2),
        "mean": round(1000 * statistics.fmean(v), 2),
    }


def create(model: str, text: str, **extra: Any) -> str:
    body = {"type": "response.create", "model": model, "input": text, "store": False, **extra}
    return orjson.dumps(body).decode()


class Paced:
    """A Chat Completions upstream that streams ``fake-N`` as N chunks ``pace`` seconds apart."""

    def __init__(self, pace: float) -> None:
        self.pace = pace
        self.port = 0

    async def start(self) -> asyncio.Server:
        server = await asyncio.start_server(self._serve, HOST, 0)
        self.port = server.sockets[0].getsockname()[1]
        return server

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length, close = 0, False
                for line in head.split(b"\r\n"):
                    name, _, value = line.partition(b":")
                    name = name.strip().lower()
                    if name == b"content-length":
                        length = int(value)
                    elif name == b"connection":
                        close = value.strip().lower() == b"close"
                body = orjson.loads(await reader.readexactly(length))
                model = str(body.get("model", "fake-16"))
                n = int(model[5:]) if model[5:].isdigit() else 16
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                    b"transfer-encoding: chunked\r\n\r\n"
                )
                self._event(writer, CHUNK % (b'{"role":"assistant","content":""}', b"null"))
                for _ in range(n):
                    await asyncio.sleep(self.pace)
                    self._event(writer, CHUNK % (b'{"content":"tok "}', b"null"))
                    await writer.drain()
                self._event(writer, CHUNK % (b"{}", b'"stop"'))
                self._event(writer, USAGE % (n, n + 9))
                self._event(writer, b"[DONE]")
                writer.write(b"0\r\n\r\n")
                await writer.drain()
                if close:
                    return
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass  # the client went away (a steered stream is cut): so does this answer
        finally:
            writer.close()

    @staticmethod
    def _event(writer: asyncio.StreamWriter, data: bytes) -> None:
        frame = b"data: " + data + b"\n\n"
        writer.write(b"%x\r\n%s\r\n" % (len(frame), frame))


def write_config(path: Path, fast: int, paced: int, models: dict[str, tuple[str, str]]) -> None:
    name, base = ADAPTER_PROVIDERS["openai-chat"]
    lines = [
        "log:",
        "  level: warning",
        "providers:",
        f"  {name}: {{kind: openai-chat, base_url: 'http://{HOST}:{fast}{base}', api_key: sk-bench}}",
        f"  paced: {{kind: openai-chat, base_url: 'http://{HOST}:{paced}/v1', api_key: sk-bench}}",
        "models:",
        *(f"  {m}: {{provider: {p}, upstream_model: {u}}}" for m, (p, u) in models.items()),
    ]
    path.write_text("\n".join(lines) + "\n")


async def recv(ws: ClientConnection) -> dict[str, Any]:
    event: dict[str, Any] = orjson.loads(await asyncio.wait_for(ws.recv(), 60))
    return event


async def terminals(ws: ClientConnection, n: int) -> None:
    seen = 0
    while seen < n:
        if (await recv(ws))["type"] in TERMINAL:
            seen += 1


async def direct_stream(port: int, chunks: int, ttfb: bool = False) -> float:
    """One streamed Chat Completions request to an upstream itself: read to its end, or (``ttfb``)
    to its first content chunk. → seconds."""
    body = orjson.dumps(
        {"model": f"fake-{chunks}", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    )
    reader, writer = await asyncio.open_connection(HOST, port)
    start = time.perf_counter()
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(body), body)
    )
    if ttfb:
        seen = b""
        while b"tok " not in seen:
            seen += await reader.read(65536)
    else:
        await reader.read()  # connection: close, so the stream ends with the socket
    took = time.perf_counter() - start
    writer.close()
    return took


async def pairs(gw: str, up: int, rounds: int, model: str, chunks: int) -> dict[str, Any]:
    """Two streamed responses at once, ``rounds`` times each way, interleaved."""
    times: dict[str, list[float]] = {"lanes": [], "sockets": [], "fifo": [], "direct": []}
    async with connect(gw, max_size=None) as one, connect(gw, max_size=None) as other:
        for _ in range(3):  # warm-up
            await one.send(create(model, "warm"))
            await terminals(one, 1)
        for _ in range(rounds):
            start = time.perf_counter()
            await one.send(create(model, "a", stream_id="a"))
            await one.send(create(model, "b", stream_id="b"))
            await terminals(one, 2)
            times["lanes"].append(time.perf_counter() - start)

            start = time.perf_counter()
            await one.send(create(model, "a"))
            await other.send(create(model, "b"))
            await asyncio.gather(terminals(one, 1), terminals(other, 1))
            times["sockets"].append(time.perf_counter() - start)

            start = time.perf_counter()
            await one.send(create(model, "a"))
            await one.send(create(model, "b"))
            await terminals(one, 2)
            times["fifo"].append(time.perf_counter() - start)

            start = time.perf_counter()
            await asyncio.gather(direct_stream(up, chunks), direct_stream(up, chunks))
            times["direct"].append(time.perf_counter() - start)
    out: dict[str, Any] = {k: ms(v) for k, v in times.items()}
    out["lanes_vs_sockets_p50"] = round(out["lanes"]["p50"] / out["sockets"]["p50"], 3)
    out["lanes_vs_fifo_p50"] = round(out["lanes"]["p50"] / out["fifo"]["p50"], 3)
    out["lanes_vs_direct_p50"] = round(out["lanes"]["p50"] / out["direct"]["p50"], 3)
    return out


async def steers(gw: str, up: int, rounds: int, model: str, chunks: int) -> dict[str, Any]:
    """Steer a long stream after its first delta: steer → accepted, → response.incomplete, → the
    successor's response.created; against a fresh create's response.created on an idle socket."""
    t: dict[str, list[float]] = {
        "accepted": [],
        "incomplete": [],
        "successor_created": [],
        "fresh_created": [],
    }
    direct = [await direct_stream(up, chunks, ttfb=True) for _ in range(rounds)]
    for _ in range(rounds):
        async with connect(gw, max_size=None) as ws:
            start = time.perf_counter()
            await ws.send(create(model, "fresh"))
            created = await recv(ws)
            t["fresh_created"].append(time.perf_counter() - start)
            while (await recv(ws))["type"] != "response.output_text.delta":
                pass
            rid = created["response"]["id"]
            start = time.perf_counter()
            await ws.send(
                orjson.dumps({"type": "response.steer", "previous_response_id": rid, "input": "now"}).decode()
            )
            phase = 0
            while phase < 3:
                kind = (await recv(ws))["type"]
                now = time.perf_counter() - start
                if kind == "response.steer.accepted":
                    t["accepted"].append(now)
                    phase = max(phase, 1)
                elif kind == "response.incomplete":
                    t["incomplete"].append(now)
                    phase = 2
                elif kind == "response.created" and phase == 2:
                    t["successor_created"].append(now)
                    phase = 3
                elif kind in ("error", "response.failed", "response.steer.failed"):
                    raise RuntimeError(f"steer round failed: {kind}")
        # closing the socket cancels the successor's long stream
    out: dict[str, Any] = {k: ms(v) for k, v in t.items()}
    out["upstream_first_chunk"] = ms(direct)
    out["successor_vs_fresh_p50"] = round(out["successor_created"]["p50"] / out["fresh_created"]["p50"], 3)
    return out


def table(r: dict[str, Any]) -> str:
    lines = []
    for key, what in (("pairs_fast", "fast upstream"), ("pairs_paced", "paced upstream")):
        p = r[key]
        lines += [
            f"two streamed responses at once, {what} ({p['chunks']} chunks), {r['pair_rounds']} rounds"
            " (ms p50 / p95):",
            *(
                f"  {k:<8} {p[k]['p50']:>9} / {p[k]['p95']:<9}"
                for k in ("lanes", "sockets", "fifo", "direct")
            ),
            f"  lanes/sockets {p['lanes_vs_sockets_p50']}  lanes/fifo {p['lanes_vs_fifo_p50']}  "
            f"lanes/direct {p['lanes_vs_direct_p50']}",
        ]
    for key, what in (("steer_paced", "paced upstream"), ("steer_fast", "fast upstream (busy relay)")):
        s = r[key]
        lines += [
            f"steer after the first delta, {what}, {r['steer_rounds']} rounds"
            " (ms from the steer, p50 / p95):",
            *(
                f"  {k:<20} {s[k]['p50']:>9} / {s[k]['p95']:<9}"
                for k in (
                    "accepted",
                    "incomplete",
                    "successor_created",
                    "fresh_created",
                    "upstream_first_chunk",
                )
            ),
            f"  successor_created / fresh_created {s['successor_vs_fresh_p50']}",
        ]
    return "\n".join(lines)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    upstream, fast = start_upstream(16)
    paced = Paced(args.pace_ms / 1000)
    server = await paced.start()
    gateway = None
    try:
        with tempfile.TemporaryDirectory() as tmp:
            config = Path(tmp) / "gateway.yaml"
            name = ADAPTER_PROVIDERS["openai-chat"][0]
            models = {
                "fast-short": (name, f"fake-{args.chunks}"),
                "fast-long": (name, f"fake-{LONG}"),
                "paced-short": ("paced", f"fake-{args.paced_chunks}"),
                "paced-long": ("paced", f"fake-{LONG}"),
            }
            write_config(config, fast, paced.port, models)
            gateway, gw_port = start_gateway(config, Path(tmp) / "gateway.log")
            url = f"ws://{HOST}:{gw_port}/v1/responses"
            result: dict[str, Any] = {
                "pace_ms": args.pace_ms,
                "pair_rounds": args.pairs,
                "steer_rounds": args.steers,
            }
            result["pairs_fast"] = {
                "chunks": args.chunks,
                **await pairs(url, fast, args.pairs, "fast-short", args.chunks),
            }
            result["pairs_paced"] = {
                "chunks": args.paced_chunks,
                **await pairs(url, paced.port, args.pairs, "paced-short", args.paced_chunks),
            }
            result["steer_paced"] = await steers(url, paced.port, args.steers, "paced-long", LONG)
            result["steer_fast"] = await steers(url, fast, args.steers, "fast-long", LONG)
    finally:
        if gateway is not None:
            gateway.stop()
        upstream.stop()
        server.close()
    return result


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pairs", type=int, default=40, help="rounds of each two-response mode")
    parser.add_argument("--steers", type=int, default=30, help="steering rounds per upstream")
    parser.add_argument("--chunks", type=int, default=200, help="chunks of each stream, fast upstream")
    parser.add_argument("--paced-chunks", type=int, default=20, help="chunks of each stream, paced upstream")
    parser.add_argument("--pace-ms", type=float, default=10.0, help="the paced upstream's ms between chunks")
    args = parser.parse_args()
    result = asyncio.run(run(args))
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"lanes-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))
    print(table(result))
    print(f"raw results: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
