"""Live reload: re-read the config file and the environment, validate them with the one validator,
build a new ``Gateway`` and swap it in (gateway/api/live.py), or refuse and keep the old one.

Triggered by SIGHUP (gateway/server/server.py) or ``POST /admin/reload`` (gateway/api/admin.py). A worker
under the supervisor does not reload on its own from the admin route: it checks the config, then
signals the supervisor, which sends SIGHUP to every worker, itself included, and answers with the
outcome of its own reload. Settings that only take effect at start keep their running values and
are logged as needing a restart.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import structlog

from gateway.api.live import LiveGateway
from gateway.engine.orchestrator import Gateway
from gateway.kernel.settings import ConfigError, Settings

log = structlog.get_logger("gateway.api.reload")

# Read once at start: the listening socket and worker processes (server), the loggers (log), the
# stores and limiter (state: a new one would start empty), and the limits uvicorn's protocols and
# the shutdown drain were built with.
RESTART_SECTIONS = ("server", "log", "state", "metrics", "tracing")
RESTART_LIMITS = (
    "max_header_bytes",
    "header_read_seconds",
    "body_read_seconds",
    "max_ws_frame_bytes",
    "ws_drain_seconds",
)
SUPERVISOR_WAIT_SECONDS = 15.0  # for the supervisor's SIGHUP to reach this worker


@dataclass
class Outcome:
    accepted: bool
    problems: str | None = None  # the refusal, as check-config words it
    changed: list[str] = field(default_factory=list)  # top-level sections now in force
    restart_required: list[str] = field(default_factory=list)  # changed, kept until a restart
    status: int = 200

    def body(self) -> dict[str, Any]:
        return {
            "object": "gateway.reload",
            "accepted": self.accepted,
            "changed": self.changed,
            "restart_required": self.restart_required,
        }


def pin_restart_fields(running: Settings, new: Settings) -> tuple[Settings, list[str]]:
    """``new`` with every start-only field at its running value, and the names of those that differ."""
    restart = [name for name in RESTART_SECTIONS if getattr(new, name) != getattr(running, name)]
    restart += [f"limits.{n}" for n in RESTART_LIMITS if getattr(new.limits, n) != getattr(running.limits, n)]
    limits = new.limits.model_copy(update={n: getattr(running.limits, n) for n in RESTART_LIMITS})
    kept = {name: getattr(running, name) for name in RESTART_SECTIONS}
    return new.model_copy(update={**kept, "limits": limits}), restart


def changed_sections(running: Settings, new: Settings) -> list[str]:
    """The top-level sections that differ (names only: values may hold secrets)."""
    return [name for name in type(new).model_fields if getattr(new, name) != getattr(running, name)]


class Reloader:
    """``state``: the app's state (settings, live, gateway, metrics, stall_watch). ``load``: reads
    and validates the config as ``serve`` did at start (None: the app was not started from a config,
    and cannot reload). ``build``: a new Gateway from new settings and the running one."""

    def __init__(
        self,
        state: Any,
        load: Callable[[], Settings] | None,
        build: Callable[[Settings, Gateway], Gateway],
    ) -> None:
        self.state = state
        self._load = load
        self._build = build
        self.supervisor: int | None = None  # the supervisor's pid, in a worker process
        self._waiters: list[asyncio.Future[Outcome]] = []
        self.generation = 0

    def reload(self, source: str) -> Outcome:
        """Apply the config as it is now (synchronously: nothing else runs until the swap is done)."""
        waiters, self._waiters = self._waiters, []
        outcome = self._apply(source)
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(outcome)
        return outcome

    async def request(self) -> Outcome:
        """``POST /admin/reload``: here, or, in a worker, in every worker through the supervisor."""
        if self.supervisor is None:
            return self.reload("admin")
        try:
            self._read()  # refused here is refused everywhere: the same file, the same validator
        except ConfigError as exc:
            return self._refused("admin", str(exc))
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            os.kill(self.supervisor, signal.SIGHUP)
            return await asyncio.wait_for(waiter, SUPERVISOR_WAIT_SECONDS)
        except (OSError, TimeoutError):
            log.error("config_reload_not_forwarded", supervisor=self.supervisor)
            return Outcome(
                False, "The supervisor did not forward the reload; see the gateway's log.", status=503
            )

    def _read(self) -> Settings:
        if self._load is None:
            raise ConfigError("this gateway was not started from a configuration (serve): nothing to reload")
        return self._load()

    def _refused(self, source: str, problems: str) -> Outcome:
        log.error("config_reload_refused", source=source, detail=problems)
        return Outcome(False, problems, status=400)

    def _apply(self, source: str) -> Outcome:
        try:
            new = self._read()
        except ConfigError as exc:
            return self._refused(source, str(exc))
        running: Settings = self.state.settings
        effective, restart = pin_restart_fields(running, new)
        if restart:
            log.warning(
                "config_needs_restart",
                source=source,
                fields=restart,
                detail="changed in the config, kept at their running values until the gateway restarts",
            )
        changed = changed_sections(running, effective)
        live: LiveGateway = self.state.live
        if changed:
            try:
                gw = self._build(effective, live.current)
            except Exception:
                log.exception("config_reload_failed", source=source)
                return Outcome(
                    False, "The new configuration could not be applied; see the gateway's log.", status=500
                )
            self._swap(live, gw, effective)
        self.generation += 1
        log.info(
            "config_reloaded",
            source=source,
            changed=changed,
            generation=self.generation,
            models=live.current.router.model_names() if changed else None,
        )
        return Outcome(True, changed=changed, restart_required=restart)

    def _swap(self, live: LiveGateway, gw: Gateway, settings: Settings) -> None:
        state = self.state
        live.swap(gw)
        state.gateway = gw
        state.settings = settings
        state.metrics.relabel(settings)  # new tenants, models and providers get their own labels
        state.stall_watch.limit = settings.limits.client_send_seconds
