"""CPU per upstream call of the gateway's HTTP client (``adapters/transport.py`` over
``adapters/http1/``), in process, against the bench fake upstream: a small streamed POST, a
64-chunk and a 4096-chunk stream, each body read with ``next_chunk``; ``bench/lib/load.py``'s raw client
(a bare asyncio protocol that scans the bytes for its markers) in the same run. ``--against TREE`` adds
another checkout's ``adapters/transport.py`` (e.g. one still on aiohttp), loaded from its file.

    python -m bench client_cost [--reps 3] [--against ../other-tree]

About half a minute; medians over ``--reps``, CPU from ``time.process_time``.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import statistics
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import ModuleType

import orjson
import structlog
import uvloop

import adapters.transport
from bench.lib.load import Conn, Patterns, post
from bench.lib.procs import HOST, start_upstream
from gateway.kernel.settings import ProviderSettings

CASES = (
    ("small streamed POST", "fake-1", 3000),
    ("64-chunk stream", "fake-64", 1000),
    ("4096 chunks", "fake-4096", 30),
)
PATH = "/v1/chat/completions"


def _load(tree: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location("other_transport", Path(tree) / "adapters" / "transport.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def _cpu_us(call: Callable[[], Awaitable[object]], n: int) -> float:
    for _ in range(max(5, n // 10)):
        await call()
    start = time.process_time()
    for _ in range(n):
        await call()
    return 1e6 * (time.process_time() - start) / n


async def main(reps: int, against: str | None, port: int) -> None:
    settings = ProviderSettings(kind="openai-chat", base_url=f"http://{HOST}:{port}/v1")
    modules = {"this tree": adapters.transport, **({against: _load(against)} if against else {})}
    clients = {name: (m, m.UpstreamClient(settings)) for name, m in modules.items()}
    raw = await Conn.open(HOST, port)
    results: dict[tuple[str, str], list[float]] = {}
    for _ in range(reps):
        for label, model, n in CASES:
            body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": True}
            for name, (m, client) in clients.items():

                async def one(m: ModuleType = m, client: object = client, body: object = body) -> None:
                    async with m.open_stream(
                        client,
                        "POST",
                        f"http://{HOST}:{port}{PATH}",
                        json_body=body,
                        headers={},
                        total_timeout=30,
                    ) as up:
                        while await up.next_chunk() is not None:
                            pass

                results.setdefault((label, name), []).append(await _cpu_us(one, n))
            request = post(HOST, port, PATH, orjson.dumps(body))

            async def floor(request: bytes = request) -> None:
                await raw.request(request, Patterns(), keep_body=True)

            results.setdefault((label, "bench/lib/load.py raw client"), []).append(await _cpu_us(floor, n))
    for (label, name), values in results.items():
        print(f"{label:20} {name:28} CPU per call {statistics.median(values):9.1f} µs")
    for _, client in clients.values():
        await client.aclose()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--against", help="another checkout whose adapters/transport.py to measure too")
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    upstream, port = start_upstream(16)
    try:
        uvloop.run(main(args.reps, args.against, port))
    finally:
        upstream.stop()
