"""deploy/grafana/gateway-dashboard.json is built on metrics that exist: every metric name its
PromQL references is in a real /metrics scrape after traffic, with the labels it groups and
filters by (``gateway_worker_*`` exist in multiprocess mode: test_multiprocess.py checks them)."""

from __future__ import annotations

import re
from collections.abc import Iterator

import httpx
import pytest

from tests.fakes.openai_chat import FakeOpenAIChat, smart_reply
from tests.harness import ServedApp, serve_gateway
from tests.helpers import fake_fixtures
from tests.observability.helpers import dashboard_queries, metric_names
from tests.observability.traffic import ADMIN, drive, scrape, settings_for

fake_server, fake = fake_fixtures(FakeOpenAIChat, responder=smart_reply)
_BY = re.compile(r"\bby\s*\(([^)]*)\)")
_MATCHER = re.compile(r"([a-zA-Z_]\w*)\s*(?:=~|!~|!=|=)\s*\"")
_ALWAYS = {"le", "instance", "job", "pid"}  # the histogram's, Prometheus's, multiprocess mode's


@pytest.fixture(scope="module")
def served(fake_server: FakeOpenAIChat) -> Iterator[ServedApp]:
    with serve_gateway(settings_for(fake_server)) as s:
        yield s


async def test_every_metric_the_dashboard_queries_is_scraped(served: ServedApp, fake: FakeOpenAIChat) -> None:
    await drive(served, fake)
    async with httpx.AsyncClient(timeout=30) as c:
        text = (await c.get(served.base_url + "/metrics", headers=ADMIN)).text
    labels: dict[str, set[str]] = {}
    for family in scrape(text).values():
        for sample in family.samples:
            labels.setdefault(sample.name, set()).update(sample.labels)
    queries = dashboard_queries()
    assert len(queries) > 20
    referenced = set().union(*(metric_names(q) for q in queries))
    assert {"gateway_requests_total", "gateway_time_to_first_token_seconds_bucket"} <= referenced
    for expr in queries:
        names = {n for n in metric_names(expr) if not n.startswith("gateway_worker_")}
        for name in names:
            assert name in labels, f"{name} (in {expr!r}) is not in a scrape"
        known = set().union(*(labels[n] for n in names), _ALWAYS) if names else _ALWAYS
        used = {m for group in _BY.findall(expr) for m in re.split(r"\s*,\s*", group.strip()) if m}
        used |= set(_MATCHER.findall(expr))
        assert used <= known, f"{expr!r} uses labels {used - known} its metrics do not have"
