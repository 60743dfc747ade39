"""Instructions per JSON request of each client API, counted by valgrind's callgrind: what each
ingress costs the gateway next to ``POST /v1/responses`` on the same route, in a figure machine
noise can't move (``run``'s ingress stages time the same requests, within ±0.1 ms between runs).

One gateway under callgrind (instrumentation off through start-up), one fake upstream. For each
target in turn: ``--warmup`` requests, then ``--requests`` counted ones on one keep-alive
connection, each the same request as ``run``'s ingress stages: ``/v1/messages`` and
``/v1/responses`` through the ``anthropic`` adapter, ``/v1/chat/completions`` and
``/v1/responses`` through ``openai-chat``. The fake upstream's own instructions for the same
requests sent straight to it are the direct baseline.

    python -m bench ingress                  # this tree, about 2 minutes
    python -m bench ingress --against /old   # and another checkout, side by side
    python -m bench ingress --stream         # SSE of 16 chunks instead: instructions per stream

Needs ``valgrind`` on PATH. Writes ``bench/results/ingress-<UTC time>.json``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import http.client
import tempfile
from pathlib import Path
from typing import Any

import orjson

from bench.lib.procs import HOST, RESULTS, ROOT, write_config
from bench.scenarios.instructions import (
    Counted,
    _commit,
    _upstream,
    _wait_healthy,
    counted_gateway,
    parse_counted,
)
from bench.scenarios.run import GATEWAY_MODELS, PROMPT, SHORT_CHUNKS, direct_native, gw_body


def targets(stream: bool) -> dict[str, tuple[str, str, dict[str, Any]]]:
    """name → (the route it is compared with, path, body): JSON, or SSE of ``SHORT_CHUNKS`` chunks."""
    tail = "-sse" if stream else ""
    on = {"stream": True} if stream else {}
    return {
        "responses→anthropic": ("", "/v1/responses", gw_body(f"adapter-anthropic{tail}", stream)),
        "messages→anthropic": (
            "responses→anthropic",
            "/v1/messages",
            {**direct_native("anthropic", False)[1], "model": f"adapter-anthropic{tail}", **on},
        ),
        "responses→openai-chat": ("", "/v1/responses", gw_body(f"adapter-openai-chat{tail}", stream)),
        "chat→openai-chat": (
            "responses→openai-chat",
            "/v1/chat/completions",
            {"model": f"adapter-openai-chat{tail}", "messages": [{"role": "user", "content": PROMPT}], **on},
        ),
    }


def _direct(stream: bool) -> dict[str, tuple[str, dict[str, Any]]]:
    return {kind: direct_native(kind, stream) for kind in ("anthropic", "openai-chat")}


_HEADERS = {"content-type": "application/json", "authorization": "Bearer sk-bench"}


def _send(conn: http.client.HTTPConnection, path: str, body: bytes, n: int) -> None:
    for _ in range(n):
        conn.request("POST", path, body, _HEADERS)
        answer = conn.getresponse()
        payload = answer.read()
        if answer.status != 200:
            raise RuntimeError(f"{path}: {answer.status} {payload[:200]!r}")


def measure_tree(
    tree: Path, up: Counted, up_port: int, args: argparse.Namespace, scratch: Path
) -> dict[str, Any]:
    cfg = scratch / f"gateway-{abs(hash(str(tree)))}.yaml"
    write_config(cfg, up_port, "warning", GATEWAY_MODELS)
    gw, port = counted_gateway(tree, cfg, scratch)
    per_request: dict[str, float] = {}
    try:
        _wait_healthy(gw, port)
        conn = http.client.HTTPConnection(HOST, port, timeout=120)
        for name, (_, path, body) in targets(args.stream).items():
            payload = orjson.dumps(body)
            _send(conn, path, payload, args.warmup)
            gw.start()
            _send(conn, path, payload, args.requests)
            per_request[name] = gw.stop_counting() / args.requests
    finally:
        gw.stop()
    return {"tree": "this tree" if tree == ROOT else str(tree), "commit": _commit(tree), "ir": per_request}


def measure_direct(up: Counted, up_port: int, args: argparse.Namespace) -> dict[str, float]:
    conn = http.client.HTTPConnection(HOST, up_port, timeout=120)
    out: dict[str, float] = {}
    for kind, (path, body) in _direct(args.stream).items():
        payload = orjson.dumps(body)
        _send(conn, path, payload, args.warmup)
        up.start()
        _send(conn, path, payload, args.requests)
        out[kind] = up.stop_counting() / args.requests
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench ingress", description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=100, help="counted requests per target (100)")
    parser.add_argument("--warmup", type=int, default=30, help="uncounted requests first (30)")
    parser.add_argument(
        "--stream", action="store_true", help=f"SSE requests of {SHORT_CHUNKS} chunks instead of JSON"
    )
    args = parse_counted(parser, argv)
    with tempfile.TemporaryDirectory(prefix="bench-ingress-") as tmp:
        scratch = Path(tmp)
        up, up_port = _upstream(scratch)
        try:
            direct = measure_direct(up, up_port, args)
            rows = [measure_tree(tree, up, up_port, args, scratch) for tree in [ROOT, *args.against]]
        finally:
            up.stop()
    unit = "stream" if args.stream else "request"
    figures = ", ".join(f"{k} {v:,.0f}" for k, v in direct.items())
    print(f"direct upstream, instructions per {unit}: {figures}")
    for row in rows:
        print(f"\n{row['tree']} ({row['commit']})")
        print(f"  {'target':<24} {'gateway Ir/' + unit:>19} {'× its Responses route':>22}")
        for name, (base, _, _) in targets(args.stream).items():
            ir = row["ir"][name]
            ratio = f"{ir / row['ir'][base]:.3f}" if base else ""
            print(f"  {name:<24} {ir:>19,.0f} {ratio:>22}")
    RESULTS.mkdir(exist_ok=True)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    out = RESULTS / f"ingress-{'sse-' if args.stream else ''}{stamp}.json"
    meta = vars(args) | {"against": [str(p) for p in args.against]}
    out.write_bytes(orjson.dumps({"args": meta, "direct": direct, "rows": rows}))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
