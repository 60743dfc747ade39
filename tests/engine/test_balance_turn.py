"""Turn._open over a route with several deployments (scripted adapters, no network): a failed try
moves to another deployment before the first byte, fallbacks come after every deployment, client
errors neither move nor count, and each try is in flight exactly while it is open."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from typing import Any

import pytest
import structlog

from adapters.base import UpstreamRequest
from adapters.deltas import Delta, Finish, TextDelta
from gateway.engine.balance import Balancer
from gateway.engine.routing import Deployment, Route
from gateway.kernel.errors import UpstreamConnectError, UpstreamError, UpstreamRejected
from gateway.kernel.settings import RetrySettings, RoutingSettings
from tests.engine.test_turn import make_turn
from tests.engine.test_turn import route as single_route

OK: list[Delta] = [TextDelta("hi"), Finish("stop")]


class Replica:
    """A scripted adapter that also records the log context each call began in."""

    def __init__(self, *scripts: list[Delta] | Exception, hold: asyncio.Event | None = None) -> None:
        self.scripts = list(scripts)
        self.calls = 0
        self.labels: list[Any] = []
        self.hold = hold

    async def stream(self, request: UpstreamRequest) -> AsyncIterator[Delta]:
        self.calls += 1
        self.labels.append(structlog.contextvars.get_contextvars().get("deployment"))
        script = self.scripts.pop(0) if self.scripts else OK
        if isinstance(script, Exception):
            raise script
        for delta in script:
            yield delta
        if self.hold is not None:
            await self.hold.wait()

    async def aclose(self) -> None:
        return None


def replicated(
    *adapters: Replica, attempts: int = 0, fallbacks: tuple[Route, ...] = (), **policy: Any
) -> Route:
    retry = RetrySettings(attempts=attempts, backoff_base=0, backoff_max=0)
    deps = tuple(
        Deployment(f"r{i}", f"p{i}", adapter, f"up-{i}", retry, 60.0) for i, adapter in enumerate(adapters)
    )
    balancer = Balancer("m", [(d.name, 1.0) for d in deps], RoutingSettings(**policy), rng=random.Random(3))
    first = deps[0]
    return Route(
        model="m",
        provider=first.provider,
        adapter=first.adapter,
        upstream_model=first.upstream_model,
        retry=retry,
        total_seconds=60.0,
        fallbacks=fallbacks,
        deployments=deps,
        balancer=balancer,
    )


def in_flight(r: Route) -> list[int]:
    return [s["in_flight"] for s in r.deployment_balancer.snapshot()]


@pytest.mark.parametrize(
    "failure",
    [
        UpstreamConnectError("refused", retryable=True),
        UpstreamError("5xx", retryable=True, upstream_status=502),
    ],
)
async def test_a_failed_try_moves_to_the_other_deployment_before_the_first_byte(
    failure: UpstreamError,
) -> None:
    a, b = Replica(failure), Replica(failure)
    r = replicated(a, b)
    turn = make_turn(r)
    turn.affinity = "conversation"
    home = r.deployment_balancer.pick("conversation")
    [a, b][1 - home].scripts.clear()  # only the key's home fails
    result = await turn.run()
    assert result.status == "completed" and result.deployment == f"r{1 - home}"
    assert result.provider == f"p{1 - home}"
    assert (a.calls, b.calls) == (1, 1)
    assert turn.request.model == "up-0"  # each try gets its own copy of the request
    assert r.deployment_balancer.states[home].failures == 1
    assert in_flight(r) == [0, 0]


async def test_fallbacks_come_after_every_deployment() -> None:
    down = UpstreamError("down", retryable=True, upstream_status=503)
    reps = [Replica(down), Replica(down), Replica(down)]
    backup = single_route(Replica(), model="b")
    r = replicated(*reps, fallbacks=(backup,))
    result = await make_turn(r).run()
    assert result.status == "completed" and result.provider == "p-b" and result.deployment == "p-b"
    assert [rep.calls for rep in reps] == [1, 1, 1]
    assert in_flight(r) == [0, 0, 0]


async def test_retries_beyond_the_deployments_go_round_again() -> None:
    down = UpstreamError("down", retryable=True, upstream_status=503)
    a, b = Replica(down, down), Replica(down, down)
    r = replicated(a, b, attempts=3)  # 4 tries on 2 deployments
    with pytest.raises(UpstreamError):
        await make_turn(r).run()
    assert (a.calls, b.calls) == (2, 2)
    assert [s.failures for s in r.deployment_balancer.states] == [2, 2]


async def test_a_client_error_is_not_retried_elsewhere_nor_counted() -> None:
    a, b = Replica(UpstreamRejected("bad", upstream_status=400)), Replica(UpstreamRejected("bad"))
    r = replicated(a, b)
    with pytest.raises(UpstreamRejected):
        await make_turn(r).run()
    assert a.calls + b.calls == 1
    assert [s.failures for s in r.deployment_balancer.states] == [0, 0]


async def test_an_ejected_deployment_is_skipped_even_by_its_keys() -> None:
    down = UpstreamConnectError("refused", retryable=True)
    reps = [Replica(), Replica()]
    r = replicated(*reps, eject_after=2, cooldown_seconds=60)
    home = r.deployment_balancer.pick("k")
    reps[home].scripts = [down, down]
    for _ in range(2):
        turn = make_turn(r)
        turn.affinity = "k"
        assert (await turn.run()).deployment == f"r{1 - home}"
    assert not r.deployment_balancer.healthy(home)
    turn = make_turn(r)
    turn.affinity = "k"
    assert (await turn.run()).deployment == f"r{1 - home}"
    assert reps[home].calls == 2  # not tried a third time


async def test_a_streaming_try_is_in_flight_until_the_turn_closes() -> None:
    hold = asyncio.Event()
    reps = [Replica(hold=hold), Replica(hold=hold)]
    r = replicated(*reps, strategy="least_busy")
    tasks = [asyncio.create_task(make_turn(r).run()) for _ in range(4)]
    for _ in range(200):
        if sum(in_flight(r)) == 4:
            break
        await asyncio.sleep(0.01)
    assert in_flight(r) == [2, 2]
    hold.set()
    await asyncio.gather(*tasks)
    assert in_flight(r) == [0, 0]


async def test_a_cancelled_turn_releases_its_deployment() -> None:
    reps = [Replica(hold=asyncio.Event())]
    r = replicated(*reps)
    task = asyncio.create_task(make_turn(r).run())
    for _ in range(200):
        if in_flight(r) == [1]:
            break
        await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert in_flight(r) == [0]


async def test_each_try_logs_under_its_deployment_and_the_label_is_undone() -> None:
    down = UpstreamError("down", retryable=True, upstream_status=503)
    a, b = Replica(down), Replica(down)
    r = replicated(a, b)
    home = r.deployment_balancer.pick("k")
    [a, b][1 - home].scripts.clear()
    turn = make_turn(r)
    turn.affinity = "k"
    await turn.run()
    assert [a, b][home].labels == [f"r{home}"] and [a, b][1 - home].labels == [f"r{1 - home}"]
    assert "deployment" not in structlog.contextvars.get_contextvars()
