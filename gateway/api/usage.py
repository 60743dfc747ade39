"""GET /v1/usage: the usage ledger's counts for the caller's own tenant; an admin key
(``admin.api_keys``) may name one with ``tenant=`` or, without it, read every tenant's.

Query: ``start`` and ``end`` (YYYY-MM-DD, UTC, inclusive; both default to today, at most
``RETENTION_DAYS`` days), ``group_by`` (model | key | day; default model), ``tenant`` (admin)."""

from __future__ import annotations

from datetime import date, timedelta

from starlette.requests import Request
from starlette.responses import Response

from gateway.api.exchange import error_response, json_response
from gateway.engine.auth import Admin
from gateway.engine.orchestrator import Gateway
from gateway.engine.usage import GROUPS, utc_day
from gateway.kernel.errors import ErrorCode, GatewayError, InvalidRequest, PermissionDenied
from state.usage import RETENTION_DAYS

_PARAMS = ("start", "end", "group_by", "tenant")


def _day(value: str | None, param: str, default: date) -> date:
    if value is None:
        return default
    try:
        if len(value) != 10:
            raise ValueError
        return date.fromisoformat(value)
    except ValueError:
        raise InvalidRequest(
            f"'{param}' must be a date as YYYY-MM-DD.", param=param, code=ErrorCode.INVALID_VALUE
        ) from None


async def get_usage(request: Request, gw: Gateway) -> Response:
    q = request.query_params
    try:
        caller = gw.auth.identify(request.headers.get("authorization"))
        for name in q:
            if name not in _PARAMS:
                shown = name[:64]
                raise InvalidRequest(
                    f"Unknown parameter '{shown}'.", param=shown, code=ErrorCode.UNKNOWN_PARAMETER
                )
        today = date.fromisoformat(utc_day())
        end = _day(q.get("end"), "end", today)
        start = _day(q.get("start"), "start", end)
        if start > end:
            raise InvalidRequest(
                "'start' must not be after 'end'.", param="start", code=ErrorCode.INVALID_VALUE
            )
        if end - start >= timedelta(days=RETENTION_DAYS):
            raise InvalidRequest(
                f"At most {RETENTION_DAYS} days may be read at once.",
                param="start",
                code=ErrorCode.INVALID_VALUE,
            )
        group_by = q.get("group_by", "model")
        if group_by not in GROUPS:
            raise InvalidRequest(
                f"'group_by' must be one of {', '.join(GROUPS)}.",
                param="group_by",
                code=ErrorCode.INVALID_VALUE,
            )
        tenant = q.get("tenant")
        if isinstance(caller, Admin):
            known = gw.tenants()
            if tenant is not None and tenant not in known:
                raise InvalidRequest(
                    f"No tenant '{tenant[:64]}'.", param="tenant", code=ErrorCode.INVALID_VALUE
                )
            tenants = [tenant] if tenant is not None else known
        else:
            if tenant is not None and tenant != caller.tenant:
                raise PermissionDenied("A client key may read only its own tenant's usage.", param="tenant")
            tenants = [caller.tenant]
        report = await gw.meter.report(tenants, start, end, group_by)
    except GatewayError as err:
        return error_response(err)
    report["tenant"] = None if isinstance(caller, Admin) and tenant is None else tenants[0]
    return json_response(report)
