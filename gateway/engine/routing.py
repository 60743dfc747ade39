"""Model name → route: its deployments (each an adapter and an upstream model name, with the
provider's retry policy), the balancer that chooses among them, the context window, and the
fallback routes already resolved, so a turn needs nothing but its route."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from adapters.base import Adapter
from adapters.registry import create_adapter
from gateway.engine.balance import Balancer
from gateway.kernel.errors import GatewayError, ModelNotFound
from gateway.kernel.settings import ModelRoute, ProviderSettings, RetrySettings, RoutingSettings, Settings

DEFAULT_CONTEXT_WINDOW = 128_000
_NO_RETRY = RetrySettings(attempts=0)
_ONE = RoutingSettings()


@dataclass(slots=True, frozen=True)
class Deployment:
    """One replica a route may send a try to. ``name``: its label in logs and metrics (never a URL)."""

    name: str
    provider: str
    adapter: Adapter
    upstream_model: str
    retry: RetrySettings = field(default_factory=lambda: _NO_RETRY)
    total_seconds: float = 600.0


@dataclass(slots=True, frozen=True)
class Route:
    """A resolved model. ``provider``, ``adapter``, ``upstream_model``, ``retry`` and
    ``total_seconds`` describe its first deployment; a route made without ``deployments`` is that
    one deployment (named after its provider), with a balancer of its own."""

    model: str  # the name the client used
    provider: str
    adapter: Adapter
    upstream_model: str
    context_window: int = DEFAULT_CONTEXT_WINDOW
    retry: RetrySettings = field(default_factory=lambda: _NO_RETRY)
    total_seconds: float = (
        600.0  # bounds a whole turn's opening: the longest timeouts.total of its deployments
    )
    fallbacks: tuple[Route, ...] = field(default=())  # tried in order when this one is exhausted
    deployments: tuple[Deployment, ...] = field(default=())
    balancer: Balancer | None = None  # None: a balancer of its own, made by __post_init__

    def __post_init__(self) -> None:
        if not self.deployments:
            one = Deployment(
                self.provider,
                self.provider,
                self.adapter,
                self.upstream_model,
                self.retry,
                self.total_seconds,
            )
            object.__setattr__(self, "deployments", (one,))
        if self.balancer is None:
            pairs = [(d.name, 1.0) for d in self.deployments]
            object.__setattr__(self, "balancer", Balancer(self.model, pairs, _ONE))

    @property
    def deployment_balancer(self) -> Balancer:
        """The balancer over ``deployments``: ``balancer``, or the one ``__post_init__`` made."""
        assert self.balancer is not None  # __post_init__
        return self.balancer

    @property
    def tries(self) -> int:
        """Tries a turn's opening makes on this route before its fallbacks: each deployment once,
        or the first deployment's retry policy (1 + attempts), whichever is more."""
        return max(len(self.deployments), self.retry.attempts + 1)


class Router:
    def __init__(self, settings: Settings) -> None:
        self.providers: dict[str, ProviderSettings] = dict(settings.provider_table())
        self.adapters: dict[str, Adapter] = {name: create_adapter(p) for name, p in self.providers.items()}
        self.routes: dict[str, ModelRoute] = dict(settings.models)
        if "mock" not in self.routes and settings.serves_mock_model(self.providers):
            self.routes["mock"] = ModelRoute(provider="mock", upstream_model="mock")
        # One route (and balancer: the deployments' figures) per configured model, made on first use;
        # pass-through names share their provider's balancer, so clients cannot mint state.
        self._built: dict[str, tuple[ModelRoute, Route]] = {}
        self._passthrough: dict[str, Balancer] = {}

    def route(self, model: str, allowed: list[str] | None = None) -> Route:
        """The route for ``model`` (``allowed``: the caller's model allow-list), its fallbacks
        resolved one level deep; a fallback that does not resolve, or that the allow-list does
        not name, is left out."""
        if allowed is not None and model not in allowed:
            raise ModelNotFound(model)
        route = self._without_fallbacks(model)
        cfg = self.routes.get(model)
        if cfg is None or not cfg.fallbacks:
            return route
        fallbacks = []
        for name in cfg.fallbacks:
            if allowed is not None and name not in allowed:
                continue
            try:
                fallbacks.append(self._without_fallbacks(name))
            except GatewayError:
                continue
        return dataclasses.replace(route, fallbacks=tuple(fallbacks))

    def _without_fallbacks(self, model: str) -> Route:
        cfg = self.routes.get(model)
        if cfg is not None:
            built = self._built.get(model)
            if built is None or built[0] is not cfg:
                built = self._built[model] = (cfg, self._configured(model, cfg))
            return built[1]
        provider, sep, upstream = model.partition("/")
        p = self.providers.get(provider)
        if sep and upstream and p is not None and p.pass_through and p.kind != "mock":
            balancer = self._passthrough.get(provider)
            if balancer is None:
                balancer = self._passthrough[provider] = Balancer(provider, [(provider, 1.0)], _ONE)
            return Route(
                model=model,
                provider=provider,
                adapter=self.adapters[provider],
                upstream_model=upstream,
                retry=p.retry,
                total_seconds=p.timeouts.total,
                balancer=balancer,
            )
        raise ModelNotFound(model)

    def _configured(self, model: str, cfg: ModelRoute) -> Route:
        targets = cfg.targets()
        deployments = tuple(
            Deployment(
                name=t.name or t.provider,
                provider=t.provider,
                adapter=self.adapters[t.provider],
                upstream_model=t.upstream_model or model,
                retry=self.providers[t.provider].retry,
                total_seconds=self.providers[t.provider].timeouts.total,
            )
            for t in targets
        )
        first = deployments[0]
        return Route(
            model=model,
            provider=first.provider,
            adapter=first.adapter,
            upstream_model=first.upstream_model,
            context_window=cfg.context_window,
            retry=first.retry,
            total_seconds=max(d.total_seconds for d in deployments),
            deployments=deployments,
            balancer=Balancer(
                model, [(d.name, t.weight) for d, t in zip(deployments, targets, strict=True)], cfg.routing
            ),
        )

    def balancers(self) -> dict[str, Balancer]:
        """The balancer of every configured model used so far, by model name (for metrics)."""
        return {name: route.deployment_balancer for name, (_, route) in self._built.items()}

    def model_names(self, allowed: list[str] | None = None) -> list[str]:
        names = sorted(self.routes)
        return [n for n in names if allowed is None or n in allowed]

    async def aclose(self) -> None:
        for adapter in self.adapters.values():
            await adapter.aclose()
