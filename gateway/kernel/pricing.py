"""What tokens cost, in integer micro-units of the configured currency; never a float.

A model's ``price`` (``models.<name>.price``, per million tokens, parsed as ``Decimal``) is turned
once into integer micro-units per million tokens (``ModelPrice``). A turn's cost is then

    (uncached input × input + cached × cached_input + cache writes × cache_write
     + (output − reasoning) × output + reasoning × reasoning) // 1_000_000

micro-units: the exact figure rounded down to the micro-unit, per turn (at most one micro-unit below
it). The ledger and the money budgets add these integers, so a ledger's cost is exactly the sum of
its turns' costs. A reservation (``worst_case``) rounds up instead, so it is never below what it
reserves for.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gateway.kernel.settings import Price, Settings, micros

MICRO = 1_000_000  # micro-units per currency unit
PER = 1_000_000  # tokens a price is given for


@dataclass(slots=True, frozen=True)
class ModelPrice:
    """Micro-units of the currency per million tokens."""

    input: int
    cached_input: int
    cache_write: int
    output: int
    reasoning: int

    @classmethod
    def of(cls, price: Price) -> ModelPrice:
        def m(value: Any, default: int) -> int:
            return default if value is None else micros(value)

        inp, out = micros(price.input), micros(price.output)
        return cls(
            input=inp,
            cached_input=m(price.cached_input, inp),
            cache_write=m(price.cache_write, inp),
            output=out,
            reasoning=m(price.reasoning, out),
        )


FREE = ModelPrice(0, 0, 0, 0, 0)


def price_table(settings: Settings) -> dict[str, ModelPrice]:
    """Every priced model's prices, by its name in ``models:`` (the name a client asks for)."""
    return {name: ModelPrice.of(r.price) for name, r in settings.models.items() if r.price is not None}


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def cost(price: ModelPrice, usage: Mapping[str, Any] | None, cache_write: int = 0) -> int:
    """The cost of one turn's ``usage`` (the Responses API's, as the client received it) in
    micro-units, rounded down; ``cache_write``: the input tokens that wrote a prompt cache (a
    part of ``input_tokens`` the usage does not name)."""
    if not usage:
        return 0
    inp = _count(usage.get("input_tokens"))
    out = _count(usage.get("output_tokens"))
    cached = min(inp, _count((usage.get("input_tokens_details") or {}).get("cached_tokens")))
    written = min(inp - cached, _count(cache_write))
    reasoning = min(out, _count((usage.get("output_tokens_details") or {}).get("reasoning_tokens")))
    exact = (
        (inp - cached - written) * price.input
        + cached * price.cached_input
        + written * price.cache_write
        + (out - reasoning) * price.output
        + reasoning * price.reasoning
    )
    return exact // PER


def worst_case(price: ModelPrice, input_tokens: int, output_tokens: int) -> int:
    """The most ``input_tokens`` in and ``output_tokens`` out can cost, in micro-units rounded up:
    every input token at the dearest input price, every output token at the dearer output one."""
    exact = input_tokens * max(price.input, price.cached_input, price.cache_write) + output_tokens * max(
        price.output, price.reasoning
    )
    return -(-exact // PER)


def estimated(price: ModelPrice, input_tokens: int, output_tokens: int) -> int:
    """The cost of a turn the upstream reported no usage for, from the gateway's estimates (input
    uncached), in micro-units rounded down."""
    return (input_tokens * price.input + output_tokens * price.output) // PER


def text(micro: int) -> str:
    """Micro-units as a decimal amount with 6 decimals: 1234567 -> "1.234567"."""
    sign = "-" if micro < 0 else ""
    whole, frac = divmod(abs(micro), MICRO)
    return f"{sign}{whole}.{frac:06d}"
