"""Process plumbing for the benchmark: start the fake upstream, the gateway and the load worker as
separate processes on loopback, read their memory, and stop them (only the ones started here)."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

import orjson

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"
HOST = "127.0.0.1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def proc_status(pid: int) -> dict[str, int]:
    """VmRSS / VmHWM (peak RSS) / Threads etc. of a process, in kB (as /proc reports them)."""
    out: dict[str, int] = {}
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return out
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile", "Threads"):
            out[key] = int(value.split()[0])
    return out


def cpu_times() -> list[int]:
    """The machine's CPU time counters (``/proc/stat`` "cpu" line): user nice system idle iowait irq
    softirq steal ..., in clock ticks."""
    with open("/proc/stat") as f:
        return [int(x) for x in f.readline().split()[1:]]


def machine_share(before: list[int], after: list[int]) -> dict[str, float]:
    """How the machine's CPUs were spent between two ``cpu_times`` readings, in percent."""
    names = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
    delta = [a - b for a, b in zip(after[:8], before[:8], strict=True)]
    total = sum(delta) or 1
    return {n: round(100 * d / total, 1) for n, d in zip(names, delta, strict=True)}


def fd_count(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return -1


def http_get(port: int, path: str, timeout: float = 2.0) -> tuple[int, bytes]:
    return http_request(port, "GET", path, timeout=timeout)


def http_request(
    port: int, method: str, path: str, body: bytes = b"", timeout: float = 2.0
) -> tuple[int, bytes]:
    """One request on a fresh connection (``Connection: close``); the status and the (de-chunked) body."""
    head = f"{method} {path} HTTP/1.1\r\nHost: {HOST}:{port}\r\nConnection: close\r\n"
    if body or method == "POST":
        head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    with socket.create_connection((HOST, port), timeout=timeout) as s:
        s.sendall(head.encode() + b"\r\n" + body)
        chunks = []
        while True:
            data = s.recv(65536)
            if not data:
                break
            chunks.append(data)
    raw = b"".join(chunks)
    head_bytes, _, payload = raw.partition(b"\r\n\r\n")
    if b"transfer-encoding: chunked" in head_bytes.lower():
        payload = _dechunk(payload)
    return int(head_bytes[9:12]), payload


def _dechunk(raw: bytes) -> bytes:
    out: list[bytes] = []
    pos = 0
    while (eol := raw.find(b"\r\n", pos)) >= 0:
        size = int(raw[pos:eol].split(b";")[0] or b"0", 16)
        if size == 0:
            break
        out.append(raw[eol + 2 : eol + 2 + size])
        pos = eol + 2 + size + 2
    return b"".join(out)


class Proc:
    """A child process started by the benchmark; ``stop`` ends exactly this process."""

    def __init__(self, name: str, argv: list[str], stdout: Any = None, stderr: Any = None, stdin: Any = None):
        self.name = name
        self.argv = argv
        self.popen = subprocess.Popen(argv, cwd=ROOT, stdin=stdin, stdout=stdout, stderr=stderr)
        self.pid = self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stop(self, timeout: float = 10.0) -> None:
        if not self.alive():
            return
        with contextlib.suppress(ProcessLookupError):
            self.popen.send_signal(signal.SIGTERM)
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                self.popen.kill()
            self.popen.wait(5)


def start_upstream(chunks: int) -> tuple[Proc, int]:
    proc = Proc(
        "upstream",
        [sys.executable, "-m", "bench.lib.upstream", "--port", "0", "--chunks", str(chunks)],
        stdout=subprocess.PIPE,
    )
    assert proc.popen.stdout is not None
    ready, _, _ = select.select([proc.popen.stdout], [], [], 15)
    line = proc.popen.stdout.readline().decode() if ready else ""
    if not line.startswith("READY "):
        proc.stop()
        raise RuntimeError(f"fake upstream did not start: {line!r}")
    return proc, int(line.split()[1])


# Every adapter kind the benchmark routes to the fake: (provider name in the config, base URL path).
# openai-chat / openai-responses take the /v1 root, anthropic the origin (it appends /v1/messages),
# gemini the /v1beta root (it appends /models/{model}:streamGenerateContent?alt=sse).
ADAPTER_PROVIDERS: dict[str, tuple[str, str]] = {
    "openai-chat": ("up", "/v1"),
    "openai-responses": ("up-responses", "/v1"),
    "anthropic": ("up-anthropic", ""),
    "gemini": ("up-gemini", "/v1beta"),
}


def write_config(
    path: Path, upstream_port: int, log_level: str, models: dict[str, str | tuple[str, str]]
) -> None:
    """A gateway config with one provider per adapter kind, all pointing at the fake on
    ``upstream_port``. ``models``: gateway model → upstream model (provider ``up``, openai-chat) or
    (provider, upstream model). The providers relay one event per upstream delta
    (``merge_deltas: false``): this benchmark's event counts and events/s are per upstream chunk, as
    its checks expect (the fake writes a whole stream at once, which the default would merge into a
    few events). ``up-merged`` (openai-chat, the default ``merge_deltas``) serves the agent
    conversation, a latency figure of the default configuration."""
    lines = ["log:", f"  level: {log_level}", "providers:"]
    for kind, (name, base) in ADAPTER_PROVIDERS.items():
        lines += [
            f"  {name}:",
            f"    kind: {kind}",
            f"    base_url: http://{HOST}:{upstream_port}{base}",
            "    api_key: sk-bench",
            "    merge_deltas: false",
        ]
    lines += [
        "  up-merged:",
        "    kind: openai-chat",
        f"    base_url: http://{HOST}:{upstream_port}/v1",
        "    api_key: sk-bench",
    ]
    lines.append("models:")
    for name, up in models.items():
        provider, model = up if isinstance(up, tuple) else ("up", up)
        lines.append(f"  {name}: {{provider: {provider}, upstream_model: {model}}}")
    path.write_text("\n".join(lines) + "\n")


def start_gateway(
    config: Path, log_path: Path, port: int | None = None, timeout: float = 30.0
) -> tuple[Proc, int]:
    port = port or free_port()
    log_file: IO[bytes] = log_path.open("wb")
    proc = Proc(
        "gateway",
        [
            sys.executable,
            "-m",
            "gateway",
            "serve",
            "--config",
            str(config),
            "--host",
            HOST,
            "--port",
            str(port),
        ],
        stdout=log_file,
        stderr=log_file,
    )
    log_file.close()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not proc.alive():
            raise RuntimeError(f"gateway exited at start-up:\n{log_path.read_text()[-3000:]}")
        with contextlib.suppress(OSError):
            status, _ = http_get(port, "/healthz")
            if status == 200:
                return proc, port
        time.sleep(0.1)
    proc.stop()
    raise RuntimeError(f"gateway did not become healthy:\n{log_path.read_text()[-3000:]}")


class LoadWorker:
    """``python -m bench.lib.load``: one JSON command per line in, one JSON answer per line out."""

    def __init__(self) -> None:
        self.proc = Proc(
            "load", [sys.executable, "-m", "bench.lib.load"], stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )

    def run(self, cmd: dict[str, Any], timeout: float) -> Any:
        p = self.proc.popen
        assert p.stdin is not None and p.stdout is not None
        p.stdin.write(orjson.dumps(cmd) + b"\n")
        p.stdin.flush()
        ready, _, _ = select.select([p.stdout], [], [], timeout)
        if not ready:
            raise TimeoutError(f"load worker gave no answer to {cmd['cmd']} within {timeout:.0f} s")
        line = p.stdout.readline()
        if not line:
            raise RuntimeError("load worker exited")
        answer = orjson.loads(line)
        if not answer.get("ok"):
            raise RuntimeError(f"load worker failed: {answer.get('error')}")
        return answer["result"]

    def stop(self) -> None:
        p = self.proc.popen
        if self.proc.alive() and p.stdin is not None:
            with contextlib.suppress(OSError):
                p.stdin.write(b'{"cmd":"quit"}\n')
                p.stdin.flush()
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.stop()
