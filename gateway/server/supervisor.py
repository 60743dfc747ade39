"""``serve --workers N``: one listening socket, N worker processes serving it.

The parent binds the socket once and starts each worker as ``python -m gateway serve ... --worker-fd
FD``: the same server as a single process, on the inherited socket (the kernel hands each new
connection to one of them). The parent restarts a worker that dies (with backoff), forwards
SIGTERM/SIGINT (every worker drains, as a single process does) and SIGHUP (every worker reloads its
config), and exits once every worker has: 0 when all of them stopped cleanly.

Workers run in their own process group, so a terminal's Ctrl-C reaches them once, through the
parent; a worker whose parent is gone shuts itself down (gateway/server/server.py).

Prometheus (prometheus_client's multiprocess mode): the parent makes a fresh directory for the
workers' metric files, names it in every worker's ``PROMETHEUS_MULTIPROC_DIR`` (set before the
worker imports anything), marks a worker dead there when it exits, and removes it at the end.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType

import structlog

from gateway.observability.multiprocess import serve_port, stop_serving

log = structlog.get_logger("gateway.supervisor")

BACKLOG = 2048  # uvicorn's default
TICK_SECONDS = 0.1
BACKOFF_FIRST = 0.5  # seconds before restarting a worker that died; doubled per quick death
BACKOFF_MAX = 30.0
HEALTHY_SECONDS = 30.0  # a worker that ran this long before dying is restarted at once (backoff reset)
# What a worker that stopped cleanly on a forwarded signal returns: uvicorn re-raises the signal
# after its shutdown, so the process ends by it.
CLEAN_EXITS = frozenset({0, -signal.SIGTERM, -signal.SIGINT})


def bind(host: str, port: int) -> socket.socket:
    """The listening socket every worker shares (inheritable: it crosses their exec)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host.strip("[]"), port))
    sock.listen(BACKLOG)
    sock.set_inheritable(True)
    return sock


@dataclass
class Slot:
    """One worker's place: the process in it now, and when to start the next after a death."""

    index: int
    proc: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    quick_deaths: int = 0
    start_at: float = 0.0  # when the slot is empty: the earliest time to start a worker in it
    stops_sent: int = 0  # how many of the stop signals received were passed to this process
    last_exit: int | None = None


def _ignore_sighup() -> None:
    # Until the worker installs its reload handler, a SIGHUP (a reload sent to every worker while
    # this one starts) must not kill it; it reads the config after this anyway.
    signal.signal(signal.SIGHUP, signal.SIG_IGN)


class Supervisor:
    """``command(fd)``: the argv of a worker serving the socket on file descriptor ``fd``.
    ``stop_seconds``: how long the workers may take to drain before they are killed."""

    def __init__(
        self,
        command: Callable[[int], list[str]],
        sock: socket.socket,
        workers: int,
        stop_seconds: float,
        metrics_listener: tuple[str, int] | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.command = command
        self.sock: socket.socket | None = sock
        self.fd = sock.fileno()
        self.slots = [Slot(i) for i in range(workers)]
        self.stop_seconds = stop_seconds
        self.stops: list[int] = []  # SIGTERM / SIGINT received, in order
        self.hups = 0
        self.hups_sent = 0
        self.failed = False
        self.metrics_dir = tempfile.mkdtemp(prefix="gateway-metrics-")
        self.env = {**os.environ, **(env or {}), "PROMETHEUS_MULTIPROC_DIR": self.metrics_dir}
        # ``metrics.port``: served here, in the parent, over every worker's files (a worker with
        # PROMETHEUS_MULTIPROC_DIR set never opens it)
        self.metrics_listener = metrics_listener

    # -- signals -------------------------------------------------------------------------------
    def _on_stop(self, sig: int, frame: FrameType | None) -> None:
        self.stops.append(sig)  # passed on by the loop (a worker being started is not missed)

    def _on_hup(self, sig: int, frame: FrameType | None) -> None:
        self.hups += 1

    # -- the loop ------------------------------------------------------------------------------
    def run(self) -> int:
        previous = {
            sig: signal.signal(sig, handler)
            for sig, handler in (
                (signal.SIGTERM, self._on_stop),
                (signal.SIGINT, self._on_stop),
                (signal.SIGHUP, self._on_hup),
            )
        }
        listener = None
        if self.metrics_listener is not None:
            listener = serve_port(*self.metrics_listener, path=self.metrics_dir)
        try:
            self._loop()
        finally:
            if listener is not None:
                stop_serving(listener)
            for slot in self.slots:  # only on an error in the loop itself
                if slot.proc is not None and slot.proc.poll() is None:
                    slot.proc.kill()
                    slot.proc.wait()
            self._close_socket()
            shutil.rmtree(self.metrics_dir, ignore_errors=True)
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        code = 1 if self.failed else 0
        log.info("supervisor_stopped", exit_code=code)
        return code

    def _loop(self) -> None:
        deadline: float | None = None
        while True:
            now = time.monotonic()
            self._reap(now)
            if self.stops and deadline is None:
                log.info("supervisor_stopping", signal=signal.Signals(self.stops[0]).name)
                deadline = now + self.stop_seconds
                self._close_socket()  # no worker will be started again
            live = [s for s in self.slots if s.proc is not None]
            if deadline is not None:
                if not live:
                    return
                self._pass_stops(live)
                if now > deadline:
                    for slot in live:
                        log.error(
                            "worker_killed",
                            worker=slot.index,
                            pid=_pid(slot),
                            after_seconds=self.stop_seconds,
                        )
                        with contextlib.suppress(ProcessLookupError):
                            _proc(slot).kill()
                    self.failed = True
                    deadline = now + 5.0  # for them to be reaped
            else:
                self._pass_hups(live)
                for slot in self.slots:
                    if slot.proc is None and now >= slot.start_at:
                        self._start(slot)
            time.sleep(TICK_SECONDS)

    def _start(self, slot: Slot) -> None:
        try:
            proc = subprocess.Popen(
                self.command(self.fd),
                env=self.env,
                pass_fds=(self.fd,),
                process_group=0,
                preexec_fn=_ignore_sighup,
            )
        except OSError as exc:
            log.error("worker_start_failed", worker=slot.index, error=str(exc))
            self._back_off(slot, time.monotonic())
            return
        slot.proc, slot.started, slot.stops_sent = proc, time.monotonic(), 0
        log.info("worker_started", worker=slot.index, pid=proc.pid)

    def _reap(self, now: float) -> None:
        for slot in self.slots:
            proc = slot.proc
            if proc is None or (code := proc.poll()) is None:
                continue
            slot.proc, slot.last_exit = None, code
            _mark_dead(proc.pid, self.metrics_dir)
            if self.stops:
                clean = code in CLEAN_EXITS
                self.failed |= not clean
                (log.info if clean else log.error)(
                    "worker_exited", worker=slot.index, pid=proc.pid, returncode=code
                )
                continue
            if now - slot.started >= HEALTHY_SECONDS:
                slot.quick_deaths = 0
            self._back_off(slot, now)
            log.error(
                "worker_exited",
                worker=slot.index,
                pid=proc.pid,
                returncode=code,
                restart_in_seconds=round(slot.start_at - now, 2),
            )

    def _back_off(self, slot: Slot, now: float) -> None:
        delay = (
            0.0 if slot.quick_deaths == 0 else min(BACKOFF_MAX, BACKOFF_FIRST * 2 ** (slot.quick_deaths - 1))
        )
        slot.quick_deaths += 1
        slot.start_at = now + delay

    def _pass_stops(self, live: list[Slot]) -> None:
        for slot in live:
            for sig in self.stops[slot.stops_sent :]:
                with contextlib.suppress(ProcessLookupError):
                    _proc(slot).send_signal(sig)
            slot.stops_sent = len(self.stops)

    def _pass_hups(self, live: list[Slot]) -> None:
        if self.hups == self.hups_sent:
            return
        self.hups_sent = self.hups
        log.info("supervisor_reload", workers=len(live))
        for slot in live:
            with contextlib.suppress(ProcessLookupError):
                _proc(slot).send_signal(signal.SIGHUP)

    def _close_socket(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None


def _proc(slot: Slot) -> subprocess.Popen[bytes]:
    assert slot.proc is not None
    return slot.proc


def _pid(slot: Slot) -> int | None:
    return slot.proc.pid if slot.proc is not None else None


def _mark_dead(pid: int, path: str) -> None:
    """Tell prometheus_client that ``pid`` is gone (its live gauges stop counting)."""
    from prometheus_client import multiprocess  # here: only the supervisor needs it

    multiprocess.mark_process_dead(pid, path)
