"""``/admin/keys``: virtual keys (gateway/engine/vkeys.py) made, read, changed, rotated and revoked
without a reload.

Who may: an admin key (``admin.api_keys``, every tenant), the console's admin session (cookie and
CSRF header, gateway/api/console), or a virtual key an admin made with ``tenant_admin: true``
(its own tenant's keys only: another tenant's is 403). Every action writes one audit line
(``gateway.audit``: who, what, which key id; never a secret)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import orjson
import structlog
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.requests import Request
from starlette.responses import Response

from gateway.api.exchange import error_response, json_response, read_body
from gateway.engine.auth import Admin, Principal
from gateway.engine.orchestrator import Gateway
from gateway.engine.vkeys import NAME_PATTERN, VirtualKey, VirtualKeys, digest_of, new_key_id, new_secret
from gateway.kernel.errors import (
    AuthenticationFailed,
    ErrorCode,
    GatewayError,
    InvalidRequest,
    NotFound,
    PermissionDenied,
    ServiceUnavailable,
)
from gateway.kernel.settings import Budget, KeyLimits

audit = structlog.get_logger("gateway.audit")

_MAX_BODY = 64 * 1024
MAX_GRACE_SECONDS = 7 * 24 * 3600


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=False)


Metadata = dict[str, str]


class KeyCreate(_Body):
    tenant: str = Field(pattern=NAME_PATTERN)
    name: str | None = Field(default=None, pattern=NAME_PATTERN)
    models: list[str] | None = None
    limits: KeyLimits = KeyLimits()
    budget: Budget | None = None  # shaped like tenants.<t>.budget
    expires_at: int | None = Field(default=None, ge=0)  # unix seconds
    expires_in: int | None = Field(default=None, ge=1)  # seconds from now
    metadata: Metadata = Field(default_factory=dict, max_length=32)
    tenant_admin: bool = False


class KeyPatch(_Body):
    name: str | None = Field(default=None, pattern=NAME_PATTERN)
    models: list[str] | None = None
    limits: KeyLimits | None = None
    budget: Budget | None = None
    expires_at: int | None = Field(default=None, ge=0)
    expires_in: int | None = Field(default=None, ge=1)
    metadata: Metadata | None = Field(default=None, max_length=32)
    tenant_admin: bool | None = None


class Rotate(_Body):
    grace_seconds: int = Field(default=0, ge=0, le=MAX_GRACE_SECONDS)


@dataclass(frozen=True, slots=True)
class Actor:
    """Who acts: an admin (every tenant) or a tenant's admin key (``tenant``)."""

    name: str
    tenant: str | None = None  # None: an admin

    def may(self, tenant: str) -> bool:
        return self.tenant is None or self.tenant == tenant


def actor_of(request: Request, gw: Gateway) -> Actor:
    from gateway.api.console import session_admin  # the console's session, beside the bearer key

    session = session_admin(request, gw, state_changing=request.method != "GET")
    if session is not None:
        return Actor(session.name)
    authorization = request.headers.get("authorization")
    if not authorization:
        raise AuthenticationFailed("Missing admin key: send 'Authorization: Bearer <admin key>'.")
    found = gw.auth.identify(authorization)
    if isinstance(found, Admin):
        return Actor(found.name)
    if found is gw.auth.anonymous:
        raise AuthenticationFailed("Invalid API key.")
    assert isinstance(found, Principal)
    if found.tenant_admin:
        return Actor(found.key_name or "?", found.tenant)
    raise PermissionDenied("Managing keys needs an admin key, or a key allowed to manage its tenant's keys.")


def _registry(gw: Gateway) -> VirtualKeys:
    if gw.virtual_keys is None:
        raise ServiceUnavailable("Virtual keys are not available.")
    return gw.virtual_keys


async def _parse(request: Request, model: type[_Body], empty_ok: bool = False) -> Any:
    raw = await read_body(request, _MAX_BODY)
    if not raw.strip() and empty_ok:
        return model()
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise InvalidRequest("The request body is not valid JSON.", code=ErrorCode.INVALID_JSON) from None
    if not isinstance(data, dict):
        raise InvalidRequest("The request body must be a JSON object.", code=ErrorCode.INVALID_VALUE)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = ".".join(str(p) for p in first["loc"]) or None
        code = ErrorCode.UNKNOWN_PARAMETER if first["type"] == "extra_forbidden" else ErrorCode.INVALID_VALUE
        if first["type"] == "missing":
            code = ErrorCode.MISSING_REQUIRED_PARAMETER
        raise InvalidRequest(f"Invalid '{param}': {first['msg']}.", param=param, code=code) from None


def _expiry(expires_at: int | None, expires_in: int | None, now: int) -> int | None:
    if expires_at is not None and expires_in is not None:
        raise InvalidRequest(
            "Give 'expires_at' or 'expires_in', not both.", param="expires_in", code=ErrorCode.INVALID_VALUE
        )
    return now + expires_in if expires_in is not None else expires_at


def _check_metadata(metadata: Metadata | None) -> None:
    for k, v in (metadata or {}).items():
        if len(k) > 64 or len(v) > 512:
            raise InvalidRequest(
                "Metadata keys are at most 64 characters, values at most 512.",
                param="metadata",
                code=ErrorCode.INVALID_VALUE,
            )


def _key(registry: VirtualKeys, actor: Actor, key_id: str) -> VirtualKey:
    rec = registry.get(key_id)
    if rec is None:
        raise NotFound(f"No key '{key_id[:64]}'.")
    if not actor.may(rec.tenant):
        raise PermissionDenied("This key may manage only its own tenant's keys.")
    return rec


def _audit(actor: Actor, action: str, rec: VirtualKey, **extra: Any) -> None:
    audit.info(
        "admin_audit",
        actor=actor.name,
        actor_kind="admin" if actor.tenant is None else "tenant_admin",
        action=action,
        key_id=rec.id,
        tenant=rec.tenant,
        **extra,
    )


def _refused(request: Request, err: GatewayError, action: str) -> Response:
    audit.info(
        "admin_audit_refused", action=action, path=request.url.path, status=err.status, error_code=err.code
    )
    return error_response(err)


async def create_key(request: Request, gw: Gateway) -> Response:
    try:
        actor = actor_of(request, gw)
        registry = _registry(gw)
        body: KeyCreate = await _parse(request, KeyCreate)
        if not actor.may(body.tenant):
            raise PermissionDenied("This key may manage only its own tenant's keys.", param="tenant")
        if body.tenant_admin and actor.tenant is not None:
            raise PermissionDenied(
                "Only an admin may make a key that manages its tenant's keys.", param="tenant_admin"
            )
        _check_metadata(body.metadata)
        now = int(time.time())
        secret = new_secret()
        rec = VirtualKey(
            id=new_key_id(),
            tenant=body.tenant,
            name=body.name,
            models=body.models,
            limits=body.limits,
            budget=body.budget,
            expires_at=_expiry(body.expires_at, body.expires_in, now),
            metadata=body.metadata,
            tenant_admin=body.tenant_admin,
            digest=digest_of(secret),
            created_at=now,
            updated_at=now,
            created_by=actor.name,
        )
        await registry.put(rec)
    except GatewayError as err:
        return _refused(request, err, "key.create")
    _audit(actor, "key.create", rec)
    return json_response({**rec.public(), "secret": secret}, status=201)


async def list_keys(request: Request, gw: Gateway) -> Response:
    try:
        actor = actor_of(request, gw)
        registry = _registry(gw)
        tenant = request.query_params.get("tenant")
        if tenant is not None and not actor.may(tenant):
            raise PermissionDenied("This key may read only its own tenant's keys.", param="tenant")
        wanted = tenant or actor.tenant
        data = [r.public() for r in registry.records() if wanted is None or r.tenant == wanted]
    except GatewayError as err:
        return _refused(request, err, "key.list")
    audit.info(
        "admin_audit",
        actor=actor.name,
        action="key.list",
        key_id=None,
        tenant=wanted,
        actor_kind="admin" if actor.tenant is None else "tenant_admin",
    )
    return json_response({"object": "list", "data": data})


async def get_key(request: Request, gw: Gateway) -> Response:
    try:
        actor = actor_of(request, gw)
        rec = _key(_registry(gw), actor, request.path_params["key_id"])
    except GatewayError as err:
        return _refused(request, err, "key.read")
    _audit(actor, "key.read", rec)
    return json_response(rec.public())


async def update_key(request: Request, gw: Gateway) -> Response:
    try:
        actor = actor_of(request, gw)
        registry = _registry(gw)
        rec = _key(registry, actor, request.path_params["key_id"])
        body: KeyPatch = await _parse(request, KeyPatch)
        given = body.model_fields_set
        if "tenant_admin" in given and actor.tenant is not None:
            raise PermissionDenied("Only an admin may change 'tenant_admin'.", param="tenant_admin")
        _check_metadata(body.metadata)
        now = int(time.time())
        changes: dict[str, Any] = {
            f: getattr(body, f) for f in given if f not in ("expires_at", "expires_in")
        }
        if "limits" in changes and changes["limits"] is None:
            changes["limits"] = KeyLimits()
        if "metadata" in changes and changes["metadata"] is None:
            changes["metadata"] = {}
        if "tenant_admin" in changes and changes["tenant_admin"] is None:
            changes["tenant_admin"] = False
        if "expires_at" in given or "expires_in" in given:
            changes["expires_at"] = _expiry(body.expires_at, body.expires_in, now)
        rec = rec.model_copy(update={**changes, "updated_at": now})
        await registry.put(rec)
    except GatewayError as err:
        return _refused(request, err, "key.update")
    _audit(actor, "key.update", rec, fields=sorted(given))
    return json_response(rec.public())


async def rotate_key(request: Request, gw: Gateway) -> Response:
    try:
        actor = actor_of(request, gw)
        registry = _registry(gw)
        rec = _key(registry, actor, request.path_params["key_id"])
        body: Rotate = await _parse(request, Rotate, empty_ok=True)
        now = int(time.time())
        secret = new_secret()
        grace = body.grace_seconds
        rec = rec.model_copy(
            update={
                "digest": digest_of(secret),
                "previous_digest": rec.digest if grace else None,
                "previous_until": now + grace if grace else None,
                "updated_at": now,
            }
        )
        await registry.put(rec)
    except GatewayError as err:
        return _refused(request, err, "key.rotate")
    _audit(actor, "key.rotate", rec, grace_seconds=grace)
    return json_response({**rec.public(), "secret": secret})


async def delete_key(request: Request, gw: Gateway) -> Response:
    try:
        actor = actor_of(request, gw)
        registry = _registry(gw)
        rec = _key(registry, actor, request.path_params["key_id"])
        await registry.delete(rec.id)
    except GatewayError as err:
        return _refused(request, err, "key.delete")
    _audit(actor, "key.delete", rec)
    return json_response({"object": "gateway.key.deleted", "id": rec.id, "deleted": True})
