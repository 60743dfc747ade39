"""``python -m bench <scenario> [options]``: run one benchmark (``python -m bench <scenario> --help``
for its options), or one of the tools the benchmarks use."""

from __future__ import annotations

import argparse
import runpy
import sys

# name -> (module run as __main__, what it does)
SCENARIOS: dict[str, tuple[str, str]] = {
    "run": ("bench.scenarios.run", "the gateway against the direct upstream, every stage (4-5 min)"),
    "relay": ("bench.scenarios.relay", "what the gateway adds per WebSocket turn and per relayed event"),
    "lanes": ("bench.scenarios.lanes", "WebSocket lanes and steering latency"),
    "workers": ("bench.scenarios.workers", "serve --workers 2 against one worker and the direct upstream"),
    "client_cost": ("bench.scenarios.client_cost", "CPU per upstream call of the gateway's HTTP client"),
    "chain_cost": ("bench.scenarios.chain_cost", "continuation cost against chain length, memory and Redis"),
    "overhead": ("bench.scenarios.overhead", "observability's cost: tracing off, on, metrics scraped"),
    "resume": ("bench.scenarios.resume", "replaying a background response's 4,096-event stream"),
    "instructions": ("bench.scenarios.instructions", "instructions per WebSocket turn, counted by callgrind"),
    "ingress": ("bench.scenarios.ingress_cost", "instructions per JSON request of each client API's route"),
}
TOOLS: dict[str, tuple[str, str]] = {
    "report": ("bench.lib.report", "print the table of a saved run again (FILE: bench/results/run-*.json)"),
    "spy": ("bench.lib.spy", "summarize a saved py-spy profile (FILE: bench/results/profile-*.txt)"),
    "upstream": ("bench.lib.upstream", "the fake upstream alone (--port N)"),
    "load": ("bench.lib.load", "the load generator alone (JSON commands on stdin)"),
}


def parser() -> argparse.ArgumentParser:
    lines = ["scenarios:"]
    lines += [f"  {name:<12} {what}" for name, (_, what) in SCENARIOS.items()]
    lines += ["", "tools:"]
    lines += [f"  {name:<12} {what}" for name, (_, what) in TOOLS.items()]
    p = argparse.ArgumentParser(
        prog="python -m bench",
        description=__doc__,
        epilog="\n".join(lines),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("name", choices=[*SCENARIOS, *TOOLS], metavar="scenario", help="what to run (below)")
    p.add_argument("args", nargs=argparse.REMAINDER, help="its options")
    return p


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    module, _ = {**SCENARIOS, **TOOLS}[args.name]
    sys.argv = [f"python -m bench {args.name}", *args.args]
    runpy.run_module(module, run_name="__main__")


if __name__ == "__main__":
    main()
