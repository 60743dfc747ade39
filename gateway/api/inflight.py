"""The responses being generated in this process, over every transport, so that a shutdown whose
drain deadline has come can end each one cleanly (``Turn.abort``: the error and
``response.failed`` reach its client) before any connection is cut."""

from __future__ import annotations

from gateway.engine.turn import Turn
from gateway.kernel.errors import GatewayError

__all__ = ["InFlight"]


class InFlight:
    """A set of running turns: ``add`` before a turn runs, ``discard`` once it has returned."""

    __slots__ = ("_turns",)

    def __init__(self) -> None:
        self._turns: dict[Turn, str] = {}  # → its tenant

    def add(self, turn: Turn, tenant: str) -> None:
        self._turns[turn] = tenant

    def discard(self, turn: Turn) -> None:
        self._turns.pop(turn, None)

    def per_tenant(self) -> dict[str, int]:
        """How many turns each tenant has running (the console's live page)."""
        counts: dict[str, int] = {}
        for tenant in self._turns.values():
            counts[tenant] = counts.get(tenant, 0) + 1
        return counts

    def __len__(self) -> int:
        return len(self._turns)

    def abort_all(self, error: GatewayError) -> int:
        """End every turn still generating as failed with ``error``; how many were."""
        return sum(1 for turn in list(self._turns) if turn.abort(error))
