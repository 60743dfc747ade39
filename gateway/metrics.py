"""In-process counters, served as Prometheus text at /metrics (no client library needed)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
MAX_MODEL_LABELS = 1000  # pass-through models are open-ended: beyond this many, "_other"


class Metrics:
    def __init__(self) -> None:
        self.requests: Counter[tuple[str, str, str]] = Counter()  # (transport, model, status)
        self.tokens: Counter[tuple[str, str]] = Counter()  # (model, direction)
        self.latency_buckets: Counter[float] = Counter()
        self.latency_sum = 0.0
        self.latency_count = 0
        self.ws_connections = 0
        self._models: set[str] = set()
        # how many calls to the tenancy limits' limiter failed (set by the app: the engine counts)
        self.limiter_errors: Callable[[], int] = lambda: 0

    def _label(self, model: str) -> str:
        if model in self._models:
            return model
        if len(self._models) >= MAX_MODEL_LABELS or len(model) > 200:
            return "_other"
        self._models.add(model)
        return model

    def observe(
        self, transport: str, model: str, status: str, seconds: float, usage: Mapping[str, Any] | None
    ) -> None:
        model = self._label(model)
        self.requests[(transport, model, status)] += 1
        if usage:
            self.tokens[(model, "input")] += usage.get("input_tokens", 0)
            self.tokens[(model, "output")] += usage.get("output_tokens", 0)
        self.latency_sum += seconds
        self.latency_count += 1
        for b in _BUCKETS:
            if seconds <= b:
                self.latency_buckets[b] += 1
                break

    def render(self) -> str:
        lines = ["# TYPE gateway_requests_total counter"]
        for (transport, model, status), n in sorted(self.requests.items()):
            lines.append(
                f'gateway_requests_total{{transport="{transport}",model="{_q(model)}",status="{status}"}} {n}'
            )
        lines.append("# TYPE gateway_tokens_total counter")
        for (model, direction), n in sorted(self.tokens.items()):
            lines.append(f'gateway_tokens_total{{model="{_q(model)}",direction="{direction}"}} {n}')
        lines.append("# TYPE gateway_request_seconds histogram")
        cumulative = 0
        for b in _BUCKETS:
            cumulative += self.latency_buckets[b]
            lines.append(f'gateway_request_seconds_bucket{{le="{b}"}} {cumulative}')
        lines.append(f'gateway_request_seconds_bucket{{le="+Inf"}} {self.latency_count}')
        lines.append(f"gateway_request_seconds_sum {self.latency_sum}")
        lines.append(f"gateway_request_seconds_count {self.latency_count}")
        lines.append("# TYPE gateway_websocket_connections gauge")
        lines.append(f"gateway_websocket_connections {self.ws_connections}")
        lines.append("# TYPE gateway_limiter_errors_total counter")
        lines.append(f"gateway_limiter_errors_total {self.limiter_errors()}")
        return "\n".join(lines) + "\n"


def _q(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ")
