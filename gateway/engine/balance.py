"""Which deployment of a model serves a try: affinity (weighted rendezvous hashing of a key), else
the strategy (least_busy, weighted, latency), among the deployments passive health keeps in rotation.

Pure bookkeeping in this process: in-flight counts, the EWMA of time to first delta and the
failure streaks are per process, so several gateway workers or replicas each balance on their own
view. A key needs no shared state: every process hashes it to the same deployment.

Health: ``eject_after`` transient failures in a row (connect errors, timeouts, 429, most 5xx: see
``health_failure``) take a deployment out for ``cooldown_seconds``; then one trial request is let
through (half-open): its success restores the deployment, its failure ejects it again. When every
candidate is out, the least recently failed is tried anyway rather than refusing the request.
"""

from __future__ import annotations

import hashlib
import math
import random
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

import structlog

from gateway.kernel.errors import UpstreamError
from gateway.kernel.settings import RoutingSettings

log = structlog.get_logger("gateway.engine.balance")

EWMA_ALPHA = 0.3  # weight of the newest time-to-first-delta sample
LATENCY_EXPLORE = 0.05  # share of latency-strategy picks made by weight, so slower EWMAs get remeasured
CLAIM_TRIES = 64  # ids drawn at most to find one that hashes to the chosen deployment
_SCALE = 2.0**64


def health_failure(exc: UpstreamError) -> bool:
    """Whether a failed try counts against the deployment's health: exactly when it is transient
    (``UpstreamError.retryable``, as adapters/upstream_errors.py and adapters/transport.py
    classify it: no connection, a timeout, a 429, a 5xx that is not about the request, a
    connection lost before an answer was under way). What a retry cannot fix (a rejected request,
    a 500 that says the request cannot be served, a generation lost midway) says nothing about the
    deployment."""
    return exc.retryable


def _seed(name: str) -> hashlib.blake2b:
    h = hashlib.blake2b(digest_size=8)
    h.update(name.encode() + b"\0")
    return h


@dataclass(slots=True)
class _State:
    """One deployment's figures in this process."""

    name: str
    weight: float
    seed: hashlib.blake2b  # fed with its name; a copy is fed each key
    in_flight: int = 0
    ewma: float | None = None  # seconds to the first delta; None: never measured
    failures: int = 0  # health failures in a row
    ejected_until: float = 0.0  # monotonic; meaningful while failures >= eject_after
    last_failure: float = -math.inf
    probing: bool = False  # half-open: its trial request is in flight


class Balancer:
    """The deployments of one model (by name and weight) and their health, in this process."""

    __slots__ = ("_clock", "_rng", "model", "policy", "states")

    def __init__(
        self,
        model: str,
        deployments: Sequence[tuple[str, float]],
        policy: RoutingSettings,
        *,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        assert deployments
        self.model = model
        self.policy = policy
        self.states = [_State(name, weight, _seed(name)) for name, weight in deployments]
        self._clock = clock
        self._rng = rng or random.Random()

    # -- choosing -------------------------------------------------------------------------------
    def pick(self, key: str | None = None, tried: Collection[int] = ()) -> int:
        """The deployment (index) for the next try: among those in rotation and not yet ``tried``
        in this turn, else those in rotation again, else the least recently failed of the untried
        (all of them when every one was tried). ``key``: the affinity key (ignored with
        ``affinity: none``)."""
        states = self.states
        if len(states) == 1:
            return 0
        now = self._clock()
        ready = [i for i in range(len(states)) if self._ready(states[i], now)]
        pool = [i for i in ready if i not in tried] or ready
        if not pool:
            rest = [i for i in range(len(states)) if i not in tried] or range(len(states))
            return min(rest, key=lambda i: states[i].last_failure)
        if len(pool) == 1:
            return pool[0]
        if key is not None and self.policy.affinity != "none":
            raw = key.encode()
            return max(pool, key=lambda i: self._score(raw, i))
        return self._strategy(pool)

    def rank(self, key: str) -> list[int]:
        """Every deployment by ``key``'s rendezvous score, health aside: its home first."""
        raw = key.encode()
        return sorted(range(len(self.states)), key=lambda i: self._score(raw, i), reverse=True)

    def claim(self, key: str | None, make_id: Callable[[], str]) -> str:
        """A new response id that hashes to where this turn goes (``key``'s deployment, or the
        strategy's pick without one), so a chain rooted at it stays there through its root's id."""
        if len(self.states) == 1 or self.policy.affinity == "none":
            return make_id()
        home = self.pick(key)
        others = [i for i in range(len(self.states)) if i != home]
        rid = make_id()
        for _ in range(CLAIM_TRIES - 1):
            raw = rid.encode()
            best = self._score(raw, home)
            if all(self._score(raw, i) < best for i in others):
                break
            rid = make_id()
        return rid

    def _score(self, key: bytes, i: int) -> float:
        """Weighted rendezvous (highest random weight): -weight / ln(u), u uniform in (0, 1) from
        the hash of (deployment, key). Taking one deployment out moves only the keys it held."""
        s = self.states[i]
        h = s.seed.copy()
        h.update(key)
        u = (int.from_bytes(h.digest(), "big") + 0.5) / _SCALE
        return -s.weight / math.log(u)

    def _strategy(self, pool: list[int]) -> int:
        states = self.states
        strategy = self.policy.strategy
        if strategy == "least_busy":
            # fewest in flight relative to weight (a weight-2 replica takes twice the load); idle
            # ones tie, and ties go by weight
            load = {i: states[i].in_flight / states[i].weight for i in pool}
            least = min(load.values())
            return self._by_weight([i for i in pool if load[i] == least])
        if strategy == "latency":
            unexplored = [i for i in pool if states[i].ewma is None]
            if unexplored:
                return self._by_weight(unexplored)
            if self._rng.random() < LATENCY_EXPLORE:
                return self._by_weight(pool)
            return min(pool, key=lambda i: states[i].ewma or 0.0)
        return self._by_weight(pool)

    def _by_weight(self, pool: list[int]) -> int:
        if len(pool) == 1:
            return pool[0]
        return self._rng.choices(pool, weights=[self.states[i].weight for i in pool])[0]

    def _ready(self, s: _State, now: float) -> bool:
        """In rotation: not ejected, or past its cooldown with no trial request in flight."""
        return s.failures < self.policy.eject_after or (now >= s.ejected_until and not s.probing)

    # -- reporting ------------------------------------------------------------------------------
    def lease(self, index: int) -> Lease:
        """A try on deployment ``index`` begins (it counts as in flight until ``Lease.end``)."""
        s = self.states[index]
        s.in_flight += 1
        now = self._clock()
        # past its cooldown, an ejected deployment's next try is its trial (half-open)
        probe = s.failures >= self.policy.eject_after and now >= s.ejected_until
        if probe:
            s.probing = True
        return Lease(self, s, now, probe)

    def healthy(self, index: int) -> bool:
        return self._ready(self.states[index], self._clock())

    def snapshot(self) -> list[dict[str, Any]]:
        """Each deployment's figures in this process (for metrics and debugging)."""
        now = self._clock()
        return [
            {
                "deployment": s.name,
                "weight": s.weight,
                "in_flight": s.in_flight,
                "ewma_seconds": s.ewma,
                "failures": s.failures,
                "healthy": s.failures < self.policy.eject_after or now >= s.ejected_until,
            }
            for s in self.states
        ]


class Lease:
    """The balancer's lease of one deployment for one try (``Balancer.lease``): ``opened`` (its
    first delta came), or ``failed``; then ``end``."""

    __slots__ = ("_balancer", "_done", "_probe", "_start", "_state")

    def __init__(self, balancer: Balancer, state: _State, start: float, probe: bool) -> None:
        self._balancer = balancer
        self._state = state
        self._start = start
        self._probe = probe
        self._done = False

    @property
    def deployment(self) -> str:
        return self._state.name

    def opened(self) -> None:
        """The first delta arrived: a latency sample, and a success that restores the deployment."""
        b, s = self._balancer, self._state
        sample = b._clock() - self._start
        s.ewma = sample if s.ewma is None else EWMA_ALPHA * sample + (1 - EWMA_ALPHA) * s.ewma
        if s.failures >= b.policy.eject_after:
            log.info("deployment_restored", model=b.model, deployment=s.name)
        s.failures = 0
        self._clear_probe()

    def failed(self, exc: UpstreamError) -> None:
        """The try failed before its first delta; a health failure extends the streak, and the
        streak's ``eject_after``-th (or a failed trial) ejects the deployment for the cooldown."""
        b, s = self._balancer, self._state
        trial = self._probe
        self._clear_probe()
        if not health_failure(exc):
            return
        now = b._clock()
        s.failures += 1
        s.last_failure = now
        policy = b.policy
        if s.failures >= policy.eject_after:
            s.ejected_until = now + policy.cooldown_seconds
            if s.failures > policy.eject_after and not trial:
                return  # out already (tried because every deployment is): logged when it left
            log.warning(
                "deployment_ejected",
                model=b.model,
                deployment=s.name,
                failures=s.failures,
                cooldown_seconds=policy.cooldown_seconds,
            )

    def end(self) -> None:
        """The try is over (failed, or its stream closed); idempotent."""
        if not self._done:
            self._done = True
            self._state.in_flight -= 1
            self._clear_probe()

    def _clear_probe(self) -> None:
        if self._probe:
            self._probe = False
            self._state.probing = False
