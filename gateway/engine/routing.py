"""Model name → route: the adapter, the upstream model name, the context window, the retry policy,
and the fallback routes already resolved, so a turn needs nothing but its route."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from adapters.base import Adapter
from adapters.registry import create_adapter
from gateway.kernel.errors import GatewayError, ModelNotFound
from gateway.kernel.settings import ModelRoute, ProviderSettings, RetrySettings, Settings

DEFAULT_CONTEXT_WINDOW = 128_000
_NO_RETRY = RetrySettings(attempts=0)


@dataclass(slots=True, frozen=True)
class Route:
    model: str  # the name the client used
    provider: str
    adapter: Adapter
    upstream_model: str
    context_window: int = DEFAULT_CONTEXT_WINDOW
    retry: RetrySettings = field(default_factory=lambda: _NO_RETRY)
    total_seconds: float = 600.0  # the provider's timeouts.total: it bounds a whole turn's opening
    fallbacks: tuple[Route, ...] = field(default=())  # tried in order when this one is exhausted


class Router:
    def __init__(self, settings: Settings) -> None:
        self.providers: dict[str, ProviderSettings] = dict(settings.provider_table())
        self.adapters: dict[str, Adapter] = {name: create_adapter(p) for name, p in self.providers.items()}
        self.routes: dict[str, ModelRoute] = dict(settings.models)
        if "mock" not in self.routes and settings.serves_mock_model(self.providers):
            self.routes["mock"] = ModelRoute(provider="mock", upstream_model="mock")

    def resolve(self, model: str, allowed: list[str] | None = None) -> Route:
        """The route for ``model`` (``allowed``: the caller's model allow-list), its fallbacks
        resolved one level deep; a fallback that does not resolve, or that the allow-list does
        not name, is left out."""
        if allowed is not None and model not in allowed:
            raise ModelNotFound(model)
        route = self._route(model)
        cfg = self.routes.get(model)
        if cfg is None or not cfg.fallbacks:
            return route
        fallbacks = []
        for name in cfg.fallbacks:
            if allowed is not None and name not in allowed:
                continue
            try:
                fallbacks.append(self._route(name))
            except GatewayError:
                continue
        return dataclasses.replace(route, fallbacks=tuple(fallbacks))

    def _route(self, model: str) -> Route:
        cfg = self.routes.get(model)
        if cfg is not None:
            return Route(
                model=model,
                provider=cfg.provider,
                adapter=self.adapters[cfg.provider],
                upstream_model=cfg.upstream_model or model,
                context_window=cfg.context_window,
                retry=self.providers[cfg.provider].retry,
                total_seconds=self.providers[cfg.provider].timeouts.total,
            )
        provider, sep, upstream = model.partition("/")
        p = self.providers.get(provider)
        if sep and upstream and p is not None and p.pass_through and p.kind != "mock":
            return Route(
                model=model,
                provider=provider,
                adapter=self.adapters[provider],
                upstream_model=upstream,
                retry=p.retry,
                total_seconds=p.timeouts.total,
            )
        raise ModelNotFound(model)

    def model_names(self, allowed: list[str] | None = None) -> list[str]:
        names = sorted(self.routes)
        return [n for n in names if allowed is None or n in allowed]

    async def aclose(self) -> None:
        for adapter in self.adapters.values():
            await adapter.aclose()
