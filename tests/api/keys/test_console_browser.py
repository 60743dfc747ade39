"""The console in a real browser: headless Chromium from the distribution's packages, driven by
Playwright (never its own browser download). Signs in with an admin key, checks the charts'
numbers against GET /v1/usage, creates a key (its secret shown once), uses it against
/v1/responses, revokes it, and sees it refused. Saves docs/img/console.png.

Skipped only where no Chromium is installed, and never under CI=true (it then fails)."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.harness import ServedApp, serve_gateway

CHROMIUM = next(
    (p for p in ("/usr/bin/chromium", shutil.which("chromium") or "") if p and Path(p).exists()), None
)
SHOT = Path(__file__).resolve().parents[3] / "docs" / "img" / "console.png"
ADMIN = {"Authorization": "Bearer sk-admin"}

if CHROMIUM is None:
    if os.environ.get("CI") == "true":
        raise RuntimeError("CI=true: the console's browser test needs Chromium (.ci/run installs it)")
    pytest.skip("no Chromium installed (apt-get install chromium)", allow_module_level=True)


@pytest.fixture
def gw() -> Iterator[ServedApp]:
    cfg: dict[str, Any] = {
        "auth": {
            "api_keys": [
                {"key": "sk-a", "tenant": "alpha", "name": "a"},
                {"key": "sk-b", "tenant": "beta", "name": "b"},
            ]
        },
        "admin": {"api_keys": [{"key": "sk-admin", "name": "ops"}]},
        "tenants": {"alpha": {"budget": {"tokens": 100000, "amount": "5.00", "period": "month"}}},
        "models": {"mock": {"provider": "mock"}, "mock-large": {"provider": "mock"}},
    }
    with serve_gateway(cfg) as served:
        yield served


def respond(base: str, key: str, model: str = "mock", text: str = "hi") -> httpx.Response:
    return httpx.post(
        f"{base}/v1/responses",
        json={"model": model, "input": text},
        headers={"Authorization": f"Bearer {key}"},
        timeout=10,
    )


def test_console_create_use_revoke_and_charts_match_usage(gw: ServedApp) -> None:
    from playwright.sync_api import sync_playwright

    base = gw.base_url
    for key, model, text in (
        ("sk-a", "mock", "hello there"),
        ("sk-a", "mock-large", "a longer question for the large model"),
        ("sk-b", "mock", "hi"),
    ):
        assert respond(base, key, model, text).status_code == 200
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1100, "height": 760})
            page.goto(f"{base}/console")
            page.fill("#key", "wrong")
            page.click("#login")
            assert page.locator(".problem").is_visible()
            page.fill("#key", "sk-admin")
            page.click("#login")
            page.wait_for_selector('[data-chart="tenant"] g[data-label]')
            # the session cookie: HttpOnly, SameSite=Strict; nothing secret in the page
            (cookie,) = page.context.cookies()
            assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
            assert "sk-admin" not in page.content()

            # the charts' numbers are GET /v1/usage's
            usage = httpx.get(f"{base}/v1/usage", params={"group_by": "model"}, headers=ADMIN).json()
            by_tenant: dict[str, int] = {}
            by_model: dict[str, int] = {}
            for row in usage["data"]:
                by_tenant[row["tenant"]] = by_tenant.get(row["tenant"], 0) + row["total_tokens"]
                by_model[row["model"]] = by_model.get(row["model"], 0) + row["total_tokens"]
            assert by_tenant and all(by_tenant.values())

            def bars(chart: str) -> dict[str, int]:
                return {
                    g.get_attribute("data-label") or "": int(g.get_attribute("data-total-tokens") or -1)
                    for g in page.locator(f'[data-chart="{chart}"] g[data-label]').all()
                }

            assert bars("tenant") == by_tenant
            assert bars("model") == by_model
            assert sum(bars("day").values()) == usage["totals"]["total_tokens"]
            assert page.locator("#totals").get_attribute("data-total-tokens") == str(
                usage["totals"]["total_tokens"]
            )
            SHOT.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(SHOT), full_page=True)

            # create a key: the secret is shown once
            page.click('nav button[data-tab="keys"]')
            page.fill("#k-tenant", "web")
            page.fill("#k-name", "browser")
            page.click("#k-create")
            page.wait_for_selector("#secret:not([hidden])")
            secret = page.locator("#secret-value").inner_text().strip()
            assert secret.startswith("sk-gw-")
            page.click("#secret-done")
            assert page.locator("#secret-value").inner_text() == ""
            page.reload()
            page.click('nav button[data-tab="keys"]')
            page.wait_for_selector("[data-revoke]")
            assert secret not in page.content()
            # it works
            assert respond(base, secret).status_code == 200
            # revoke it from the console: refused
            (key_id,) = [k["id"] for k in httpx.get(f"{base}/admin/keys", headers=ADMIN).json()["data"]]
            page.click(f'[data-revoke="{key_id}"]')
            deadline = time.monotonic() + 5
            while respond(base, secret).status_code != 401:
                assert time.monotonic() < deadline, "the revoked key is still served"
                time.sleep(0.05)
            page.locator("[data-revoke]").wait_for(state="detached")

            # the other pages render; the config shows no secret
            page.click('nav button[data-tab="config"]')
            page.wait_for_selector("#config pre:not(:empty)")
            config_text = page.locator("#config pre").inner_text()
            assert "sk-a" not in config_text and "sk-admin" not in config_text
            page.click('nav button[data-tab="budgets"]')
            page.wait_for_selector("#budgets tbody tr")
            budgets = page.locator("#budgets tbody").inner_text()
            assert "alpha" in budgets
            # the admission's own counters: its token and its money budget, with their limits
            assert "of 100000 tokens" in budgets and "of 5.00" in budgets
        finally:
            browser.close()


def test_a_state_changing_call_with_the_cookie_but_no_csrf_token_is_refused(gw: ServedApp) -> None:
    base = gw.base_url
    with httpx.Client(base_url=base) as client:
        login = client.post("/console/login", data={"key": "sk-admin"})
        assert login.status_code in (200, 303)
        assert client.cookies.get("gw_console")
        refused = client.post("/admin/keys", json={"tenant": "x"})
        assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
        page = client.get("/console").text
        token = page.split('name="csrf" content="')[1].split('"')[0]
        made = client.post("/admin/keys", json={"tenant": "x"}, headers={"x-console-csrf": token})
        assert made.status_code == 201
        assert client.get("/console/api/overview").status_code == 401
        assert client.get("/console/api/overview", headers={"x-console-csrf": token}).status_code == 200
