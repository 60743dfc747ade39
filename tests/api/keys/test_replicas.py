"""Two gateway processes on one real Redis: a virtual key made on one works on the other within
1 s, and a revoked (or rotated) key is refused on both within 1 s, without a reload. The secret
never reaches either process's log."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx

from tests.api.procs import Gateway
from tests.redis_server import delete_prefix, redis_url, unique_prefix

ADMIN = {"Authorization": "Bearer sk-admin"}


def config(prefix: str) -> dict[str, Any]:
    return {
        "auth": {"api_keys": [{"key": "sk-config", "tenant": "a"}]},
        "admin": {"api_keys": [{"key": "sk-admin", "name": "ops"}]},
        "models": {"mock": {"provider": "mock"}},
        "state": {"redis_url": redis_url(), "key_prefix": prefix},
    }


async def status(client: httpx.AsyncClient, gw: Gateway, secret: str) -> int:
    r = await client.post(
        f"{gw.url}/v1/responses",
        json={"model": "mock", "input": "hi"},
        headers={"Authorization": f"Bearer {secret}"},
    )
    return r.status_code


async def within(seconds: float, check: Any) -> float:
    """How long until ``check()`` is true (it must be within ``seconds``)."""
    start = time.monotonic()
    while True:
        if await check():
            return time.monotonic() - start
        assert time.monotonic() - start < seconds, "not within the bound"
        await asyncio.sleep(0.02)


async def test_a_key_made_on_one_replica_works_on_the_other_and_revoked_is_refused_on_both(
    tmp_path: Path,
) -> None:
    prefix = unique_prefix()
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    one, two = Gateway(tmp_path / "one", config(prefix)), Gateway(tmp_path / "two", config(prefix))
    try:
        await one.started()
        await two.started()
        async with httpx.AsyncClient(timeout=10) as client:
            made = await client.post(f"{one.url}/admin/keys", json={"tenant": "team"}, headers=ADMIN)
            assert made.status_code == 201, made.text
            key = made.json()
            secret = key["secret"]
            took = await within(1.0, lambda: _is(client, two, secret, 200))
            assert await status(client, one, secret) == 200
            # revoked on two: refused on both within 1 s
            gone = await client.delete(f"{two.url}/admin/keys/{key['id']}", headers=ADMIN)
            assert gone.status_code == 200
            assert await status(client, two, secret) == 401  # at once where it was revoked
            took_revoke = await within(1.0, lambda: _is(client, one, secret, 401))
            # a second key, rotated on one without grace: its old secret is refused on two
            k2 = (await client.post(f"{two.url}/admin/keys", json={"tenant": "team"}, headers=ADMIN)).json()
            await within(1.0, lambda: _is(client, one, k2["secret"], 200))
            new = (await client.post(f"{one.url}/admin/keys/{k2['id']}/rotate", headers=ADMIN)).json()[
                "secret"
            ]
            await within(1.0, lambda: _is(client, two, k2["secret"], 401))
            await within(1.0, lambda: _is(client, two, new, 200))
            # config keys work beside them
            assert await status(client, two, "sk-config") == 200
        assert took < 1.0 and took_revoke < 1.0
        for gw in (one, two):
            text = gw.log_path.read_text(errors="replace")
            assert secret not in text and new not in text and k2["secret"] not in text
    finally:
        await one.stop()
        await two.stop()
        delete_prefix(redis_url(), prefix)


async def _is(client: httpx.AsyncClient, gw: Gateway, secret: str, code: int) -> bool:
    return await status(client, gw, secret) == code
