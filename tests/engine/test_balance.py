"""The balancer on its own (pure, a fake clock): each strategy's choices, passive health (ejection,
cooldown, the half-open trial), and weighted rendezvous affinity (stable, weighted, and moving
only an ejected deployment's keys)."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import pytest
from structlog.testing import capture_logs

from gateway.engine.balance import Balancer, health_failure
from gateway.kernel.errors import (
    UpstreamConnectError,
    UpstreamError,
    UpstreamRateLimited,
    UpstreamRejected,
    UpstreamTimeout,
)
from gateway.kernel.ids import response_id
from gateway.kernel.settings import RoutingSettings

DOWN = UpstreamError("down", retryable=True, upstream_status=503)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def balancer(
    *weights: float, clock: Clock | None = None, seed: int = 7, **policy: Any
) -> tuple[Balancer, Clock]:
    clock = clock or Clock()
    names = [(f"d{i}", w) for i, w in enumerate(weights)]
    return Balancer("m", names, RoutingSettings(**policy), clock=clock, rng=random.Random(seed)), clock


def fail(b: Balancer, index: int, exc: UpstreamError = DOWN, times: int = 1) -> None:
    for _ in range(times):
        lease = b.lease(index)
        lease.failed(exc)
        lease.end()


def succeed(b: Balancer, index: int) -> None:
    lease = b.lease(index)
    lease.opened()
    lease.end()


# -- strategies ----------------------------------------------------------------------------------
def test_weighted_follows_the_weights() -> None:
    b, _ = balancer(2, 1, strategy="weighted")
    counts = Counter(b.pick() for _ in range(6000))
    assert 0.63 < counts[0] / 6000 < 0.70


def test_least_busy_spreads_what_is_in_flight() -> None:
    b, _ = balancer(1, 1, 1, strategy="least_busy")
    held = [b.lease(b.pick()) for _ in range(9)]
    assert sorted(s.in_flight for s in b.states) == [3, 3, 3]
    for lease in held[:3]:
        lease.end()
    nxt = b.pick()
    assert b.states[nxt].in_flight < 3


def test_least_busy_weighs_load_by_weight() -> None:
    b, _ = balancer(2, 1, strategy="least_busy")
    for _ in range(9):
        b.lease(b.pick())
    assert [s.in_flight for s in b.states] == [6, 3]


def test_least_busy_breaks_ties_by_weight() -> None:
    b, _ = balancer(3, 1, strategy="least_busy")
    counts = Counter(b.pick() for _ in range(4000))  # nothing in flight: every pick is a tie
    assert 0.70 < counts[0] / 4000 < 0.80


def test_latency_tries_the_unexplored_then_prefers_the_faster() -> None:
    b, clock = balancer(1, 1, 1, strategy="latency")
    first = [b.pick() for _ in range(3)]
    assert all(b.states[i].ewma is None for i in first)
    for i, seconds in ((0, 0.5), (1, 0.05), (2, 0.3)):
        lease = b.lease(i)
        clock.now += seconds
        lease.opened()
        lease.end()
    counts = Counter(b.pick() for _ in range(2000))
    assert counts[1] / 2000 > 0.9  # the rest: the few picks made by weight, to remeasure
    assert counts[0] > 0 and counts[2] > 0


def test_latency_ewma_follows_a_deployment_that_slows_down() -> None:
    b, clock = balancer(1, 1, strategy="latency")
    for i, seconds in ((0, 0.1), (1, 0.2)):
        lease = b.lease(i)
        clock.now += seconds
        lease.opened()
    for _ in range(5):  # d0 gets slow
        lease = b.lease(0)
        clock.now += 1.0
        lease.opened()
    assert b.states[0].ewma is not None and b.states[0].ewma > 0.2
    assert Counter(b.pick() for _ in range(500)).most_common(1)[0][0] == 1


# -- passive health ------------------------------------------------------------------------------
def test_failures_in_a_row_eject_until_the_cooldown_then_one_trial_restores() -> None:
    b, clock = balancer(1, 1, strategy="weighted", eject_after=3, cooldown_seconds=10)
    fail(b, 0, times=2)
    succeed(b, 0)  # a success resets the streak
    fail(b, 0, times=2)
    assert b.healthy(0)
    fail(b, 0)
    assert not b.healthy(0)
    assert {b.pick() for _ in range(200)} == {1}
    clock.now += 10
    assert b.healthy(0)
    trial = b.lease(0)  # half-open: one trial at a time
    assert {b.pick() for _ in range(200)} == {1}
    trial.opened()
    trial.end()
    assert b.healthy(0) and b.states[0].failures == 0
    assert {b.pick() for _ in range(200)} == {0, 1}


def test_a_failed_trial_ejects_again_for_a_whole_cooldown() -> None:
    b, clock = balancer(1, 1, eject_after=2, cooldown_seconds=5)
    fail(b, 0, times=2)
    clock.now += 5
    fail(b, 0)
    assert not b.healthy(0)
    clock.now += 4.9
    assert not b.healthy(0)
    clock.now += 0.1
    assert b.healthy(0)


def test_a_trial_that_ends_without_an_answer_frees_the_half_open_slot() -> None:
    b, clock = balancer(1, 1, eject_after=1, cooldown_seconds=5)
    fail(b, 0)
    clock.now += 5
    b.lease(0).end()  # cancelled: no verdict
    assert b.healthy(0)


@pytest.mark.parametrize(
    ("exc", "counts"),
    [
        (UpstreamConnectError("no", retryable=True), True),
        (UpstreamTimeout("slow", retryable=True), True),
        (UpstreamError("5xx", retryable=True, upstream_status=500), True),
        (UpstreamError("lost", retryable=True), True),
        (UpstreamRateLimited("429", retryable=True, upstream_status=429), True),
        (UpstreamRateLimited("quota", upstream_status=429), False),
        (UpstreamError("500, but the request's fault", upstream_status=500), False),
        (UpstreamError("lost while generating"), False),
        (UpstreamRejected("400", upstream_status=400), False),
        (UpstreamError("404", upstream_status=404), False),
    ],
)
def test_only_deployment_failures_count_against_health(exc: UpstreamError, counts: bool) -> None:
    assert health_failure(exc) is counts
    b, _ = balancer(1, 1, eject_after=1)
    fail(b, 0, exc)
    assert b.healthy(0) is not counts


def test_when_all_are_ejected_the_least_recently_failed_is_still_tried() -> None:
    b, clock = balancer(1, 1, 1, eject_after=1, cooldown_seconds=60)
    for i in (2, 0, 1):
        fail(b, i)
        clock.now += 1
    assert not any(b.healthy(i) for i in range(3))
    assert b.pick() == 2
    assert b.pick(tried={2}) == 0
    assert b.pick("some key") == 2


def test_a_retry_goes_to_another_ready_deployment_first() -> None:
    b, _ = balancer(1, 1, 1)
    first = b.pick("k")
    second = b.pick("k", tried={first})
    third = b.pick("k", tried={first, second})
    assert len({first, second, third}) == 3
    assert [first, second, third] == b.rank("k")  # a key's second choice is always the same
    assert b.pick("k", tried={0, 1, 2}) == first  # all tried: ready ones again


# -- affinity ------------------------------------------------------------------------------------
def keys(n: int) -> list[str]:
    return [f"key-{i}" for i in range(n)]


def test_a_key_always_goes_to_one_deployment_whatever_the_strategy() -> None:
    b, _ = balancer(1, 1, 1, strategy="least_busy")
    home = b.pick("conversation-1")
    for _ in range(50):
        b.lease(home)  # busier and busier: affinity still holds
        assert b.pick("conversation-1") == home


def test_another_process_hashes_a_key_to_the_same_deployment() -> None:
    b1, _ = balancer(2, 1, 1, seed=1)
    b2, _ = balancer(2, 1, 1, seed=2)
    assert [b1.pick(k) for k in keys(300)] == [b2.pick(k) for k in keys(300)]


def test_rendezvous_shares_keys_by_weight() -> None:
    b, _ = balancer(2, 1, 1)
    counts = Counter(b.pick(k) for k in keys(8000))
    assert 0.46 < counts[0] / 8000 < 0.54
    assert 0.21 < counts[1] / 8000 < 0.29


def test_ejecting_a_deployment_moves_only_its_own_keys_and_they_come_back() -> None:
    b, clock = balancer(2, 1, 1, eject_after=1, cooldown_seconds=5)
    before = {k: b.pick(k) for k in keys(3000)}
    fail(b, 1)
    during = {k: b.pick(k) for k in keys(3000)}
    moved = {k for k in before if before[k] != during[k]}
    assert moved == {k for k in before if before[k] == 1}
    assert all(during[k] != 1 for k in moved)
    assert len(moved) > 500
    clock.now += 5
    succeed(b, 1)
    assert {k: b.pick(k) for k in keys(3000)} == before


def test_affinity_none_ignores_keys() -> None:
    b, _ = balancer(1, 1, strategy="weighted", affinity="none")
    assert len({b.pick("same") for _ in range(100)}) == 2
    assert b.claim("same", lambda: "resp_x") == "resp_x"


def test_a_claimed_id_hashes_to_the_deployment_the_turn_goes_to() -> None:
    b, _ = balancer(1, 1, 1, strategy="least_busy")
    b.lease(0)
    b.lease(1)  # d2 is the least busy
    rid = b.claim(None, response_id)
    assert b.rank(rid)[0] == 2 and b.pick(rid) == 2
    home = b.pick("cache-key")
    rid = b.claim("cache-key", response_id)
    assert b.rank(rid)[0] == home


def test_a_single_deployment_is_always_chosen() -> None:
    b, _ = balancer(1, eject_after=1)
    fail(b, 0)
    assert b.pick() == 0 and b.pick("k", tried={0}) == 0
    assert b.claim("k", lambda: "resp_y") == "resp_y"


def test_leaving_and_coming_back_are_logged_once_each() -> None:
    b, clock = balancer(1, 1, 1, eject_after=2, cooldown_seconds=5)
    with capture_logs() as logs:
        fail(b, 0, times=4)  # out at the second; the others were tried while it was out
        clock.now += 5
        fail(b, 0)  # the failed trial
        clock.now += 5
        succeed(b, 0)
    assert [(ln["event"], ln["deployment"], ln.get("failures")) for ln in logs] == [
        ("deployment_ejected", "d0", 2),
        ("deployment_ejected", "d0", 5),
        ("deployment_restored", "d0", None),
    ]
