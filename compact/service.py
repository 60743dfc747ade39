"""``POST /v1/responses/compact`` behind the transport: assemble the conversation, keep what the
strategy keeps (``strategy.compact_plan``: from the newest user message on, within the route's token
budget, ``CompactionSettings.recent_budget``, and half the input), summarize the rest through the
same turn path as any response, seal the summary.

Metering: the summarizing turn is prepared unmetered, and the compaction is metered here once, as
one request with the ``usage`` it returns (zeros when nothing needed summarizing; an error, without
tokens, when it fails after its route and context were resolved)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import structlog

from compact import strategy
from compact.opener import SUMMARY_MESSAGE_HEADER, Opener
from compact.seal import Sealer
from gateway.engine.auth import Principal
from gateway.engine.orchestrator import Gateway
from gateway.engine.routing import Route
from gateway.kernel.errors import ErrorCode, GatewayError, ServerError, UpstreamError
from gateway.kernel.estimate import estimate, estimate_text
from gateway.kernel.ids import new_id, response_id
from gateway.kernel.spec.request import CompactRequestBody, CreateResponseBody

log = structlog.get_logger("compact.service")

Item = dict[str, Any]
PAYLOAD_VERSION = 1
_HEADROOM_TOKENS = 64  # the summarization request's own framing


def zero_usage() -> dict[str, Any]:
    return {
        "input_tokens": 0,
        "output_tokens": 0,
        "total_tokens": 0,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens_details": {"reasoning_tokens": 0},
    }


def _output_part(part: dict[str, Any]) -> dict[str, Any]:
    kind = part.get("type")
    if kind == "output_text":
        return {"type": "output_text", "text": part.get("text", ""), "annotations": []}
    if kind == "input_image":
        return {**part, "image_url": part.get("image_url"), "detail": part.get("detail") or "auto"}
    return dict(part)


def as_output(item: Item) -> Item:
    """A normalized item in ``ItemField`` (output) shape: ids and statuses, full content parts."""
    kind = item.get("type")
    if kind == "message":
        out: Item = {
            "type": "message",
            "id": item.get("id") or new_id("msg"),
            "status": "completed",
            "role": item.get("role", "user"),
            "content": [_output_part(p) for p in item.get("content", ())],
        }
        if "phase" in item:
            out["phase"] = item["phase"]
        return out
    if kind in ("function_call", "function_call_output"):
        return {**item, "status": "completed"}
    return dict(item)


def _output_text(resource: dict[str, Any]) -> str:
    return "".join(
        part.get("text", "")
        for item in resource.get("output", ())
        if item.get("type") == "message"
        for part in item.get("content", ())
        if part.get("type") == "output_text"
    )


@dataclass(slots=True)
class Sealed:
    """A compaction: its sealed ``compaction`` item, the summary in it, and what it cost."""

    item: Item
    summary: str
    usage: dict[str, Any]
    created_at: int


class Compactor:
    """Compacts with the gateway's routes and store, sealing with the opener's key ring. One code
    path for ``/v1/responses/compact`` (``compact``: ``strategy.compact_plan`` then ``seal``) and
    inline compaction (compact/inline.py: ``plan`` then ``seal``)."""

    def __init__(self, gateway: Gateway) -> None:
        opener = gateway.open_compaction
        if not isinstance(opener, Opener):
            raise ServerError("Compaction is not configured on this gateway.")
        self.gateway = gateway
        self.sealer: Sealer = opener.sealer
        self.settings = gateway.settings.compaction

    def plan(self, items: list[Item], route: Route, budget: int | None = None) -> strategy.Plan:
        """Inline compaction's split: the newest items within ``budget`` tokens (the route's
        ``recent_budget`` when None)."""
        if budget is None:
            budget = self.settings.recent_budget(route.context_window)
        return strategy.plan(items, budget, self.settings.keep_recent_items)

    async def seal(
        self,
        plan: strategy.Plan,
        *,
        route: Route,
        principal: Principal,
        model: str,
        instructions: str | None,
        prompt_cache_key: str | None,
        request_id: str | None = None,
        window: bool = False,
    ) -> Sealed:
        """Summarize ``plan.older`` through the route (metered here, as one request) and seal the
        summary; ``window``: the kept items are sealed in too (an inline compaction's item)."""
        gw = self.gateway
        try:
            summary, usage = await self._summarize(
                plan.older, model, instructions, prompt_cache_key, principal, route, request_id
            )
        except GatewayError:
            await gw.meter.record(principal, route.model, None, failed=True)
            raise
        await gw.meter.record(principal, route.model, usage, failed=False)
        now = int(time.time())
        cid = new_id("cmp")
        payload: dict[str, Any] = {
            "v": PAYLOAD_VERSION,
            "id": cid,
            "summary": summary,
            "created_at": now,
            "model": route.model,
            "summarized_items": len(plan.older),
        }
        if window:
            payload["window"] = {"pinned": plan.pinned, "recent": plan.recent}
        compaction: Item = {
            "type": "compaction",
            "id": cid,
            "encrypted_content": self.sealer.seal(payload, principal.tenant),
        }
        if plan.older:
            compaction["created_by"] = route.model
        log.info(
            "compacted",
            model=route.model,
            inline=window,
            summarized=len(plan.older),
            kept=len(plan.pinned) + len(plan.recent),
            kept_tokens=estimate(plan.pinned) + estimate(plan.recent),
            summary_chars=len(summary),
            key_id=self.sealer.current_key_id,
            request_id=request_id,
        )
        return Sealed(item=compaction, summary=summary, usage=usage, created_at=now)

    async def compact(
        self, body: CompactRequestBody, principal: Principal, *, request_id: str | None = None
    ) -> dict[str, Any]:
        gw = self.gateway
        route = gw.route(body.model, principal)
        ctx = await gw.context(body.input, body.previous_response_id, principal)
        budget = self.settings.recent_budget(route.context_window)
        plan = strategy.compact_plan(ctx.transcript, budget, self.settings.keep_recent_items)
        sealed = await self.seal(
            plan,
            route=route,
            principal=principal,
            model=body.model,
            instructions=body.instructions,
            prompt_cache_key=body.prompt_cache_key,
            request_id=request_id,
        )
        return {
            "id": response_id(),
            "object": "response.compaction",
            "output": [as_output(i) for i in plan.pinned]
            + [sealed.item]
            + [as_output(i) for i in plan.recent],
            "created_at": sealed.created_at,
            "usage": sealed.usage,
        }

    async def _summarize(
        self,
        older: list[Item],
        model: str,
        client_instructions: str | None,
        prompt_cache_key: str | None,
        principal: Principal,
        route: Route,
        request_id: str | None = None,
    ) -> tuple[str, dict[str, Any]]:
        """The summary text and the tokens it cost (zeros when no model call was needed)."""
        if not older:
            return "", zero_usage()
        if len(older) == 1 and strategy.is_summary(older[0]):
            # Only an earlier summary falls out of the window: reseal it rather than paraphrase it.
            text = strategy.text_of(older[0].get("content"))
            return text.removeprefix(SUMMARY_MESSAGE_HEADER), zero_usage()
        instructions = strategy.instructions(client_instructions)
        budget = (
            route.context_window
            - self.settings.summary_max_tokens
            - estimate_text(instructions)
            - _HEADROOM_TOKENS
        )
        text = self._fitted_transcript(older, budget)
        if not text:  # nothing readable (reasoning without a summary): nothing to ask a model about
            return "", zero_usage()
        request = CreateResponseBody.model_validate(
            {
                "model": model,
                "instructions": instructions,
                "input": [{"type": "message", "role": "user", "content": text}],
                "store": False,
                "truncation": "disabled",
                "max_output_tokens": self.settings.summary_max_tokens,
                "prompt_cache_key": prompt_cache_key,
            }
        )
        # within the request being compacted, which was admitted: only the tokens are charged here
        turn = await self.gateway.prepare(
            request, principal, streaming=False, request_id=request_id, metered=False, admitted=True
        )
        result = await turn.run()
        if result.error is not None:
            raise result.error
        resource = result.resource
        summary = _output_text(resource).strip()
        if not summary:
            raise UpstreamError("The model returned an empty summary.", code=ErrorCode.EMPTY_SUMMARY)
        if resource["status"] == "incomplete":
            log.warning("summary_truncated", model=route.model, max_tokens=self.settings.summary_max_tokens)
        usage = resource.get("usage")
        if usage is None:  # the upstream reported none: an estimate is truer than zeros
            sent, got = estimate_text(instructions) + estimate_text(text), estimate_text(summary)
            usage = {**zero_usage(), "input_tokens": sent, "output_tokens": got, "total_tokens": sent + got}
        return summary, usage

    @staticmethod
    def _fitted_transcript(older: list[Item], budget_tokens: int) -> str:
        """The transcript, shortened until its estimate fits ``budget_tokens``."""
        max_chars = max(1024, budget_tokens * 4)
        text = strategy.transcript(older, max_chars)
        for _ in range(4):
            tokens = estimate_text(text) + 4
            if tokens <= budget_tokens or max_chars <= 1024:
                break
            max_chars = max(1024, int(max_chars * budget_tokens / tokens * 0.95))
            text = strategy.transcript(older, max_chars)
        return text
