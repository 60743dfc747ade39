"""Virtual keys' store and cache (state/keys.py, gateway/engine/vkeys.py) in process and in every
Redis topology: two caches over one store see each other's changes within 1 s (pub/sub where the
client has it, the version check everywhere); a rotation's grace; only digests stored."""

from __future__ import annotations

import asyncio
import time

from gateway.engine.vkeys import VirtualKey, VirtualKeys, digest_of, new_key_id, new_secret
from state.keys import MemoryKeyStore, RedisKeyStore, VirtualKeyStore
from state.redis import RedisStore
from tests.state.conftest import StoreFactory


def key_store(store: object) -> VirtualKeyStore:
    return RedisKeyStore(store) if isinstance(store, RedisStore) else MemoryKeyStore()


def record(secret: str, **extra: object) -> VirtualKey:
    now = int(time.time())
    fields: dict[str, object] = {
        "id": new_key_id(),
        "tenant": "t",
        "digest": digest_of(secret),
        "created_at": now,
        "updated_at": now,
        "created_by": "ops",
        **extra,
    }
    return VirtualKey.model_validate(fields)


async def until(check: object, seconds: float = 1.0) -> None:
    start = time.monotonic()
    while not check():  # type: ignore[operator]
        assert time.monotonic() - start < seconds, "not within 1 s"
        await asyncio.sleep(0.02)


async def test_two_caches_follow_each_others_changes(make_store: StoreFactory) -> None:
    raw = await make_store()
    ks = key_store(raw)
    one = VirtualKeys(ks)
    two = VirtualKeys(ks if isinstance(ks, MemoryKeyStore) else RedisKeyStore(raw))  # type: ignore[arg-type]
    await one.start()
    await two.start()
    try:
        secret = new_secret()
        rec = record(secret)
        await one.put(rec)
        d = bytes.fromhex(rec.digest)
        assert one.lookup(d) is not None  # the writer's own cache at once
        await until(lambda: two.lookup(d) is not None)
        # rotated with grace: both secrets, then only the new one
        new = new_secret()
        rotated = rec.model_copy(
            update={
                "digest": digest_of(new),
                "previous_digest": rec.digest,
                "previous_until": int(time.time()) + 60,
            }
        )
        await two.put(rotated)
        await until(lambda: one.lookup(bytes.fromhex(digest_of(new))) is not None)
        assert one.lookup(d) is not None
        await two.put(rotated.model_copy(update={"previous_digest": None, "previous_until": None}))
        await until(lambda: one.lookup(d) is None)
        # deleted on one: gone on two
        assert await one.delete(rec.id)
        await until(lambda: two.lookup(bytes.fromhex(digest_of(new))) is None)
        assert not await one.delete(rec.id)
        # expired keys are refused
        late = record(new_secret(), expires_at=int(time.time()) - 1)
        await one.put(late)
        assert one.lookup(bytes.fromhex(late.digest)) is None and one.get(late.id) is not None
        # only digests are stored
        _, stored = await ks.load()
        assert all(secret not in str(r) and new not in str(r) for r in stored.values())
    finally:
        await one.aclose()
        await two.aclose()
