"""Any JSON body, over HTTP or as a WebSocket ``response.create``, gets a response or a 4xx error in
the spec's shape: never a 5xx, a crash, a hang or a turn without exactly one terminal message.

Bodies are drawn around the schema (known field names and item kinds with arbitrary values), so most
of them reach deep into validation rather than failing on the first field.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from websockets.sync.client import ClientConnection, connect

from tests.harness import ServedApp
from tests.ws.helpers import TERMINAL

SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False),
    st.text(max_size=20),
)
JSON = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=12,
)
FIELDS = st.sampled_from(
    "model input instructions tools tool_choice stream store previous_response_id max_output_tokens "
    "temperature top_p text reasoning truncation metadata include parallel_tool_calls background "
    "max_tool_calls top_logprobs service_tier prompt_cache_key safety_identifier stream_options".split()
)
ITEM_FIELDS = st.sampled_from(
    "type role content id status call_id name arguments output summary encrypted_content phase text "
    "image_url file_data".split()
)
KINDS = st.sampled_from(
    "message function_call function_call_output reasoning item_reference compaction input_text "
    "output_text input_image input_file refusal summary_text web_search_call".split()
)
PART = st.dictionaries(ITEM_FIELDS, st.one_of(JSON, KINDS), max_size=4)
ITEM = st.dictionaries(ITEM_FIELDS, st.one_of(JSON, KINDS, st.lists(PART, max_size=3)), max_size=6)
BODY = st.dictionaries(FIELDS, st.one_of(JSON, st.lists(ITEM, max_size=4), KINDS), max_size=8).map(
    lambda body: {"model": "mock", **body}
)
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))


@pytest.fixture(scope="module")
def ws(gateway: ServedApp) -> Iterator[ClientConnection]:
    conn = connect(gateway.ws_url + "/v1/responses", proxy=None)
    with conn:
        yield conn


def assert_error_shape(error: dict[str, Any]) -> None:
    assert set(error) >= {"type", "code", "message", "param"}, error
    assert isinstance(error["message"], str) and error["message"]


def test_any_http_body_gets_an_answer_or_a_4xx(gateway: ServedApp) -> None:
    with httpx.Client(base_url=gateway.base_url, timeout=20) as client:

        @FUZZ
        @given(BODY)
        def check(body: dict[str, Any]) -> None:
            r = client.post("/v1/responses", content=orjson.dumps(body))
            assert r.status_code < 500, (body, r.text[:300])
            if r.status_code >= 400:
                assert_error_shape(r.json()["error"])
            elif body.get("stream") is True:
                assert r.text.endswith("data: [DONE]\n\n")
            else:
                assert r.json()["object"] == "response"

        check()


def test_any_websocket_turn_ends_with_exactly_one_terminal(ws: ClientConnection) -> None:
    @FUZZ
    @given(BODY)
    def check(body: dict[str, Any]) -> None:
        ws.send(orjson.dumps({"type": "response.create", **body}).decode())
        seen: list[dict[str, Any]] = []
        while not seen or seen[-1]["type"] not in TERMINAL:
            seen.append(orjson.loads(ws.recv(timeout=20)))
        if seen[-1]["type"] == "error":
            assert len(seen) == 1, [e["type"] for e in seen]  # an error envelope ends a turn alone
            assert 400 <= seen[-1]["status"] < 500, seen[-1]
            assert_error_shape(seen[-1]["error"])

    check()
