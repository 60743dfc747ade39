"""Read routes over stored responses (a superset of the spec that clients use), tenant-scoped:
GET/DELETE /v1/responses/{id} and GET /v1/responses/{id}/input_items (cursor pagination).

Each read or delete of an authenticated caller writes one audit line (``stored_response``): the
action, tenant, key name, response id and result (found / not_found / deleted).

A ``retention: none`` tenant has no stored responses: every id is not found, without a store read.
Nor is a response still being generated: its id has only its write-ahead record (``state/base.py``),
which no read sees, so it is not found until it is stored, for its own tenant as for any other;
except a background response, stored as it stands from the start (``queued``, ``in_progress``),
and streamed with ``?stream=true&starting_after=N`` (``gateway/api/background.py``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import structlog
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from gateway.api import background
from gateway.api.exchange import error_response, json_response
from gateway.engine.auth import Principal
from gateway.engine.orchestrator import Gateway
from gateway.kernel.errors import ErrorCode, GatewayError, InvalidRequest, NotFound

if TYPE_CHECKING:
    from state.base import StoredResponse

audit_log = structlog.get_logger("gateway.audit")


def _not_found(response_id: str) -> NotFound:
    return NotFound(f"Response with id '{response_id}' not found.", param="response_id")


async def _read(
    request: Request, gw: Gateway, principal: Principal, response_id: str, action: str
) -> StoredResponse:
    """The caller's stored response (audited); ``NotFound`` when its tenant has none by that id.
    A background response still running is read as it stands (one whose owner died, marked
    failed: ``BackgroundRuns.current``)."""
    runs = background.runs_of(request)
    stored = await runs.current(principal.tenant, response_id) if gw.retains(principal.tenant) else None
    _audit(request, action, principal, response_id, "not_found" if stored is None else "found")
    if stored is None:
        raise _not_found(response_id)
    return stored


def _audit(request: Request, action: str, principal: Principal, response_id: str, result: str) -> None:
    audit_log.info(
        "stored_response",
        action=action,
        tenant=principal.tenant,
        key_name=principal.key_name,
        response_id=response_id,
        result=result,
        request_id=request.headers.get("x-request-id"),
    )


async def get_response(request: Request, gw: Gateway) -> Response:
    rid = request.path_params["response_id"]
    try:
        principal = gw.auth.authenticate(request.headers.get("authorization"))
        if request.query_params.get("stream") in ("true", "1"):
            _audit(request, "stream", principal, rid, "requested")
            return _Resume(gw, principal, rid)
        stored = await _read(request, gw, principal, rid, "get")
    except GatewayError as err:
        return error_response(err)
    return json_response(stored.resource)


class _Resume(Response):
    """A background response's stream, resumed (``gateway/api/background.py`` ``resume``)."""

    def __init__(self, gw: Gateway, principal: Principal, response_id: str) -> None:
        super().__init__()
        self.gw, self.principal, self.response_id = gw, principal, response_id

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await background.resume(scope, receive, send, self.gw, self.principal, self.response_id)


async def delete_response(request: Request, gw: Gateway) -> Response:
    rid = request.path_params["response_id"]
    try:
        principal = gw.auth.authenticate(request.headers.get("authorization"))
        deleted = gw.retains(principal.tenant) and await gw.store.delete(principal.tenant, rid)
        _audit(request, "delete", principal, rid, "deleted" if deleted else "not_found")
        if not deleted:
            raise _not_found(rid)
    except GatewayError as err:
        return error_response(err)
    return json_response({"id": rid, "object": "response", "deleted": True})


async def list_input_items(request: Request, gw: Gateway) -> Response:
    """OpenAI-style list: ``order`` (desc default), ``limit`` 1–100 (20), ``after``/``before`` item ids."""
    rid = request.path_params["response_id"]
    q = request.query_params
    try:
        principal = gw.auth.authenticate(request.headers.get("authorization"))
        order = q.get("order", "desc")
        if order not in ("asc", "desc"):
            raise InvalidRequest(
                "'order' must be 'asc' or 'desc'.", param="order", code=ErrorCode.INVALID_VALUE
            )
        try:
            limit = int(q.get("limit", "20"))
        except ValueError:
            limit = -1
        if not 1 <= limit <= 100:
            raise InvalidRequest(
                "'limit' must be an integer from 1 to 100.", param="limit", code=ErrorCode.INVALID_VALUE
            )
        stored = await _read(request, gw, principal, rid, "list_input_items")
        items = list(stored.input_items)
        if order == "desc":
            items.reverse()
        ids = [i.get("id") for i in items]
        start, end = 0, len(items)
        for cursor, param in ((q.get("after"), "after"), (q.get("before"), "before")):
            if cursor is None:
                continue
            if cursor not in ids:
                raise InvalidRequest(
                    f"No input item with id '{cursor}'.", param=param, code=ErrorCode.INVALID_VALUE
                )
            if param == "after":
                start = ids.index(cursor) + 1
            else:
                end = ids.index(cursor)
    except GatewayError as err:
        return error_response(err)
    window = items[start:end]
    page = window[:limit]
    return json_response(
        {
            "object": "list",
            "data": page,
            "first_id": page[0].get("id") if page else None,
            "last_id": page[-1].get("id") if page else None,
            "has_more": len(window) > limit,
        }
    )
