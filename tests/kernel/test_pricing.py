"""Prices (gateway/kernel/pricing.py, ``models.<name>.price``): integer micro-units, never a float;
a turn's cost rounded down, a reservation's worst case rounded up; the config's refusals."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.kernel import pricing
from gateway.kernel.pricing import ModelPrice
from gateway.kernel.settings import Price, Settings


def usage(inp: int, out: int, cached: int = 0, reasoning: int = 0) -> dict[str, Any]:
    return {
        "input_tokens": inp,
        "output_tokens": out,
        "input_tokens_details": {"cached_tokens": cached},
        "output_tokens_details": {"reasoning_tokens": reasoning},
    }


def test_prices_become_micro_units_per_million_with_their_defaults() -> None:
    p = ModelPrice.of(Price(input="2.50", output=10))
    assert p == ModelPrice(
        input=2_500_000,
        cached_input=2_500_000,
        cache_write=2_500_000,
        output=10_000_000,
        reasoning=10_000_000,
    )
    q = ModelPrice.of(Price(input="3", cached_input="0.30", cache_write="3.75", output="15", reasoning="20"))
    assert (q.cached_input, q.cache_write, q.reasoning) == (300_000, 3_750_000, 20_000_000)
    # a YAML float is read through its shortest repr: 0.15 is 0.15, not 0.1499999...
    assert ModelPrice.of(Price(input=0.15, output=0.6)).input == 150_000


def test_a_turns_cost_is_exact_then_rounded_down() -> None:
    p = ModelPrice.of(Price(input="3", cached_input="0.30", cache_write="3.75", output="15", reasoning="20"))
    # 1000 in of which 400 cached and 100 written, 500 out of which 200 reasoning:
    # 500*3 + 400*0.3 + 100*3.75 + 300*15 + 200*20 = 10495 per million = 0.010495
    assert pricing.cost(p, usage(1000, 500, 400, 200), cache_write=100) == 10_495
    one = ModelPrice.of(Price(input="0.333333", output="0"))
    assert pricing.cost(one, usage(1, 0)) == 0  # 0.333333 micro-units: rounded down
    assert pricing.cost(one, usage(3, 0)) == 0  # 0.999999
    assert pricing.cost(one, usage(4, 0)) == 1  # 1.333332
    assert pricing.cost(p, None) == 0 and pricing.cost(p, {}) == 0
    # parts never exceed their whole, nor do junk values count
    assert pricing.cost(p, usage(10, 0, cached=50)) == pricing.cost(p, usage(10, 0, cached=10))
    assert pricing.cost(p, {"input_tokens": True, "output_tokens": "9"}) == 0


def test_the_worst_case_rounds_up_at_the_dearest_prices() -> None:
    p = ModelPrice.of(Price(input="3", cached_input="0.30", cache_write="3.75", output="15", reasoning="20"))
    assert pricing.worst_case(p, 1000, 500) == 1000 * 3_750_000 // 10**6 + 500 * 20
    one = ModelPrice.of(Price(input="0.000001", output="0"))
    assert pricing.worst_case(one, 1, 0) == 1  # 0.000001 micro-units: rounded up
    assert pricing.worst_case(one, 1, 0) >= pricing.cost(one, usage(1, 0))


def test_amounts_as_text() -> None:
    assert [pricing.text(m) for m in (0, 1, 1_234_567, 500_000_000, -5)] == [
        "0.000000",
        "0.000001",
        "1.234567",
        "500.000000",
        "-0.000005",
    ]


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("1.0000001", "at most 6 decimals"),
        (-1, "must not be negative"),
        (True, "not a boolean"),
        ("nan", "finite"),
        ("1e13", "less than"),
    ],
)
def test_a_bad_price_is_refused(value: Any, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        Settings(models={"m": {"provider": "mock", "price": {"input": value, "output": "1"}}})


@pytest.mark.parametrize(
    ("budget", "problem"),
    [
        ({"period": "day"}, "give 'tokens', 'amount' or both"),
        ({"amount": "0"}, "more than 0"),
        ({"amount": "1", "period": {"seconds": 3600, "start": "2026-01-01T00:00:00Z"}}, "give 'seconds', or"),
        ({"amount": "1", "period": {"start": "2026-01-01T00:00:00Z"}}, "both 'start' and 'end'"),
        (
            {"amount": "1", "period": {"start": "2026-01-02T00:00:00Z", "end": "2026-01-01T00:00:00Z"}},
            "after",
        ),
        (
            {"amount": "1", "period": {"start": "2026-01-01T00:00:00", "end": "2026-01-02T00:00:00"}},
            "time zone",
        ),
        ({"amount": "1", "period": "week"}, "period"),
    ],
)
def test_a_bad_budget_is_refused(budget: dict[str, Any], problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        Settings(tenants={"t": {"budget": budget}})


def test_key_budgets_take_the_same_form() -> None:
    s = Settings(
        auth={"api_keys": [{"key": "sk-x", "tenant": "t", "budget": {"amount": "5.00", "period": "month"}}]}
    )
    budget = (s.auth.api_keys or [])[0].budget
    assert budget is not None and str(budget.amount) == "5.00" and budget.tokens is None
