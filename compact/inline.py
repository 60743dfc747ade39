"""Inline compaction (``context_management: [{"type": "compaction", "compact_threshold": N}]``):
the engine's ``compact_context`` hook. When a create's assembled context (items, instructions and
tool schemas, estimated by ``gateway/kernel/estimate.py``) exceeds N tokens, it is compacted before
the upstream call, by the same summarizing turn and sealing as ``/v1/responses/compact``
(compact/service.py), with the budget plan (``strategy.plan``, not an explicit compaction's
newest-user-message rule).

The verbatim tail is kept within ``min(recent_budget, N // 2)`` tokens, so a compacted context is
well under the threshold again (the summary itself is bounded by ``summary_max_tokens``). Its
sealed item carries that tail too (a *window* item): opened, it is the whole compacted context and
supersedes everything before it (gateway/engine/context.py), so a later turn continues from it
however it gets there: the connection cache, the store, or the client sending the output back.
"""

from __future__ import annotations

from typing import Any

import structlog

from compact.opener import summary_message
from compact.service import Compactor
from gateway.engine.auth import Principal
from gateway.engine.context import Context
from gateway.engine.orchestrator import Admit, Gateway
from gateway.engine.routing import Route
from gateway.kernel.estimate import estimate
from gateway.kernel.items import call_ids
from gateway.kernel.spec.request import CreateResponseBody

log = structlog.get_logger("compact.inline")

Item = dict[str, Any]
DEFAULT_THRESHOLD_FRACTION = 0.8  # of the route's context window, when compact_threshold is omitted


def threshold_of(body: CreateResponseBody, route: Route) -> int | None:
    """The request's compaction threshold in tokens (None: it asked for no compaction)."""
    for entry in body.context_management or ():
        if entry.type == "compaction":
            if entry.compact_threshold is not None:
                return entry.compact_threshold
            return int(route.context_window * DEFAULT_THRESHOLD_FRACTION)
    return None


async def compact_inline(
    gw: Gateway,
    ctx: Context,
    body: CreateResponseBody,
    principal: Principal,
    route: Route,
    *,
    reserved: int = 0,
    request_id: str | None = None,
    admit: Admit,
) -> tuple[Context, Item] | None:
    """The compacted context and its sealed item, or None when nothing needs compacting (under
    the threshold, or nothing older than the kept tail). The request is admitted (``admit``, the
    tenancy limits) before the summarizing call, with the most the compacted context can take: a
    refused request spends no summary."""
    threshold = threshold_of(body, route)
    if threshold is None:
        return None
    tokens = ctx.estimated_tokens() + reserved
    if tokens <= threshold:
        return None
    compactor = Compactor(gw)
    budget = min(compactor.settings.recent_budget(route.context_window), threshold // 2)
    plan = compactor.plan(ctx.transcript, route, budget)
    if not plan.older:
        log.info("compaction_skipped", model=route.model, tokens=tokens, threshold=threshold)
        return None
    assert body.model is not None  # validated
    summary_tokens = compactor.settings.summary_max_tokens
    await admit(estimate(plan.pinned) + estimate(plan.recent) + summary_tokens + reserved)
    sealed = await compactor.seal(
        plan,
        route=route,
        principal=principal,
        model=body.model,
        instructions=body.instructions,
        prompt_cache_key=body.prompt_cache_key,
        request_id=request_id,
        window=True,
    )
    opened = [summary_message(sealed.summary, sealed.item["id"])] if sealed.summary.strip() else []
    window = [*plan.pinned, *opened, *plan.recent]
    log.info(
        "context_compacted",
        model=route.model,
        tokens=tokens,
        threshold=threshold,
        after=estimate(window) + reserved,
        request_id=request_id,
    )
    # The window starts a new chain; what is stored for the turn stays what the client sent.
    compacted = Context(
        history=window,
        new_items=[],
        stored_items=ctx.input_items,
        calls=call_ids(window),
        depth=0,
        compacted=True,
    )
    return compacted, sealed.item
