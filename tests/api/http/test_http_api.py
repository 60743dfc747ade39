"""POST /v1/responses over real sockets: validation errors, limits, auth, SDK clients."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest

from tests.harness import ServedApp, serve_gateway

TOOLS = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
        },
    }
]


@pytest.fixture(scope="module")
def authed() -> Iterator[ServedApp]:
    import hashlib

    digest = hashlib.sha256(b"sk-hashed").hexdigest()
    with serve_gateway(
        {
            "auth": {
                "api_keys": [
                    {"key": "sk-team-a", "tenant": "a"},
                    {"sha256": digest, "tenant": "b", "models": ["mock"]},
                ]
            },
            "limits": {"max_body_bytes": 4096},
        }
    ) as served:
        yield served


async def post(served: ServedApp, body: object, **kw: object) -> httpx.Response:
    async with httpx.AsyncClient(base_url=served.base_url, timeout=10) as c:
        if isinstance(body, bytes):
            return await c.post("/v1/responses", content=body, **kw)  # type: ignore[arg-type]
        return await c.post("/v1/responses", json=body, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("body", "status", "code", "param"),
    [
        ({"input": "hi"}, 400, "missing_required_parameter", "model"),
        ({"model": "nope", "input": "hi"}, 400, "model_not_found", "model"),
        (
            {
                "model": "mock",
                "input": [
                    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": 3}]}
                ],
            },
            400,
            "invalid_value",
            "input[0].content[0].text",
        ),
        ({"model": "mock", "input": [{"type": "bogus"}]}, 400, "invalid_value", "input[0]"),
        (
            {"model": "mock", "tools": [{"type": "function", "name": "bad name"}]},
            400,
            "invalid_value",
            "tools[0].name",
        ),
        ({"model": "mock", "max_output_tokens": 3}, 400, "invalid_value", "max_output_tokens"),
        ({"model": "mock", "temperature": "hot"}, 400, "invalid_value", "temperature"),
        (
            {"model": "mock", "input": [{"type": "function_call_output", "call_id": "nope", "output": "x"}]},
            400,
            "invalid_function_call_output",
            "input[0].call_id",
        ),
        (
            {"model": "mock", "previous_response_id": "resp_missing", "input": "x"},
            400,
            "previous_response_not_found",
            "previous_response_id",
        ),
        ([1, 2], 400, "invalid_json", None),
    ],
)
async def test_bad_requests_get_spec_errors(
    gateway: ServedApp, body: object, status: int, code: str, param: str | None
) -> None:
    r = await post(gateway, body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["code"] == code
    assert err["param"] == param
    assert err["type"] == "invalid_request_error"
    assert err["message"]


async def test_malformed_json_and_unknown_routes(gateway: ServedApp) -> None:
    r = await post(gateway, b"{not json")
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
    async with httpx.AsyncClient(base_url=gateway.base_url) as c:
        r = await c.get("/v1/nothing")
        assert r.status_code == 404 and r.json()["error"]["type"] == "not_found"
        r = await c.get("/v1/responses")
        assert r.status_code in (404, 405) and "error" in r.json()


async def test_unknown_fields_are_ignored_and_untyped_messages_accepted(gateway: ServedApp) -> None:
    r = await post(
        gateway, {"model": "mock", "input": [{"role": "user", "content": "yo"}], "future_field": {"x": 1}}
    )
    assert r.status_code == 200
    assert r.json()["output"][0]["content"][0]["text"] == "Hello! You said: yo"


async def test_every_input_item_kind_is_accepted(gateway: ServedApp) -> None:
    items = [
        {"type": "message", "role": "system", "content": "be brief"},
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "dev"}]},
        {
            "type": "message",
            "role": "user",
            "content": [
                {"type": "input_text", "text": "look"},
                {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo=", "detail": "low"},
                {"type": "input_file", "filename": "a.txt", "file_data": "aGk="},
            ],
        },
        {
            "type": "message",
            "role": "assistant",
            "id": "msg_prev",
            "status": "completed",
            "phase": "commentary",
            "content": [{"type": "output_text", "text": "sure", "annotations": []}],
        },
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "thinking"}]},
        {
            "type": "function_call",
            "id": "fc_1",
            "call_id": "call_1",
            "name": "get_weather",
            "arguments": "{}",
            "status": "completed",
        },
        {
            "type": "function_call_output",
            "call_id": "call_1",
            "output": [{"type": "input_text", "text": "sunny"}],
        },
    ]
    r = await post(gateway, {"model": "mock", "input": items, "tools": TOOLS})
    assert r.status_code == 200, r.text
    assert r.json()["output"][0]["content"][0]["text"] == "The tool returned: sunny"


async def test_body_cap_gives_413_and_the_server_stays_healthy(authed: ServedApp) -> None:
    big = {"model": "mock", "input": "x" * 10_000}
    r = await post(authed, big, headers={"Authorization": "Bearer sk-team-a"})
    assert r.status_code == 413 and r.json()["error"]["code"] == "payload_too_large"
    r = await post(authed, {"model": "mock", "input": "small"}, headers={"Authorization": "Bearer sk-team-a"})
    assert r.status_code == 200


async def test_auth(authed: ServedApp) -> None:
    r = await post(authed, {"model": "mock", "input": "x"})
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    r = await post(authed, {"model": "mock", "input": "x"}, headers={"Authorization": "Bearer wrong"})
    assert r.status_code == 401
    r = await post(authed, {"model": "mock", "input": "x"}, headers={"Authorization": "Basic abc"})
    assert r.status_code == 401
    r = await post(authed, {"model": "mock", "input": "x"}, headers={"Authorization": "Bearer sk-hashed"})
    assert r.status_code == 200
    async with httpx.AsyncClient(base_url=authed.base_url) as c:
        r = await c.get("/v1/models", headers={"Authorization": "Bearer sk-hashed"})
        assert [m["id"] for m in r.json()["data"]] == ["mock"]
        r = await c.get("/v1/models")
        assert r.status_code == 401


async def test_the_mock_echoes_no_top_logprobs_it_does_not_return(gateway: ServedApp) -> None:
    r = await post(gateway, {"model": "mock", "input": "hi", "top_logprobs": 3, "temperature": 0.5})
    body = r.json()
    assert body["top_logprobs"] == 0 and body["temperature"] == 0.5
    assert not body["output"][0]["content"][0].get("logprobs")


async def test_max_output_tokens_gives_incomplete(gateway: ServedApp) -> None:
    r = await post(
        gateway,
        {
            "model": "mock",
            "input": "a long question for the mock",
            "max_output_tokens": 16,
            "instructions": "x",
        },
    )
    body = r.json()
    assert body["status"] == "completed"  # 16 pieces are enough for this answer
    r = await post(gateway, {"model": "mock", "input": "q" * 200, "max_output_tokens": 16})
    body = r.json()
    assert body["status"] == "incomplete"
    assert body["incomplete_details"] == {"reason": "max_output_tokens"}
    assert body["output"][-1]["status"] == "incomplete"
    assert body["usage"]["output_tokens"] == 16


async def test_allowed_tools_and_tool_choice(gateway: ServedApp) -> None:
    tools = [*TOOLS, {"type": "function", "name": "other", "parameters": {"type": "object"}}]
    r = await post(
        gateway,
        {
            "model": "mock",
            "input": "hi",
            "tools": tools,
            "tool_choice": {"type": "allowed_tools", "tools": [{"type": "function", "name": "other"}]},
        },
    )
    body = r.json()
    assert body["output"][0]["name"] == "other"
    assert body["tool_choice"] == {
        "type": "allowed_tools",
        "tools": [{"type": "function", "name": "other"}],
        "mode": "auto",
    }
    r = await post(gateway, {"model": "mock", "input": "hi", "tools": tools, "tool_choice": "none"})
    assert r.json()["output"][0]["type"] == "message"
    r = await post(
        gateway,
        {
            "model": "mock",
            "input": "hi",
            "tools": tools,
            "tool_choice": {"type": "function", "name": "other"},
        },
    )
    assert r.json()["output"][0]["name"] == "other"


# -- real clients -----------------------------------------------------------------------------
def sdk(served: ServedApp) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=served.base_url + "/v1", api_key="sk-none", max_retries=0)


async def test_openai_sdk_create(gateway: ServedApp) -> None:
    client = sdk(gateway)
    resp = await client.responses.create(model="mock", input="hello sdk", instructions="be nice")
    assert resp.status == "completed"
    assert resp.output_text == "Hello! You said: hello sdk"
    assert resp.instructions == "be nice"
    call = await client.responses.create(model="mock", input="weather?", tools=TOOLS)  # type: ignore[arg-type]
    fc = call.output[0]
    assert fc.type == "function_call" and fc.name == "get_weather"
    follow = await client.responses.create(
        model="mock",
        previous_response_id=call.id,
        tools=TOOLS,  # type: ignore[arg-type]
        input=[{"type": "function_call_output", "call_id": fc.call_id, "output": "22C"}],
    )
    assert follow.output_text == "The tool returned: 22C"
    assert follow.previous_response_id == call.id


async def test_openai_sdk_stream_true(gateway: ServedApp) -> None:
    client = sdk(gateway)
    stream = await client.responses.create(model="mock", input="streaming", stream=True)
    types = []
    text = ""
    async for event in stream:
        types.append(event.type)
        if event.type == "response.output_text.delta":
            text += event.delta
    assert types[0] == "response.created" and types[-1] == "response.completed"
    assert text == "Hello! You said: streaming"


async def test_openai_sdk_stream_helper(gateway: ServedApp) -> None:
    client = sdk(gateway)
    async with client.responses.stream(model="mock", input="helper") as stream:
        async for _ in stream:
            pass
        final = await stream.get_final_response()
    assert final.output_text == "Hello! You said: helper"
    async with client.responses.stream(model="mock", input="w", tools=TOOLS) as stream:  # type: ignore[arg-type]
        final = await stream.get_final_response()
    assert final.output[0].type == "function_call"
    assert final.output[0].arguments == '{"city":"example","days":1}'


async def test_openai_sdk_sees_api_errors(gateway: ServedApp) -> None:
    client = sdk(gateway)
    with pytest.raises(openai.BadRequestError) as info:
        await client.responses.create(model="not-a-model", input="x")
    assert info.value.code == "model_not_found"
    assert info.value.param == "model"
