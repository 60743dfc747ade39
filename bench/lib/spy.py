"""Sampling profiles of the gateway under load, with py-spy (``pip install py-spy``).

``Recorder`` runs ``py-spy record --format raw`` (collapsed stacks) on a pid for the duration of
one load stage; ``summarize`` turns the collapsed stacks into shares of the sampled (non-idle)
time: per function self time (the frame at the top of the stack) and inclusive time (anywhere on
the stack), and self time per source file. py-spy samples only threads that are running Python
code by default, so time the event loop spends waiting in epoll does not appear.

Stand-alone: ``python -m bench spy bench/results/profile-json_c64.txt`` prints the summary.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

# Leaf frames that mean "inside uvloop's C event loop": socket I/O and callbacks run in C, and also
# waiting in epoll, which py-spy cannot tell from work for uvloop (it holds the GIL there).
LOOP_LEAVES = ("Runner.run", "Server.serve", "_set_result_unless_cancelled")
LOOP = "[event loop: uvloop C code, I/O and waiting]"
_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")


def py_spy() -> str | None:
    exe = Path(sys.executable).parent / "py-spy"
    if exe.exists():
        return str(exe)
    return shutil.which("py-spy")


class Recorder:
    def __init__(self, pid: int, out: Path, seconds: float, rate: int = 250) -> None:
        exe = py_spy()
        if exe is None:
            raise RuntimeError("py-spy is not installed (pip install py-spy)")
        self.out = out
        self.proc = subprocess.Popen(
            [
                exe,
                "record",
                "--pid",
                str(pid),
                "--format",
                "raw",
                "--output",
                str(out),
                "--duration",
                str(max(1, round(seconds))),
                "--rate",
                str(rate),
                "--nonblocking",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )

    def wait(self, timeout: float = 60.0) -> str:
        try:
            _, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.terminate()
            _, err = self.proc.communicate(timeout=10)
        return err.decode(errors="replace")[-2000:]


def _short(frame: str) -> tuple[str, str]:
    """("func (module/file.py)", "module/file.py") with site-packages and repo prefixes trimmed."""
    m = _FRAME.match(frame)
    if not m:
        return frame, "?"
    path = m.group("file")
    for marker in ("site-packages/", "/lib/python3", "/work/main/"):
        i = path.find(marker)
        if i >= 0:
            path = path[i + len(marker) :]
            if marker == "/lib/python3":
                path = "stdlib" + path[path.find("/") :]
            break
    return f"{m.group('func')} ({path})", path


def summarize(raw: str, top: int = 25) -> dict[str, Any]:
    self_time: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    files: Counter[str] = Counter()
    total = 0
    for line in raw.splitlines():
        stack, _, count_s = line.rpartition(" ")
        if not stack or not count_s.isdigit():
            continue
        count = int(count_s)
        frames = [_short(f) for f in stack.split(";") if f and not f.startswith("process ")]
        frames = [f for f in frames if not f[0].startswith("thread (")]
        if not frames:
            continue
        total += count
        leaf, leaf_file = frames[-1]
        if leaf.split(" (")[0] in LOOP_LEAVES:
            leaf = leaf_file = LOOP
        self_time[leaf] += count
        files[leaf_file] += count
        for name in {f for f, _ in frames}:
            inclusive[name] += count

    def share(counter: Counter[str]) -> list[tuple[str, float]]:
        return [(name, round(100 * n / total, 1)) for name, n in counter.most_common(top)] if total else []

    loop = self_time.get(LOOP, 0)
    python = total - loop
    rest = Counter({k: v for k, v in self_time.items() if k != LOOP})
    return {
        "samples": total,
        "loop_share": round(100 * loop / total, 1) if total else 0.0,
        # self time as a share of the samples spent in Python code (the loop bucket left out)
        "self_python": [(n, round(100 * c / python, 1)) for n, c in rest.most_common(top)] if python else [],
        "self": share(self_time),
        "inclusive": share(inclusive),
        "self_by_file": share(files),
    }


def format_summary(title: str, summary: dict[str, Any], top: int = 15) -> str:
    lines = [
        f"{title}: {summary['samples']} samples, {summary.get('loop_share')}% of them in the event loop's "
        "C code (I/O, callbacks and waiting: not separable)"
    ]
    sections = (
        ("self_python", "self time, % of the samples in Python code"),
        ("inclusive", "inclusive time, % of all samples"),
        ("self_by_file", "self time by file, % of all samples"),
    )
    for key, label in sections:
        lines.append(f"  {label}:")
        lines += [f"    {pct:5.1f}%  {name}" for name, pct in summary.get(key, [])[:top]]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    for path in argv:
        print(format_summary(path, summarize(Path(path).read_text())))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
