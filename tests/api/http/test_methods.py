"""Methods a route does not take: 405 with the ``Allow`` header (RFC 9110) and the spec's error body,
on the hot path (``/v1/responses``, dispatched before FastAPI) as on the routed ones."""

from __future__ import annotations

import httpx
import orjson
import pytest
from websockets.sync.client import connect

from tests.harness import ServedApp


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("GET", "/v1/responses", "POST"),
        ("PUT", "/v1/responses", "POST"),
        ("DELETE", "/v1/responses", "POST"),
        ("PATCH", "/v1/codex/responses", "POST"),
        ("PUT", "/v1/responses/resp_abc", "DELETE, GET, HEAD"),  # both routes on the path
        ("POST", "/v1/responses/resp_abc/input_items", "GET, HEAD"),
        ("POST", "/v1/models", "GET, HEAD"),
        # A fixed path is its route's whatever the method: never the id "compact" of the routes on
        # /v1/responses/{response_id}.
        ("GET", "/v1/responses/compact", "POST"),
        ("HEAD", "/v1/responses/compact", "POST"),
        ("DELETE", "/v1/responses/compact", "POST"),
        ("PUT", "/v1/responses/compact", "POST"),
        ("DELETE", "/v1/usage", "GET, HEAD"),
        ("POST", "/healthz", "GET, HEAD"),
        ("POST", "/readyz", "GET, HEAD"),
        ("PUT", "/metrics", "GET, HEAD"),
        ("GET", "/admin/reload", "POST"),
    ],
)
def test_405_names_the_allowed_methods(gateway: ServedApp, method: str, path: str, allow: str) -> None:
    r = httpx.request(method, gateway.base_url + path, timeout=10)
    assert r.status_code == 405
    assert r.headers["allow"] == allow
    if method == "HEAD":  # no body: the status and Allow are all of it
        return
    error = r.json()["error"]
    assert set(error) == {"type", "code", "message", "param"}
    assert error["code"] == "method_not_allowed" and method in error["message"]


@pytest.mark.parametrize("path", ["/v1/responses", "/v1/codex/responses"])
def test_get_on_the_hot_path_is_405_unless_it_upgrades(gateway: ServedApp, path: str) -> None:
    assert httpx.get(gateway.base_url + path, timeout=10).status_code == 405
    with connect(gateway.ws_url + path, open_timeout=10) as ws:
        ws.send('{"type": "response.create", "model": "mock", "input": "hi", "store": false}')
        while (event := orjson.loads(ws.recv(timeout=10)))["type"] != "response.completed":
            assert event["type"] != "error", event
    r = httpx.post(gateway.base_url + path, json={"model": "mock", "input": "hi"}, timeout=10)
    assert r.status_code == 200 and r.json()["status"] == "completed"
    assert httpx.get(gateway.base_url + "/v1/nothing-here", timeout=10).status_code == 404
