"""The usage ledger in Redis: one hash per tenant and UTC day, ``{prefix}:{<tenant>}:u:<day>``
(the tenant is the hash tag, as for its responses), a field per key name, model and metric
(``["key","model","metric"]`` as JSON), each turn one pipeline of HINCRBYs and an EXPIRE of
``RETENTION_DAYS``. Only names and numbers: no conversation content ever goes here."""

from __future__ import annotations

from collections.abc import Iterable

import orjson

from gateway.kernel.errors import ServiceUnavailable
from state.redis import RedisStore
from state.usage import METRICS, RETENTION_DAYS, UsageRow

_TTL_SECONDS = RETENTION_DAYS * 24 * 3600


class RedisLedger:
    """Shares the store's client, key layout and time bound."""

    def __init__(self, store: RedisStore) -> None:
        self.store = store

    def day_key(self, tenant: str, day: str) -> str:
        return f"{self.store._base(tenant)}u:{day}"

    async def add(self, tenant: str, day: str, key: str, model: str, counts: dict[str, int]) -> None:
        if self.store.failing():
            # the turn's put (or another call) just timed out: a count is not worth a second wait
            # on the same Redis before the client hears of it
            raise ServiceUnavailable("usage ledger unavailable")
        name = self.day_key(tenant, day)
        pipe = self.store._client.pipeline(transaction=False)
        for metric, n in counts.items():
            if n:
                pipe.hincrby(name, orjson.dumps([key, model, metric]).decode(), n)
        pipe.expire(name, _TTL_SECONDS)
        await self.store._call(pipe.execute())

    async def read(self, tenants: Iterable[str], days: list[str]) -> list[UsageRow]:
        rows: list[UsageRow] = []
        for tenant in tenants:  # one pipeline per tenant: its keys share a slot
            pipe = self.store._client.pipeline(transaction=False)
            for day in days:
                pipe.hgetall(self.day_key(tenant, day))
            replies = await self.store._call(pipe.execute())
            for day, fields in zip(days, replies, strict=True):
                found: dict[tuple[str, str], dict[str, int]] = {}
                for field, value in fields.items():
                    key, model, metric = orjson.loads(field)
                    if metric in METRICS:
                        found.setdefault((key, model), dict.fromkeys(METRICS, 0))[metric] = int(value)
                rows += [UsageRow(tenant, day, k, m, counts) for (k, m), counts in found.items()]
        return rows

    async def aclose(self) -> None:
        return None  # the store closes the client
