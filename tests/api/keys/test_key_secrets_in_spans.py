"""A virtual key's secret never reaches a span: a gateway process exporting its spans over OTLP
makes, uses, rotates and revokes a key; no exported span (nor the log) holds either secret."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx

from tests.api.keys.test_replicas import ADMIN, config
from tests.api.procs import Gateway
from tests.observability.test_otlp import Receiver, receiver  # noqa: F401  (a fixture)
from tests.redis_server import delete_prefix, redis_url, unique_prefix


async def test_no_span_holds_a_key_secret(tmp_path: Path, receiver: Receiver) -> None:  # noqa: F811
    prefix = unique_prefix()
    gw = Gateway(
        tmp_path, config(prefix), OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint, OTEL_BSP_SCHEDULE_DELAY="50"
    )
    try:
        await gw.started()
        async with httpx.AsyncClient(timeout=10) as c:
            made = await c.post(f"{gw.url}/admin/keys", json={"tenant": "team"}, headers=ADMIN)
            assert made.status_code == 201, made.text
            key = made.json()
            used = await c.post(
                f"{gw.url}/v1/responses",
                json={"model": "mock", "input": "hi"},
                headers={"Authorization": f"Bearer {key['secret']}"},
            )
            assert used.status_code == 200
            rotated = (await c.post(f"{gw.url}/admin/keys/{key['id']}/rotate", headers=ADMIN)).json()[
                "secret"
            ]
            assert (await c.delete(f"{gw.url}/admin/keys/{key['id']}", headers=ADMIN)).status_code == 200
        deadline = time.monotonic() + 30
        while not any(s.name == "POST /v1/responses" for _, s in receiver.spans()):
            assert time.monotonic() < deadline, "no span reached the receiver"
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)  # the admin calls' spans too
    finally:
        await gw.stop()
        delete_prefix(redis_url(), prefix)
    spans = str([s for _, s in receiver.spans()])
    for secret in (key["secret"], rotated):
        assert secret not in spans
        assert secret not in str(gw.logs())
