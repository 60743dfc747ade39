"""Fit the assembled context into the model's ``context_window`` (the engine's ``fit_context``
hook): estimate its size, then fail (``truncation: "disabled"``) or drop the
oldest non-system items (``"auto"``), never separating a function call from its outputs.

The estimator and how wrong it can be: ``gateway/kernel/estimate.py``.
"""

from __future__ import annotations

import dataclasses

import structlog

from compact.strategy import is_pinned
from gateway.engine.context import Context
from gateway.engine.routing import Route
from gateway.kernel.errors import ContextLengthExceeded
from gateway.kernel.estimate import estimate, estimate_item
from gateway.kernel.items import call_ids

log = structlog.get_logger("compact.truncation")
__all__ = ["fit_context"]


def fit_context(
    ctx: Context, route: Route, truncation: str, *, reserved: int = 0, window: int | None = None
) -> Context:
    """``ctx`` itself when it fits in ``route.context_window - reserved`` tokens; otherwise a new,
    shorter Context (``"auto"``) or ContextLengthExceeded (``"disabled"``), before any upstream call.
    ``window``: a smaller window than the route's (the re-fit after an upstream's overflow)."""
    limit = (route.context_window if window is None else window) - reserved
    if ctx.history_tokens is not None:  # a cached transcript: only the new items are counted
        total = ctx.history_tokens + estimate(ctx.new_items)
        if total <= limit:
            ctx.tokens = total
            return ctx
    items = ctx.transcript
    sizes = [estimate_item(i) for i in items]
    total = sum(sizes)
    if total <= limit:
        ctx.tokens = total
        return ctx
    if truncation != "auto":
        raise ContextLengthExceeded(
            f"The input is about {total} tokens, more than the {limit}-token context window of model "
            f"'{route.model}'. Shorten it, compact the conversation (POST /v1/responses/compact), "
            "or send truncation: 'auto'.",
            param="input",
        )
    before = total
    last = len(items) - 1
    by_call: dict[str, list[int]] = {}
    for n, item in enumerate(items):
        if item.get("type") in ("function_call", "function_call_output"):
            by_call.setdefault(item["call_id"], []).append(n)
    dropped: set[int] = set()
    for n, item in enumerate(items):
        if total <= limit:
            break
        if n in dropped or n == last or is_pinned(item):
            continue
        group = by_call.get(item["call_id"], [n]) if "call_id" in item else [n]
        if last in group:
            continue  # the newest item answers this call: keep the pair
        for g in group:
            if g not in dropped:
                dropped.add(g)
                total -= sizes[g]
    if total > limit:
        raise ContextLengthExceeded(
            f"The input is about {total} tokens even after dropping older items, more than the "
            f"{limit}-token context window of model '{route.model}'.",
            param="input",
        )
    split = len(ctx.history)
    log.info("context_truncated", model=route.model, dropped=len(dropped), before=before, after=total)
    history = [i for n, i in enumerate(ctx.history) if n not in dropped]
    new_items = [i for n, i in enumerate(ctx.new_items, start=split) if n not in dropped]
    # Only the upstream's view shrinks: what is stored (stored_items) stays what the client sent.
    return dataclasses.replace(
        ctx,
        history=history,
        new_items=new_items,
        tokens=total,
        calls=call_ids([*history, *new_items]),
        history_tokens=None,
        stored_items=ctx.input_items,
    )
