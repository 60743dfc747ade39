"""Versioned bytes for a StoredResponse: one version byte, then an orjson object.

A blob with an unknown version or that does not parse decodes to None ("missing"), so a
rolling upgrade or a corrupt key degrades to previous_response_not_found, never to a 500.
"""

from __future__ import annotations

import logging
from typing import Any

import orjson

from state.base import StoredResponse

VERSION = 1
_VERSION_BYTE = bytes([VERSION])
log = logging.getLogger(__name__)


def encode(response: StoredResponse) -> bytes:
    body = {
        "id": response.id,
        "tenant": response.tenant,
        "model": response.model,
        "prev": response.previous_response_id,
        "input": response.input_items,
        "resource": response.resource,
        "created_at": response.created_at,
        "stored_at": response.stored_at,
    }
    return _VERSION_BYTE + orjson.dumps(body)


def decode(blob: bytes | None) -> StoredResponse | None:
    if not blob or blob[0] != VERSION:
        return None
    try:
        body: dict[str, Any] = orjson.loads(blob[1:])
        return StoredResponse(
            id=body["id"],
            tenant=body["tenant"],
            model=body["model"],
            previous_response_id=body["prev"],
            input_items=body["input"],
            resource=body["resource"],
            created_at=body["created_at"],
            stored_at=body["stored_at"],
        )
    except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
        log.warning("undecodable stored response treated as missing: %s", type(exc).__name__)
        return None


def item_ids(response: StoredResponse) -> list[str]:
    """Ids of the response's own input and output items (what ``get_items`` can resolve)."""
    ids: list[str] = []
    for item in (*response.input_items, *response.output_items):
        item_id = item.get("id") if isinstance(item, dict) else None
        if isinstance(item_id, str):
            ids.append(item_id)
    return ids


def find_items(response: StoredResponse, wanted: set[str]) -> dict[str, dict[str, Any]]:
    """The response's items whose id is in ``wanted``."""
    found: dict[str, dict[str, Any]] = {}
    for item in (*response.input_items, *response.output_items):
        item_id = item.get("id") if isinstance(item, dict) else None
        if item_id in wanted:
            found[item_id] = item
    return found
