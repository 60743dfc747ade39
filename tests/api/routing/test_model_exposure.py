"""Which models a gateway serves: the built-in ``mock`` only when nothing else is there or when
``models:`` lists it; the provider keys of the environment only where they may be spent."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from gateway.kernel.settings import ConfigError, load_settings
from tests.api.helpers import PROVIDER_KEY_VARS
from tests.harness import serve_gateway

UP = {"kind": "openai-chat", "base_url": "http://127.0.0.1:9/v1", "api_key": "sk-x"}


@pytest.fixture(autouse=True)
def no_provider_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in PROVIDER_KEY_VARS:
        monkeypatch.delenv(name, raising=False)


def served_models(settings: dict[str, Any]) -> tuple[list[str], int]:
    """The ids of ``GET /v1/models`` and the status of a ``mock`` request."""
    with serve_gateway(settings) as gw, httpx.Client(base_url=gw.base_url, timeout=10) as c:
        ids = [m["id"] for m in c.get("/v1/models").json()["data"]]
        r = c.post("/v1/responses", json={"model": "mock", "input": "hi", "store": False})
        if r.status_code != 200:
            assert r.json()["error"]["code"] == "model_not_found"
        return ids, r.status_code


def test_mock_is_offered_only_alone_or_when_models_lists_it() -> None:
    assert served_models({"providers": {"up": UP}, "models": {"m": {"provider": "up"}}}) == (["m"], 400)
    listed = {"providers": {"up": UP}, "models": {"m": {"provider": "up"}, "mock": {"provider": "mock"}}}
    assert served_models(listed) == (["m", "mock"], 200)
    assert served_models({}) == (["mock"], 200)


def test_mock_is_not_offered_beside_providers_found_in_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-env")
    assert served_models({}) == ([], 400)


def test_environment_keys_stay_off_a_shared_listener_without_auth(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env")
    assert "openai" in load_settings(host="127.0.0.1").provider_table()
    with pytest.raises(ConfigError, match=r"auth\.anonymous: true"):
        load_settings(host="0.0.0.0")
    anonymous = load_settings(host="0.0.0.0", auth={"anonymous": True})
    assert set(anonymous.provider_table()) == {"mock"} and anonymous.serves_mock_model()
    keyed = load_settings(host="0.0.0.0", auth={"api_keys": [{"key": "sk-a", "tenant": "a"}]})
    assert "openai" in keyed.provider_table()
    # a fallback that only the environment's provider could serve is refused where that provider is off
    models = {"m": {"provider": "mock", "fallbacks": ["openai/gpt-4o"]}}
    assert load_settings(host="127.0.0.1", models=models).models["m"].fallbacks == ["openai/gpt-4o"]
    with pytest.raises(ConfigError, match=r"models\.m\.fallbacks\.0: unknown model 'openai/gpt-4o'"):
        load_settings(host="0.0.0.0", auth={"anonymous": True}, models=models)
