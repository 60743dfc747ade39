"""Instructions per WebSocket turn, counted by valgrind's callgrind: a figure machine noise can't move.

``relay`` times the gateway on a shared machine, where the same code measured 2× apart an hour
apart. This scenario counts what the gateway's process executes instead: the gateway runs under
``valgrind --tool=callgrind`` with instrumentation off through start-up and a warm-up conversation;
then ``callgrind_control`` turns it on for ``--turns`` WebSocket turns (a ~1 KB user message, an
``--answer``-delta answer, ``previous_response_id``, ``store: false``, the same client as ``relay``)
and dumps the count. The same is done for the fake upstream's process (the direct baseline's own
work per turn: one Chat Completions stream), and, with ``--against TREE``, for another checkout's
gateway in the same run, so a change can be weighed against its parent in instructions, not in
seconds. The count is repeatable to well under 1% for the same tree and inputs.

    python -m bench instructions                         # this tree, about 3 minutes
    python -m bench instructions --against /path/to/old  # and another checkout, side by side

Needs ``valgrind`` (Debian's package) on PATH. Writes ``bench/results/instructions-<UTC time>.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

from bench.lib.procs import HOST, RESULTS, ROOT, free_port, http_get
from bench.scenarios.relay import config, conv_ws

_TOTALS = re.compile(rb"^(?:summary|totals):\s+(\d+)", re.MULTILINE)


class Counted:
    """A process under callgrind with instrumentation off until :meth:`count` turns it on."""

    def __init__(self, name: str, argv: list[str], cwd: Path, env: dict[str, str], out: Path) -> None:
        self.name = name
        self.out = out
        self.log = out.with_suffix(".log")
        valgrind = [
            "valgrind",
            "--tool=callgrind",
            "--instr-atstart=no",
            f"--callgrind-out-file={out}.%p",
            f"--log-file={self.log}",
        ]
        self.popen = subprocess.Popen(
            [*valgrind, *argv], cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT
        )

    def _control(self, *args: str) -> None:
        subprocess.run(["callgrind_control", *args, str(self.popen.pid)], check=True, capture_output=True)

    def start(self) -> None:
        self._control("--zero")
        self._control("--instr=on")

    def stop_counting(self) -> int:
        """Dump, turn instrumentation off, and return the instructions executed since :meth:`start`."""
        before = set(self.out.parent.glob(f"{self.out.name}.{self.popen.pid}*"))
        self._control("--dump")
        self._control("--instr=off")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            dumps = set(self.out.parent.glob(f"{self.out.name}.{self.popen.pid}*")) - before
            for dump in dumps:
                match = _TOTALS.search(dump.read_bytes())
                if match:
                    return int(match.group(1))
            time.sleep(0.2)
        raise RuntimeError(f"{self.name}: no callgrind dump appeared")

    def stop(self) -> None:
        self.popen.terminate()
        try:
            self.popen.wait(60)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait(10)


def _env(tree: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONHASHSEED"] = "0"
    env["PYTHONPATH"] = str(tree)
    return env


def _wait_healthy(proc: Counted, port: int, timeout: float = 600.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.popen.poll() is not None:
            raise RuntimeError(f"{proc.name} exited at start-up (see {proc.log})")
        with contextlib.suppress(OSError):
            status, _ = http_get(port, "/healthz", timeout=10.0)
            if status == 200:
                return
        time.sleep(0.5)
    raise RuntimeError(f"{proc.name} did not become healthy")


def _upstream(scratch: Path) -> tuple[Counted, int]:
    port = free_port()
    argv = [sys.executable, "-m", "bench.lib.upstream", "--port", str(port), "--chunks", "16"]
    proc = Counted("upstream", argv, ROOT, _env(ROOT), scratch / "upstream.cg")
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            import socket

            socket.create_connection((HOST, port), timeout=1).close()
            return proc, port
        time.sleep(0.5)
    raise RuntimeError("the fake upstream did not start")


def parse_counted(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """A counting scenario's arguments, with ``--against``, once valgrind is known to be there."""
    parser.add_argument(
        "--against", type=Path, action="append", default=[], help="another checkout, side by side"
    )
    args = parser.parse_args(argv)
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        raise SystemExit(f"{parser.prog}: needs valgrind (and callgrind_control) on PATH")
    return args


def counted_gateway(tree: Path, cfg: Path, scratch: Path) -> tuple[Counted, int]:
    """``tree``'s gateway serving ``cfg`` under callgrind, instrumentation off, and its port."""
    port = free_port()
    argv = [sys.executable, "-m", "gateway", "serve", "--config", str(cfg), "--host", HOST]
    argv += ["--port", str(port)]
    return Counted("gateway", argv, tree, _env(tree), scratch / f"gateway-{abs(hash(str(tree)))}.cg"), port


def measure_tree(
    tree: Path, up: Counted, up_port: int, args: argparse.Namespace, scratch: Path
) -> dict[str, Any]:
    label = "this tree" if tree == ROOT else str(tree)
    cfg = scratch / f"gateway-{abs(hash(str(tree)))}.yaml"
    cfg.write_text(config(up_port, args.answer, 16, None))
    gw, port = counted_gateway(tree, cfg, scratch)
    try:
        _wait_healthy(gw, port)
        asyncio.run(conv_ws(port, "relay-chat", args.warmup))
        gw.start()
        up.start()
        asyncio.run(conv_ws(port, "relay-chat", args.turns))
        gateway_ir = gw.stop_counting()
        upstream_ir = up.stop_counting()
    finally:
        gw.stop()
    result = {
        "tree": label,
        "commit": _commit(tree),
        "gateway_ir_per_turn": gateway_ir / args.turns,
        "upstream_ir_per_turn": upstream_ir / args.turns,
    }
    result["ratio_to_upstream"] = result["gateway_ir_per_turn"] / result["upstream_ir_per_turn"]
    return result


def _commit(tree: Path) -> str:
    done = subprocess.run(
        ["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    return done.stdout.strip() or "?"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench instructions", description=__doc__.split("\n")[0])
    parser.add_argument("--turns", type=int, default=40, help="counted WebSocket turns (default 40)")
    parser.add_argument("--warmup", type=int, default=10, help="uncounted turns first (default 10)")
    parser.add_argument("--answer", type=int, default=8, help="deltas per answer (default 8)")
    args = parse_counted(parser, argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-instructions-") as tmp:
        scratch = Path(tmp)
        up, up_port = _upstream(scratch)
        try:
            for tree in [ROOT, *(path.resolve() for path in args.against)]:
                rows.append(measure_tree(tree, up, up_port, args, scratch))
        finally:
            up.stop()
    base = rows[0]["gateway_ir_per_turn"]
    print(f"{'tree':<40} {'commit':<10} {'gateway Ir/turn':>16} {'× upstream':>11} {'× this tree':>12}")
    for row in rows:
        print(
            f"{row['tree'][-40:]:<40} {row['commit']:<10} {row['gateway_ir_per_turn']:>16,.0f}"
            f" {row['ratio_to_upstream']:>11.2f} {row['gateway_ir_per_turn'] / base:>12.3f}"
        )
    RESULTS.mkdir(exist_ok=True)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    out = RESULTS / f"instructions-{stamp}.json"
    out.write_bytes(
        orjson.dumps({"args": vars(args) | {"against": [str(p) for p in args.against]}, "rows": rows})
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
