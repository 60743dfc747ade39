"""What compaction keeps and what it summarizes, the one summary prompt, and the transcript the
summarizing model reads. Pure functions over normalized items (gateway/kernel/items.py).

What is kept: every system/developer message (pinned), then the newest items that fit a token
budget (``CompactionSettings.recent_budget``: ``keep_recent_tokens``, or ``keep_recent_fraction``
of the route's context window), measured with ``gateway/kernel/estimate.py``; everything older is
summarized. So the compacted window is at most the budget plus the summary, unless the pinned
messages alone exceed the budget (they are never dropped). That is inline compaction's plan
(``plan``, once its threshold is crossed).

An explicit ``/v1/responses/compact`` always compacts (``compact_plan``): everything before the
newest user message is summarized, and the tail is also bounded by ``TAIL_SHARE`` of the input."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gateway.kernel.estimate import estimate_item

Item = dict[str, Any]

SUMMARY_ID_PREFIX = "cmp_"  # opened compaction items carry their compaction id (compact/opener.py)

SUMMARY_PROMPT = """\
You are compacting a conversation between a user and an AI assistant so that the assistant can \
continue it without the full history. Write a summary of the conversation transcript you are given.

Keep everything the assistant needs to carry on seamlessly:
- the user's goals, requests, constraints and stated preferences;
- facts, names, numbers, identifiers, code words, file paths and decisions that were established;
- tool calls that were made, with their important arguments and results;
- what has been completed and what is still open or was promised next.

Rules:
- Write in the third person ("The user asked…", "The assistant found…"), as plain text.
- Quote exact values (ids, code, error messages) verbatim when they may matter later.
- If the transcript contains an earlier summary, fold its content into yours.
- Do not answer or continue the conversation; only summarize it.
- Be concise: no preamble, no closing remarks."""

INSTRUCTIONS_HEADER = "\n\nThe assistant in this conversation works under these instructions:\n"
TRANSCRIPT_HEADER = "Conversation transcript to summarize:\n\n"
OMITTED = "[… earlier part of the transcript omitted to fit the model's context window …]"
# An explicit compaction's verbatim tail takes at most this share of the input's estimated tokens
# (pinned messages aside), so its window is about half the input or less, plus the summary.
TAIL_SHARE = 0.5


@dataclass(slots=True)
class Plan:
    """``pinned`` (system/developer messages from the summarized part, kept verbatim in front),
    ``older`` (to summarize), ``recent`` (kept verbatim, in order, after the compaction item)."""

    pinned: list[Item]
    older: list[Item]
    recent: list[Item]


def is_pinned(item: Item) -> bool:
    return item.get("type") == "message" and item.get("role") in ("system", "developer")


def is_summary(item: Item) -> bool:
    """A message opened from an earlier compaction item: always folded into the new summary,
    so its plaintext never comes back to the client."""
    return item.get("type") == "message" and str(item.get("id", "")).startswith(SUMMARY_ID_PREFIX)


def is_user_turn(item: Item) -> bool:
    """A message the user wrote (an opened earlier summary is a ``user`` message too, but not one)."""
    return item.get("type") == "message" and item.get("role") == "user" and not is_summary(item)


def recent_start(items: list[Item], budget: int, max_items: int | None = None, floor: int = 0) -> int:
    """Index where the verbatim tail starts: the longest tail that fits ``budget`` estimated tokens
    together with every pinned message (kept wherever it stands, so charged first), holds at most
    ``max_items`` items (None: no count limit; earlier summaries are folded, so not counted) and
    starts at ``floor`` or later.

    The tail never starts between a function call and its output (a pair is kept or summarized
    whole), nor just after a reasoning item (which stays with the model's item it precedes; a user
    message after it does not need it). An item that does not fit ends the tail: it and everything
    older are summarized, however small the items before it."""
    calls = {i.get("call_id") for i in items if i.get("type") == "function_call"}
    used = sum(estimate_item(i) for i in items if is_pinned(i))
    count = 0
    unanswered: set[Any] = set()  # call ids of outputs in the tail whose call is not in it yet
    start = len(items)
    for n in range(len(items) - 1, floor - 1, -1):
        item = items[n]
        if not is_summary(item):
            count += 1
            if not is_pinned(item):
                used += estimate_item(item)
        if used > budget or (max_items is not None and count > max_items):
            break
        kind, call_id = item.get("type"), item.get("call_id")
        if kind == "function_call_output" and call_id in calls:
            unanswered.add(call_id)
        elif kind == "function_call":
            unanswered.discard(call_id)
        if not unanswered and (n == 0 or items[n - 1].get("type") != "reasoning" or is_user_turn(item)):
            start = n
    return start


def compact_start(items: list[Item], budget: int, max_items: int | None = None) -> int:
    """Index where an explicit compaction's verbatim tail starts.

    When nothing but pinned messages precedes the newest user message, this is ``recent_start``:
    there is nothing older to summarize. Otherwise the tail starts at the newest user message or
    later (anywhere, when there is no user message), and besides ``budget`` it fits ``TAIL_SHARE``
    of the input's unpinned tokens. The newest user message stays however large it is when what
    follows it fits; when what follows does not, the tail is the newest items that do and the user
    message is summarized with everything before it."""
    turn = next((n for n in range(len(items) - 1, -1, -1) if is_user_turn(items[n])), None)
    if turn is not None and all(is_pinned(i) for i in items[:turn]):
        return recent_start(items, budget, max_items)
    pinned = sum(estimate_item(i) for i in items if is_pinned(i))
    unpinned = sum(estimate_item(i) for i in items if not is_pinned(i))
    limit = min(budget, pinned + int(unpinned * TAIL_SHARE))
    if turn is None:
        return recent_start(items, limit, max_items)
    start = recent_start(items, limit, max_items, floor=turn)
    if start > turn and recent_start(items, limit + estimate_item(items[turn]), max_items, turn) == turn:
        return turn  # the user message alone is over the limit: it stays, what precedes is summarized
    return start


def plan(items: list[Item], budget: int, max_items: int | None = None) -> Plan:
    """Inline compaction's split: the tail ``recent_start`` picks."""
    return split(items, recent_start(items, budget, max_items))


def compact_plan(items: list[Item], budget: int, max_items: int | None = None) -> Plan:
    """An explicit compaction's split: the tail ``compact_start`` picks."""
    return split(items, compact_start(items, budget, max_items))


def split(items: list[Item], start: int) -> Plan:
    """Split ``items`` at ``start``: the tail is kept, everything older is summarized except pinned
    messages, and earlier summaries are always summarized again."""
    pinned: list[Item] = []
    older: list[Item] = []
    for item in items[:start]:
        (pinned if is_pinned(item) else older).append(item)
    recent: list[Item] = []
    for item in items[start:]:
        # An earlier summary in the tail is folded into the new one rather than handed back open.
        (older if is_summary(item) else recent).append(item)
    # Earlier summaries cover what came before everything else: summarize them first.
    older.sort(key=lambda i: not is_summary(i))
    return Plan(pinned=pinned, older=older, recent=recent)


def instructions(client_instructions: str | None) -> str:
    """The instructions of the summarization request: the prompt, plus the client's instructions
    as context (they are not carried into the compacted window; clients resend them)."""
    if client_instructions:
        return SUMMARY_PROMPT + INSTRUCTIONS_HEADER + client_instructions
    return SUMMARY_PROMPT


def text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    out: list[str] = []
    for part in content or ():
        kind = part.get("type")
        if kind in ("input_text", "output_text", "text"):
            out.append(part.get("text", ""))
        elif kind == "refusal":
            out.append(f"(refused) {part.get('refusal', '')}")
        elif kind == "input_image":
            out.append("[image]")
        elif kind == "input_file":
            out.append(f"[file {part.get('filename') or ''}]".replace(" ]", "]"))
        elif kind == "input_video":
            out.append("[video]")
    return "\n".join(out)


def render(item: Item) -> str:
    """One item as a transcript entry."""
    kind = item.get("type")
    if kind == "message":
        if is_summary(item):
            return f"[earlier summary]\n{text_of(item.get('content'))}"
        return f"[{item.get('role', 'user')}]\n{text_of(item.get('content'))}"
    if kind == "function_call":
        return f"[tool call {item.get('call_id')}] {item.get('name')}({item.get('arguments', '')})"
    if kind == "function_call_output":
        return f"[tool result {item.get('call_id')}]\n{text_of(item.get('output'))}"
    if kind == "reasoning":
        summary = "\n".join(s.get("text", "") for s in item.get("summary", ()))
        return f"[assistant reasoning]\n{summary}" if summary else ""
    if kind == "mcp_call":  # a hosted tool's receipt: the call and its result in one
        call = f"[tool call {item.get('server_label')}.{item.get('name')}]({item.get('arguments', '')})"
        error = item.get("error")
        if error is not None:
            message = error.get("message", "") if isinstance(error, dict) else error
            return f"{call}\n[tool error]\n{message}"
        return f"{call}\n[tool result]\n{item.get('output') or ''}"
    if kind == "mcp_approval_request":
        tool = f"{item.get('server_label')}.{item.get('name')}"
        return f"[tool call awaiting approval] {tool}({item.get('arguments', '')})"
    if kind == "mcp_approval_response":
        return "[tool call approved]" if item.get("approve") else "[tool call denied]"
    return ""


def transcript(items: list[Item], max_chars: int) -> str:
    """The items rendered oldest first, at most ``max_chars`` long: the newest entries win, except
    that earlier summaries (first in ``items``) are kept whenever they fit."""
    pairs = [(e, i) for e, i in ((render(i), i) for i in items) if e]
    if not pairs:
        return ""
    entries = [e for e, _ in pairs]
    budget = max_chars - len(TRANSCRIPT_HEADER) - len(OMITTED) - 2
    head: list[str] = []
    for entry, item in pairs:
        if not is_summary(item) or len(entry) + 2 > budget:
            break
        head.append(entry)
        budget -= len(entry) + 2
    tail: list[str] = []
    for entry in reversed(entries[len(head) :]):
        if len(entry) + 2 > budget:
            if not tail and budget > 0:
                tail.append(entry[: budget - 1] + "…")  # one huge newest entry: keep its start
            break
        tail.append(entry)
        budget -= len(entry) + 2
    tail.reverse()
    omitted = len(head) + len(tail) < len(entries)
    body = head + ([OMITTED] if omitted else []) + tail
    return TRANSCRIPT_HEADER + "\n\n".join(body)
