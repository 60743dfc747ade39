"""The transport-independent front of a turn: route, assemble context, build the upstream request,
make the Turn. HTTP and WebSocket both come through ``Gateway.prepare``."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from adapters.base import UpstreamRequest
from gateway.engine.auth import Authenticator, Principal
from gateway.engine.context import CompactionOpener, ConnectionCache, Context, build_context
from gateway.engine.resource import new_resource, text_echo, tool_choice_echo, tools_echo
from gateway.engine.routing import Route, Router
from gateway.engine.turn import Turn, TurnResult
from gateway.kernel.errors import InvalidRequest
from gateway.kernel.ids import response_id
from gateway.kernel.settings import Settings
from gateway.kernel.spec.request import CreateResponseBody
from state.base import ResponseStore, StoredResponse


class ContextFitter(Protocol):
    def __call__(self, ctx: Context, route: Route, truncation: str, *, reserved: int = 0) -> Context: ...


@dataclass(slots=True)
class Prepared:
    turn: Turn
    context: Context
    route: Route
    body: CreateResponseBody
    store: bool


class Gateway:
    def __init__(
        self,
        settings: Settings,
        *,
        router: Router,
        store: ResponseStore,
        open_compaction: CompactionOpener | None = None,
        fit_context: ContextFitter | None = None,
    ) -> None:
        self.settings = settings
        self.router = router
        self.store = store
        self.auth = Authenticator(settings.auth)
        self.open_compaction = open_compaction
        self.fit_context = fit_context

    def route(self, model: str | None, principal: Principal) -> Route:
        if not model:
            raise InvalidRequest(
                "Missing required parameter: 'model'.", param="model", code="missing_required_parameter"
            )
        return self.router.resolve(model, principal.models)

    async def prepare(
        self,
        body: CreateResponseBody,
        principal: Principal,
        *,
        cache: ConnectionCache | None = None,
        on_done: Callable[[TurnResult], None] | None = None,
        streaming: bool = True,
    ) -> Prepared:
        """Resolve the route and context of one turn. ``streaming``: the caller relays deltas as
        they come (SSE, WebSocket); False lets the adapter ask for an unstreamed reply."""
        route = self.route(body.model, principal)
        store = True if body.store is None else body.store
        ctx = await build_context(
            input_=body.input,
            previous_response_id=body.previous_response_id,
            tenant=principal.tenant,
            store=self.store,
            cache=cache,
            open_compaction=self.open_compaction,
            max_depth=self.settings.state.max_chain_depth,
        )
        if self.fit_context is not None:
            # instructions and tool schemas take room in the window too
            reserved = (len(body.instructions or "") + len(orjson.dumps(tools_echo(body)))) // 4
            ctx = self.fit_context(ctx, route, body.truncation or "disabled", reserved=reserved)
        rid = response_id()
        resource = new_resource(body, response_id=rid, model=route.model, store=store)
        stored = None
        if store:
            stored = StoredResponse(
                id=rid,
                tenant=principal.tenant,
                model=route.model,
                previous_response_id=body.previous_response_id,
                input_items=ctx.new_items if ctx.stored_items is None else ctx.stored_items,
                resource=resource,
                created_at=resource["created_at"],
                stored_at=time.time(),
            )
        turn = Turn(
            request=upstream_request(body, route, ctx, stream=streaming),
            route=route,
            router=self.router,
            resource=resource,
            store=self.store,
            stored=stored,
            max_events=self.settings.limits.max_events_per_stream,
            on_done=on_done,
        )
        return Prepared(turn=turn, context=ctx, route=route, body=body, store=store)

    async def aclose(self) -> None:
        await self.router.aclose()
        await self.store.aclose()


def upstream_request(
    body: CreateResponseBody, route: Route, ctx: Context, *, stream: bool = True
) -> UpstreamRequest:
    fmt: dict[str, Any] | None = text_echo(body)["format"]
    if fmt is not None and fmt.get("type") == "text":
        fmt = None
    return UpstreamRequest(
        model=route.upstream_model,
        items=ctx.transcript,
        instructions=body.instructions,
        tools=tools_echo(body),
        tool_choice=tool_choice_echo(body),
        max_output_tokens=body.max_output_tokens,
        temperature=body.temperature,
        top_p=body.top_p,
        presence_penalty=body.presence_penalty,
        frequency_penalty=body.frequency_penalty,
        parallel_tool_calls=body.parallel_tool_calls,
        text_format=fmt,
        verbosity=body.text.verbosity if body.text is not None else None,
        reasoning=body.reasoning.model_dump(exclude_none=True) if body.reasoning else None,
        max_tool_calls=body.max_tool_calls,
        top_logprobs=body.top_logprobs,
        service_tier=body.service_tier,
        safety_identifier=body.safety_identifier,
        prompt_cache_key=body.prompt_cache_key,
        metadata=body.metadata,
        include=list(body.include or ()),
        stream=stream,
    )
