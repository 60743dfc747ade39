"""Normalized deltas: the only thing adapters yield.

Adapters never build spec events, ids or sequence numbers; the ResponseBuilder
(gateway/engine/builder.py) turns this small vocabulary into the Open Responses event stream.

Item boundaries are implicit: a delta of another kind (text after a tool call, a new
``ToolCallStart``) closes the open item and opens the next one. ``ItemDone`` closes the
open item explicitly, for two consecutive items of the same kind.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

FinishReason = Literal["stop", "length", "tool_calls", "content_filter"]


@dataclass(slots=True)
class TextDelta:
    """Assistant text; opens an assistant message (and an ``output_text`` part) when none is open.
    ``logprobs``: the provider's token log probabilities for this text, already in the spec's
    shape (``{token, logprob, bytes, top_logprobs}``), when the client asked for them.
    Not frozen, unlike the others: it is made once per upstream token, and a frozen dataclass's
    ``__init__`` (``object.__setattr__`` per field) costs three times as much; nothing mutates it."""

    text: str
    logprobs: list[dict[str, Any]] | None = None


@dataclass(slots=True, frozen=True)
class RefusalDelta:
    """A refusal; a ``refusal`` content part of the open assistant message."""

    text: str


@dataclass(slots=True, frozen=True)
class ReasoningDelta:
    """Raw reasoning text (a ``reasoning_text`` content part of a reasoning item)."""

    text: str


@dataclass(slots=True, frozen=True)
class ReasoningSummaryDelta:
    """Reasoning summary text; ``part`` is the summary index (a new index opens a new summary part)."""

    text: str
    part: int = 0


@dataclass(slots=True, frozen=True)
class ReasoningEncrypted:
    """Opaque reasoning state (OpenAI ``encrypted_content``, an Anthropic thinking signature...).

    Attached to the open reasoning item (opening one when none is open) so the client can send
    it back on the next turn.
    """

    content: str


@dataclass(slots=True, frozen=True)
class ToolCallStart:
    """A function call begins. ``key`` identifies the call for its argument deltas (the provider's
    index or id); ``call_id`` is the provider's call id, or None to let the builder make one."""

    key: int | str
    name: str
    call_id: str | None = None


@dataclass(slots=True, frozen=True)
class ToolCallArgsDelta:
    """A piece of the JSON arguments of the call started with the same ``key``."""

    key: int | str
    delta: str


@dataclass(slots=True, frozen=True)
class ItemDone:
    """Closes the open output item, if any."""


@dataclass(slots=True, frozen=True)
class Usage:
    """Token usage as the provider reported it. Send it once (or again with later totals)."""

    input_tokens: int
    output_tokens: int
    cached_tokens: int = 0
    reasoning_tokens: int = 0
    cache_write_tokens: int = 0


@dataclass(slots=True, frozen=True)
class Finish:
    """Why generation stopped. ``length`` makes the response ``incomplete`` (max_output_tokens)."""

    reason: FinishReason = "stop"
    stop_sequence: str | None = None  # the client's stop sequence that ended it, when the provider says


Delta = (
    TextDelta
    | RefusalDelta
    | ReasoningDelta
    | ReasoningSummaryDelta
    | ReasoningEncrypted
    | ToolCallStart
    | ToolCallArgsDelta
    | ItemDone
    | Usage
    | Finish
)


def as_deltas(got: list[Delta] | str) -> list[Delta]:
    """A stream translator's ``deltas_or_text`` result as ``feed`` gives it: a plain-text chunk's
    text (what ``deltas_or_text`` returns alone, for the stream loop to join) as its one
    ``TextDelta``."""
    return [TextDelta(got)] if isinstance(got, str) else got
