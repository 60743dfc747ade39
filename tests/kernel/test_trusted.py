"""gateway/kernel/spec/trusted.py: the engine models the ingresses build without a second validation
are the instances pydantic itself builds of the same values, and the shortcut is in use. A pydantic
upgrade that changes how an instance is laid out fails here (``fast``), not in production."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict

from gateway.api.chat.request import MAKERS as CHAT_MAKERS
from gateway.api.messages.parse import MAKERS as MESSAGES_MAKERS
from gateway.kernel.spec.request import (
    CreateResponseBody,
    FunctionTool,
    ReasoningItem,
    ReasoningParam,
    ToolChoiceFunction,
)
from gateway.kernel.spec.trusted import Trusted

SAMPLES: dict[type[BaseModel], dict[str, Any]] = {
    CreateResponseBody: {
        "model": "m",
        "input": "hi",
        "stream": True,
        "store": False,
        "truncation": "disabled",
        "max_output_tokens": 4,  # below the wire model's floor of 16: set past validation
        "temperature": 0.5,
    },
    FunctionTool: {"type": "function", "name": "get_weather", "parameters": {"type": "object"}},
    ToolChoiceFunction: {"type": "function", "name": "get_weather"},
    ReasoningParam: {"effort": "high", "summary": "auto"},
}


@pytest.mark.parametrize("maker", [*MESSAGES_MAKERS, *CHAT_MAKERS], ids=lambda m: m.model.__name__)
def test_the_ingresses_makers_take_the_shortcut(maker: Trusted[Any]) -> None:
    assert maker.fast, f"{maker.model.__name__}: pydantic changed its layout (gateway/kernel/spec/trusted.py)"


@pytest.mark.parametrize("model", list(SAMPLES), ids=lambda m: m.__name__)
def test_a_trusted_instance_is_the_one_pydantic_builds(model: type[BaseModel]) -> None:
    values = SAMPLES[model]
    ours = Trusted(model, **values).build(**values)
    theirs = model.model_construct(**values)
    assert type(ours) is model
    assert ours == theirs and ours.__dict__ == theirs.__dict__
    assert ours.model_fields_set == theirs.model_fields_set == set(values)
    assert ours.model_dump() == theirs.model_dump()
    if model is not CreateResponseBody:  # its max_output_tokens is below the wire floor on purpose
        assert ours == model.model_validate(values)


def test_mutable_defaults_are_not_shared() -> None:
    maker = Trusted(ReasoningItem, type="reasoning")
    first, second = maker.build(type="reasoning"), maker.build(type="reasoning")
    first.summary.append("x")  # type: ignore[arg-type]
    assert second.summary == [] and ReasoningItem(type="reasoning").summary == []


def test_a_model_the_shortcut_does_not_cover_is_built_by_model_construct() -> None:
    class Extra(BaseModel):
        model_config = ConfigDict(extra="allow")
        a: int

    maker = Trusted(Extra, a=1)
    assert not maker.fast
    built = maker.build(a=2, b=3)
    assert built.a == 2 and built.model_extra == {"b": 3}
