"""Ids for responses and items: a type prefix and 24 random hex digits (96 bits); and the one rule
for an id that comes from outside (a client's X-Request-Id, an upstream's request id)."""

from __future__ import annotations

import os
import re
from collections import deque

_FOREIGN_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
# The random parts are drawn from the OS in batches (one getrandom call per 256 ids, not one per
# id): each is still 96 fresh bits of os.urandom, shared with no other id. deque.popleft is atomic,
# so threads never get the same one, and a forked child starts with an empty pool (its own bytes).
_HEX_PER_ID = 24
_BATCH = 256
_pool: deque[str] = deque()


def _refill() -> None:
    raw = os.urandom(_HEX_PER_ID // 2 * _BATCH).hex()
    _pool.extend([raw[i : i + _HEX_PER_ID] for i in range(0, len(raw), _HEX_PER_ID)])


os.register_at_fork(after_in_child=_pool.clear)


def safe_id(value: object) -> str | None:
    """``value`` if it is id-shaped (1 to 128 letters, digits and ``._:-``), else None: an id a
    client or an upstream sends reaches a header or a log line only in that shape."""
    return value if isinstance(value, str) and _FOREIGN_ID.fullmatch(value) is not None else None


def new_id(prefix: str) -> str:
    while True:
        try:
            return f"{prefix}_{_pool.popleft()}"
        except IndexError:
            _refill()


def response_id() -> str:
    return new_id("resp")
