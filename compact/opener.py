"""Open a ``compaction`` input item into a message every upstream model can read.

The summary becomes a ``user`` message (not system/developer): it is derived from conversation
content, so it must not gain instruction authority. It keeps the compaction id (``cmp_…``), which is
how a later compaction recognizes and folds it. An empty summary opens into nothing. An inline
compaction item (``context_management``, compact/inline.py) also carries the items kept verbatim
around the summary, and opens into the whole ``Window`` it replaced.
"""

from __future__ import annotations

from typing import Any

from compact.seal import Sealer
from compact.strategy import SUMMARY_ID_PREFIX
from gateway.engine.context import Window
from gateway.kernel.ids import new_id
from gateway.kernel.items import message
from gateway.kernel.spec.request import CompactionItem

Item = dict[str, Any]

SUMMARY_MESSAGE_HEADER = (
    "Summary of the earlier part of this conversation (it was compacted; this replaces those messages):\n\n"
)


def summary_message(summary: str, cid: str) -> Item:
    """The message a summary opens into (the same bytes on every opening)."""
    return message("user", SUMMARY_MESSAGE_HEADER + summary, item_id=cid)


class Opener:
    """The ``open_compaction`` hook of the engine's ``Gateway``; raises InvalidEncryptedContent."""

    def __init__(self, sealer: Sealer) -> None:
        self.sealer = sealer

    def __call__(self, item: CompactionItem, tenant: str) -> list[Item]:
        payload = self.sealer.open(item.encrypted_content, tenant, param="input.encrypted_content")
        summary = payload.get("summary")
        cid = payload.get("id")
        if not isinstance(cid, str) or not cid.startswith(SUMMARY_ID_PREFIX):
            cid = new_id(SUMMARY_ID_PREFIX.rstrip("_"))
        opened = [summary_message(summary, cid)] if isinstance(summary, str) and summary.strip() else []
        window = payload.get("window")
        if isinstance(window, dict):  # sealed by this gateway: its items are normalized ones
            return Window([*window.get("pinned", ()), *opened, *window.get("recent", ())])
        return opened
