"""Virtual keys through /admin/keys, in process and in a real Redis: the secret returned once and
only its digest stored; list/get/patch/rotate (with a grace period)/delete; expiry; tenant admins
confined to their tenant; audit lines; config keys beside them; errors in the API's shape."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterator
from typing import Any, cast

import httpx
import pytest
import redis

from tests.harness import ServedApp, serve_gateway
from tests.redis_server import delete_prefix, redis_url, unique_prefix

ADMIN = {"Authorization": "Bearer sk-admin"}
CONFIG_KEY = {"Authorization": "Bearer sk-config"}


def bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


def config(**extra: Any) -> dict[str, Any]:
    return {
        "auth": {"api_keys": [{"key": "sk-config", "tenant": "a", "name": "cfg"}]},
        "admin": {"api_keys": [{"key": "sk-admin", "name": "ops"}]},
        "models": {"mock": {"provider": "mock"}, "other": {"provider": "mock"}},
        **extra,
    }


@pytest.fixture(params=["memory", "redis"])
def state(request: pytest.FixtureRequest) -> Iterator[dict[str, Any]]:
    if request.param == "memory":
        yield {}
        return
    p = unique_prefix()
    yield {"state": {"redis_url": redis_url(), "key_prefix": p}}
    delete_prefix(redis_url(), p)


@pytest.fixture
def gw(state: dict[str, Any]) -> Iterator[ServedApp]:
    with serve_gateway(config(**state)) as served:
        yield served


def respond(base: str, headers: dict[str, str], model: str = "mock") -> httpx.Response:
    return httpx.post(
        f"{base}/v1/responses", json={"model": model, "input": "hi"}, headers=headers, timeout=10
    )


def test_create_use_list_rotate_revoke(gw: ServedApp, state: dict[str, Any]) -> None:
    base = gw.base_url
    made = httpx.post(
        f"{base}/admin/keys",
        json={
            "tenant": "team-x",
            "name": "ci",
            "models": ["mock"],
            "metadata": {"owner": "ann"},
            "limits": {"requests_per_minute": 100},
            "budget": {"tokens": 100000, "period": "month"},
        },
        headers=ADMIN,
    )
    assert made.status_code == 201, made.text
    key = made.json()
    secret = key["secret"]
    assert secret.startswith("sk-gw-") and key["tenant"] == "team-x" and key["models"] == ["mock"]
    assert "digest" not in key
    # works, for its models only, and as its tenant
    ok = respond(base, bearer(secret))
    assert ok.status_code == 200, ok.text
    assert respond(base, bearer(secret), "other").status_code in (400, 403, 404)
    # config keys keep working beside it
    assert respond(base, CONFIG_KEY).status_code == 200
    # the list and the record: no secret, no digest
    listed = httpx.get(f"{base}/admin/keys", headers=ADMIN)
    assert listed.status_code == 200
    assert secret not in listed.text and hashlib.sha256(secret.encode()).hexdigest() not in listed.text
    assert [k["id"] for k in listed.json()["data"]] == [key["id"]]
    one = httpx.get(f"{base}/admin/keys/{key['id']}", headers=ADMIN).json()
    assert one["metadata"] == {"owner": "ann"} and "secret" not in one
    # the store holds the digest only
    if state:
        r = redis.Redis.from_url(redis_url())
        blob = b"".join(
            v
            for k in r.scan_iter(f"{state['state']['key_prefix']}:*")
            if r.type(k) == b"hash"
            for v in cast(list[bytes], r.hvals(k))
        )
        assert secret.encode() not in blob
        assert hashlib.sha256(secret.encode()).hexdigest().encode() in blob
    # usage is the tenant's, under the key's id
    usage = httpx.get(f"{base}/v1/usage", params={"tenant": "team-x", "group_by": "key"}, headers=ADMIN)
    assert usage.status_code == 200 and usage.json()["data"][0]["key"] == key["id"]
    # patch
    patched = httpx.patch(f"{base}/admin/keys/{key['id']}", json={"models": ["mock", "other"]}, headers=ADMIN)
    assert patched.status_code == 200 and patched.json()["models"] == ["mock", "other"]
    assert respond(base, bearer(secret), "other").status_code == 200
    # rotate with a grace period: both work; without: only the new one
    rotated = httpx.post(f"{base}/admin/keys/{key['id']}/rotate", json={"grace_seconds": 60}, headers=ADMIN)
    assert rotated.status_code == 200
    new = rotated.json()["secret"]
    assert new != secret and rotated.json()["previous_secret_expires_at"] is not None
    assert respond(base, bearer(new)).status_code == 200
    assert respond(base, bearer(secret)).status_code == 200
    again = httpx.post(f"{base}/admin/keys/{key['id']}/rotate", headers=ADMIN)
    newer = again.json()["secret"]
    assert respond(base, bearer(new)).status_code == 401
    assert respond(base, bearer(newer)).status_code == 200
    # revoke
    gone = httpx.delete(f"{base}/admin/keys/{key['id']}", headers=ADMIN)
    assert gone.status_code == 200 and gone.json()["deleted"] is True
    refused = respond(base, bearer(newer))
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
    missing = httpx.delete(f"{base}/admin/keys/{key['id']}", headers=ADMIN)
    assert missing.status_code == 404 and missing.json()["error"]["type"]


def test_a_key_expires_on_time(gw: ServedApp) -> None:
    made = httpx.post(
        f"{gw.base_url}/admin/keys", json={"tenant": "a", "expires_in": 2}, headers=ADMIN
    ).json()
    assert respond(gw.base_url, bearer(made["secret"])).status_code == 200
    time.sleep(2.2)
    assert respond(gw.base_url, bearer(made["secret"])).status_code == 401


def test_bad_bodies_and_callers_get_the_api_error_shape(gw: ServedApp) -> None:
    base = gw.base_url
    cases = [
        (ADMIN, b"{", "invalid_json"),
        (ADMIN, json.dumps({"tenant": "a", "colour": "red"}).encode(), "unknown_parameter"),
        (ADMIN, json.dumps({"name": "x"}).encode(), "missing_required_parameter"),
        (ADMIN, json.dumps({"tenant": "a", "limits": {"requests_per_minute": 0}}).encode(), "invalid_value"),
        (ADMIN, json.dumps({"tenant": "a", "expires_in": 5, "expires_at": 9}).encode(), "invalid_value"),
        ({}, json.dumps({"tenant": "a"}).encode(), None),
        (CONFIG_KEY, json.dumps({"tenant": "a"}).encode(), "permission_denied"),
        (bearer("sk-nope"), json.dumps({"tenant": "a"}).encode(), "invalid_api_key"),
    ]
    for headers, body, code in cases:
        r = httpx.post(
            f"{base}/admin/keys", content=body, headers={**headers, "content-type": "application/json"}
        )
        assert r.status_code in (400, 401, 403), r.text
        err = r.json()["error"]
        assert err["message"]
        if code is not None:
            assert err["code"] == code, (body, err)


def test_a_tenant_admin_manages_its_own_tenant_only(gw: ServedApp) -> None:
    base = gw.base_url
    boss = httpx.post(f"{base}/admin/keys", json={"tenant": "a", "tenant_admin": True}, headers=ADMIN).json()
    other = httpx.post(f"{base}/admin/keys", json={"tenant": "b"}, headers=ADMIN).json()
    h = bearer(boss["secret"])
    mine = httpx.post(f"{base}/admin/keys", json={"tenant": "a", "name": "script"}, headers=h)
    assert mine.status_code == 201
    assert httpx.post(f"{base}/admin/keys", json={"tenant": "b"}, headers=h).status_code == 403
    assert (
        httpx.post(f"{base}/admin/keys", json={"tenant": "a", "tenant_admin": True}, headers=h).status_code
        == 403
    )
    assert httpx.get(f"{base}/admin/keys/{other['id']}", headers=h).status_code == 403
    assert httpx.delete(f"{base}/admin/keys/{other['id']}", headers=h).status_code == 403
    assert httpx.post(f"{base}/admin/keys/{other['id']}/rotate", headers=h).status_code == 403
    assert httpx.get(f"{base}/admin/keys", params={"tenant": "b"}, headers=h).status_code == 403
    listed = httpx.get(f"{base}/admin/keys", headers=h).json()["data"]
    assert {k["tenant"] for k in listed} == {"a"}
    assert httpx.delete(f"{base}/admin/keys/{mine.json()['id']}", headers=h).status_code == 200
    # a plain key of the tenant may not manage keys
    plain = httpx.post(f"{base}/admin/keys", json={"tenant": "a"}, headers=ADMIN).json()
    assert httpx.get(f"{base}/admin/keys", headers=bearer(plain["secret"])).status_code == 403


def test_every_action_writes_an_audit_line_without_the_secret(
    gw: ServedApp, capsys: pytest.CaptureFixture[str]
) -> None:
    base = gw.base_url
    capsys.readouterr()
    made = httpx.post(f"{base}/admin/keys", json={"tenant": "a"}, headers=ADMIN).json()
    rot = httpx.post(f"{base}/admin/keys/{made['id']}/rotate", headers=ADMIN).json()
    httpx.patch(f"{base}/admin/keys/{made['id']}", json={"name": "n"}, headers=ADMIN)
    httpx.delete(f"{base}/admin/keys/{made['id']}", headers=ADMIN)
    captured = capsys.readouterr()
    text = captured.out + captured.err
    assert made["secret"] not in text and rot["secret"] not in text
    for action in ("key.create", "key.rotate", "key.update", "key.delete"):
        assert action in text
    assert text.count(made["id"]) >= 4 and "ops" in text


def test_the_cache_follows_a_change_made_by_another_replica() -> None:
    """Two apps on one Redis (in one process; the two-process test is tests/api/keys/test_replicas.py)."""
    p = unique_prefix()
    state = {"state": {"redis_url": redis_url(), "key_prefix": p}}
    with serve_gateway(config(**state)) as one, serve_gateway(config(**state)) as two:
        made = httpx.post(f"{one.base_url}/admin/keys", json={"tenant": "a"}, headers=ADMIN).json()
        time.sleep(1.0)
        assert respond(two.base_url, bearer(made["secret"])).status_code == 200
    delete_prefix(redis_url(), p)
