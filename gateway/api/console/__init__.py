"""The console at ``/console``, for admins: usage charts, budgets, virtual keys, live connections
and the config in force (without secrets). Served by the gateway itself: one HTML page and a small
hand-written script and stylesheet shipped in the package (``static/``), no build step, no CDN.

Login: an admin key (``admin.api_keys``) posted once to ``/console/login``; the answer sets a
session cookie (HttpOnly, SameSite=Strict, signed with ``admin.console_secret`` and bound to the
admin key's digest, so removing the key ends its sessions). Every state-changing call made with the
cookie must carry the page's CSRF token in ``x-console-csrf`` (a custom header: a form on another
site can send neither). The key API (/admin/keys) takes the session as an admin's; no secret is
rendered after the one answer that creates or rotates a key."""

from __future__ import annotations

import hashlib
import hmac
import html
import secrets
import time
from datetime import date, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from starlette.requests import Request
from starlette.responses import FileResponse, HTMLResponse, RedirectResponse, Response

from gateway.api.exchange import error_response, json_response, read_body
from gateway.engine.auth import Admin, Principal
from gateway.engine.orchestrator import Gateway
from gateway.engine.usage import GROUPS, utc_day
from gateway.kernel.errors import AuthenticationFailed, ErrorCode, GatewayError, InvalidRequest, NotFound
from state.usage import RETENTION_DAYS

STATIC = Path(__file__).parent / "static"
COOKIE = "gw_console"
CSRF_HEADER = "x-console-csrf"
SESSION_SECONDS = 8 * 3600
_ASSETS = {"console.js": "text/javascript", "console.css": "text/css"}
_PROCESS_SECRET = secrets.token_bytes(32)


def _secret(gw: Gateway) -> bytes:
    configured = gw.settings.admin.console_secret
    if configured is None:
        return _PROCESS_SECRET
    return hashlib.sha256(b"console-session:" + configured.get_secret_value().encode()).digest()


def _mac(gw: Gateway, payload: str) -> str:
    return hmac.new(_secret(gw), payload.encode(), hashlib.sha256).hexdigest()


def _cookie_for(gw: Gateway, name: str, digest: bytes, expires: int) -> str:
    payload = f"{name}|{expires}"
    return f"{payload}|{_mac(gw, payload + '|' + digest.hex())}"


def csrf_token(gw: Gateway, cookie: str) -> str:
    return _mac(gw, "csrf|" + cookie)[:40]


def _session(request: Request, gw: Gateway) -> tuple[Admin, str] | None:
    cookie = request.cookies.get(COOKIE)
    if not cookie:
        return None
    parts = cookie.rsplit("|", 2)
    if len(parts) != 3 or not parts[1].isdigit() or int(parts[1]) < time.time():
        return None
    name, expires, mac = parts
    for key in gw.settings.admin.api_keys:
        if key.name == name:
            good = _mac(gw, f"{name}|{expires}|{key.digest().hex()}")
            if hmac.compare_digest(good, mac):
                return Admin(name), cookie
    return None


def session_admin(request: Request, gw: Gateway, *, state_changing: bool) -> Admin | None:
    """The console session's admin (None: no valid session cookie). A state-changing call with the
    cookie but without the page's CSRF token is refused (401), whatever else it carries."""
    found = _session(request, gw)
    if found is None:
        return None
    admin, cookie = found
    if state_changing or request.headers.get(CSRF_HEADER) is not None:
        sent = request.headers.get(CSRF_HEADER) or ""
        if not hmac.compare_digest(sent, csrf_token(gw, cookie)):
            raise AuthenticationFailed(
                f"Missing or wrong CSRF token: send the console's '{CSRF_HEADER}' header."
            )
    return admin


def _page(body: str, csrf: str = "") -> HTMLResponse:
    meta = f'<meta name="csrf" content="{html.escape(csrf)}">' if csrf else ""
    doc = (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"{meta}<title>Gateway console</title>"
        '<link rel="stylesheet" href="/console/static/console.css"></head>'
        f"<body>{body}</body></html>"
    )
    headers = {
        "cache-control": "no-store",
        "content-security-policy": "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'",
        "x-frame-options": "DENY",
        "referrer-policy": "no-referrer",
    }
    return HTMLResponse(doc, headers=headers)


_LOGIN = """<main class="login"><h1>Gateway console</h1>
<form method="post" action="/console/login"><label>Admin key
<input type="password" name="key" id="key" autocomplete="off" required></label>
<button type="submit" id="login">Sign in</button></form>{problem}</main>"""

_APP = """<header><h1>Gateway console</h1><span id="who"></span>
<button id="logout" type="button">Sign out</button></header>
<nav><button data-tab="usage" class="on">Usage</button><button data-tab="budgets">Budgets</button>
<button data-tab="keys">Keys</button><button data-tab="live">Live</button>
<button data-tab="config">Config</button></nav>
<main>
<section id="usage"><form id="range"><label>From <input type="date" id="start"></label>
<label>To <input type="date" id="end"></label><button type="submit">Show</button></form>
<div class="charts"><figure data-chart="tenant"><figcaption>Tokens by tenant</figcaption></figure>
<figure data-chart="model"><figcaption>Tokens by model</figcaption></figure>
<figure data-chart="day"><figcaption>Tokens by day</figcaption></figure></div>
<p id="totals"></p></section>
<section id="budgets" hidden><table><thead><tr><th>Tenant</th><th>Budget</th><th>Period</th>
<th>Used</th></tr></thead><tbody></tbody></table></section>
<section id="keys" hidden><form id="create"><label>Tenant <input id="k-tenant" required></label>
<label>Name <input id="k-name"></label><label>Models <input id="k-models" placeholder="all"></label>
<label>Expires in (s) <input id="k-expires" type="number" min="1"></label>
<button type="submit" id="k-create">Create key</button></form>
<div id="secret" hidden><p>The new key's secret, shown once: copy it now.</p><code id="secret-value"></code>
<button type="button" id="secret-done">Done</button></div>
<table><thead><tr><th>Id</th><th>Tenant</th><th>Name</th><th>Models</th><th>Expires</th><th></th></tr>
</thead><tbody></tbody></table></section>
<section id="live" hidden><table><thead><tr><th>Tenant</th><th>WebSocket connections</th>
<th>In-flight responses</th></tr></thead><tbody></tbody></table></section>
<section id="config" hidden><pre></pre></section>
</main><script src="/console/static/console.js"></script>"""


async def console_page(request: Request, gw: Gateway) -> Response:
    found = _session(request, gw)
    if found is None:
        return _page(_LOGIN.format(problem=""))
    admin, cookie = found
    return _page(
        _APP.replace('<span id="who"></span>', f'<span id="who">{html.escape(admin.name)}</span>'),
        csrf_token(gw, cookie),
    )


async def login(request: Request, gw: Gateway) -> Response:
    raw = await read_body(request, 8192)
    key = (parse_qs(raw.decode("utf-8", "replace")).get("key") or [""])[0].strip()
    digest = hashlib.sha256(key.encode()).digest()
    for admin_key in gw.settings.admin.api_keys:
        if key and hmac.compare_digest(admin_key.digest(), digest):
            expires = int(time.time()) + SESSION_SECONDS
            response = RedirectResponse("/console", status_code=303)
            response.set_cookie(
                COOKIE,
                _cookie_for(gw, admin_key.name, digest, expires),
                max_age=SESSION_SECONDS,
                path="/",
                httponly=True,
                samesite="strict",
                secure=request.url.scheme == "https",
            )
            return response
    page = _page(_LOGIN.format(problem='<p class="problem">That is not an admin key.</p>'))
    page.status_code = 401
    return page


async def logout(request: Request, gw: Gateway) -> Response:
    try:
        session_admin(request, gw, state_changing=True)
    except GatewayError as err:
        return error_response(err)
    response = json_response({"signed_out": True})
    response.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict")
    return response


async def asset(request: Request) -> Response:
    name = request.path_params["name"]
    if name not in _ASSETS:
        return error_response(NotFound(f"No asset '{name[:64]}'."))
    return FileResponse(STATIC / name, media_type=_ASSETS[name], headers={"cache-control": "no-cache"})


def _admin(request: Request, gw: Gateway) -> Admin:
    admin = session_admin(request, gw, state_changing=True)  # every console read carries the token too
    if admin is None:
        raise AuthenticationFailed("Sign in to the console first.")
    return admin


async def console_usage(request: Request, gw: Gateway) -> Response:
    """The usage of every tenant (``GET /v1/usage`` as an admin reads it): ``start``, ``end``,
    ``group_by``."""
    try:
        _admin(request, gw)
        q = request.query_params
        try:
            end = date.fromisoformat(q.get("end") or utc_day())
            start = date.fromisoformat(q.get("start") or end.isoformat())
        except ValueError:
            raise InvalidRequest(
                "Dates are YYYY-MM-DD.", param="start", code=ErrorCode.INVALID_VALUE
            ) from None
        group_by = q.get("group_by", "model")
        if group_by not in GROUPS or start > end or end - start >= timedelta(days=RETENTION_DAYS):
            raise InvalidRequest("Bad range or grouping.", param="group_by", code=ErrorCode.INVALID_VALUE)
        report = await gw.meter.report(gw.tenants(), start, end, group_by)
    except GatewayError as err:
        return error_response(err)
    report["tenant"] = None
    return json_response(report)


_SECRET_WORDS = ("key", "secret", "password", "token_value", "url", "sha256", "digest", "authorization")


def redact(value: Any, name: str = "") -> Any:
    """The config as JSON without secrets, digests or upstream addresses."""
    if any(w in name.lower() for w in _SECRET_WORDS) and name not in ("api_keys",):
        if value is None or isinstance(value, bool | int | float):
            return value
        return "(hidden)"
    if isinstance(value, dict):
        return {k: redact(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [redact(v, name) for v in value]
    return value


async def console_overview(request: Request, gw: Gateway) -> Response:
    """Budgets and their use this period, live connections and in-flight responses per tenant,
    and the config in force (redacted)."""
    try:
        _admin(request, gw)
        budgets: list[dict[str, Any]] = []
        for tenant, ts in sorted(gw.settings.tenants.items()):
            if ts.budget is None:
                continue
            # the counters the admission reads (money and tokens alike), the same on every replica
            uses = await gw.limits.budget_use(Principal(tenant=tenant))
            budgets.append(
                {
                    "tenant": tenant,
                    "budget": ts.budget.model_dump(mode="json"),
                    "use": [{"unit": u.unit, "limit": u.limit, "used": u.used} for u in uses],
                }
            )
        for rec in gw.virtual_keys.records() if gw.virtual_keys is not None else ():
            if rec.budget is not None:
                budgets.append(
                    {"tenant": rec.tenant, "key": rec.id, "budget": rec.budget.model_dump(mode="json")}
                )
        live: dict[str, dict[str, int]] = {}
        for conn in list(request.app.state.ws_hub.connections):
            row = live.setdefault(
                conn.principal.tenant, {"websocket_connections": 0, "inflight_responses": 0}
            )
            row["websocket_connections"] += 1
        for tenant, n in request.app.state.inflight.per_tenant().items():
            row = live.setdefault(tenant, {"websocket_connections": 0, "inflight_responses": 0})
            row["inflight_responses"] += n
        config = redact(gw.settings.model_dump(mode="json"))
    except GatewayError as err:
        return error_response(err)
    return json_response(
        {
            "budgets": budgets,
            "live": [{"tenant": t, **v} for t, v in sorted(live.items())],
            "config": config,
        }
    )
