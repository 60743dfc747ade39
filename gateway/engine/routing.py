"""Model name → route (adapter, upstream model name, context window, fallbacks)."""

from __future__ import annotations

from dataclasses import dataclass, field

from adapters.base import Adapter
from adapters.registry import create_adapter
from gateway.kernel.errors import ModelNotFound
from gateway.kernel.settings import ModelRoute, ProviderSettings, Settings

DEFAULT_CONTEXT_WINDOW = 128_000


@dataclass(slots=True, frozen=True)
class Route:
    model: str  # the name the client used
    provider: str
    adapter: Adapter
    upstream_model: str
    context_window: int = DEFAULT_CONTEXT_WINDOW
    fallbacks: tuple[str, ...] = field(default=())


class Router:
    def __init__(self, settings: Settings) -> None:
        self.providers: dict[str, ProviderSettings] = dict(settings.provider_table())
        self.adapters: dict[str, Adapter] = {name: create_adapter(p) for name, p in self.providers.items()}
        self.routes: dict[str, ModelRoute] = dict(settings.models)
        if "mock" not in self.routes and "mock" in self.providers:
            self.routes["mock"] = ModelRoute(provider="mock", upstream_model="mock")

    def resolve(self, model: str, allowed: list[str] | None = None) -> Route:
        if allowed is not None and model not in allowed:
            raise ModelNotFound(model)
        cfg = self.routes.get(model)
        if cfg is not None:
            return Route(
                model=model,
                provider=cfg.provider,
                adapter=self.adapters[cfg.provider],
                upstream_model=cfg.upstream_model or model,
                context_window=cfg.context_window,
                fallbacks=tuple(cfg.fallbacks),
            )
        provider, sep, upstream = model.partition("/")
        p = self.providers.get(provider)
        if sep and upstream and p is not None and p.pass_through and p.kind != "mock":
            return Route(
                model=model, provider=provider, adapter=self.adapters[provider], upstream_model=upstream
            )
        raise ModelNotFound(model)

    def model_names(self, allowed: list[str] | None = None) -> list[str]:
        names = sorted(self.routes)
        return [n for n in names if allowed is None or n in allowed]

    async def aclose(self) -> None:
        for adapter in self.adapters.values():
            await adapter.aclose()
