"""The WebSocket's connection-local cache: the latest responses of one socket, each with its
effective transcript (inherited chain + own input + output in input form), bounded LRU.

It is the only home of ``store: false`` state, it is never shared across connections, and a
continuation that fails evicts the id it referenced, so that retrying it cannot succeed from a
cache that no longer matches what the client saw.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from gateway.kernel.estimate import estimate
from gateway.kernel.items import output_as_input
from state.base import Transcript

Item = dict[str, Any]


class ConnectionCache:
    """Implements ``state.base.ConnectionCache`` for one connection.

    Transcripts share their item dicts with the turn that produced them (and with each other),
    so an entry costs one list of references, not a copy of the history. Each keeps its estimated
    tokens and call ids, so a continuation counts and checks only its new items."""

    __slots__ = ("_entries", "max_entries")

    def __init__(self, max_entries: int) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        self.max_entries = max_entries
        self._entries: OrderedDict[str, Transcript] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, response_id: object) -> bool:
        return response_id in self._entries

    def get_transcript(self, response_id: str) -> Transcript | None:
        transcript = self._entries.get(response_id)
        if transcript is not None:
            self._entries.move_to_end(response_id)
        return transcript

    def find_item(self, item_id: str) -> Item | None:
        # Newest first: the latest transcript usually contains the whole chain.
        for transcript in reversed(self._entries.values()):
            for item in transcript.items:
                if item.get("id") == item_id:
                    return item
        return None

    def put(self, response_id: str, transcript: Transcript) -> None:
        self._entries[response_id] = transcript
        self._entries.move_to_end(response_id)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    def remember(self, response_id: str, ran_on: Transcript, output: list[Item]) -> None:
        """Cache a finished turn: the transcript it ran on plus its output items in input form
        (``ran_on.depth`` counts the responses before this one)."""
        # An inline compaction item (the first output of a turn that compacted) is already
        # opened in ``ran_on``: the compacted window that turn ran on.
        produced = [output_as_input(o) for o in output if o.get("type") != "compaction"]
        calls = {o["call_id"] for o in produced if o.get("type") == "function_call"}
        self.put(
            response_id,
            Transcript(
                items=[*ran_on.items, *produced],
                tokens=None if ran_on.tokens is None else ran_on.tokens + estimate(produced),
                calls=ran_on.calls | calls if calls else ran_on.calls,
                depth=ran_on.depth + 1,
            ),
        )

    def evict(self, response_id: str) -> None:
        self._entries.pop(response_id, None)

    def clear(self) -> None:
        self._entries.clear()
