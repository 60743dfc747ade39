"""Ids for responses and items: a type prefix and 24 random hex digits (96 bits); and the one rule
for an id that comes from outside (a client's X-Request-Id, an upstream's request id)."""

from __future__ import annotations

import os
import re

_FOREIGN_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")


def safe_id(value: object) -> str | None:
    """``value`` if it is id-shaped (1 to 128 letters, digits and ``._:-``), else None: an id a
    client or an upstream sends reaches a header or a log line only in that shape."""
    return value if isinstance(value, str) and _FOREIGN_ID.fullmatch(value) is not None else None


def new_id(prefix: str) -> str:
    return f"{prefix}_{os.urandom(12).hex()}"


def response_id() -> str:
    return new_id("resp")
