"""Turns over a real WebSocket: framing, numbering, queueing, continuation through the
connection-local cache, and turn-scoped errors that leave the socket usable."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from gateway.kernel.errors import UpstreamRejected
from tests.harness import ServedApp
from tests.ws.helpers import (
    FailFirst,
    Recorder,
    Slow,
    assert_clean_turn,
    assert_envelope,
    create,
    install,
    output_text,
    read_turn,
    run_turn,
    ws_connect,
)


@pytest.fixture(scope="module")
def recorder(gw: ServedApp) -> Recorder:
    rec = Recorder()
    install(gw, "rec", rec)
    return rec


async def test_single_turn_is_plain_json_text_frames(gw: ServedApp) -> None:
    async with ws_connect(gw) as ws:
        # Real clients send stream:true (and stream_options); both are ignored on a WebSocket.
        await ws.send(
            create(model="mock", input="Hi there", stream=True, stream_options={"include_obfuscation": False})
        )
        raw: list[str | bytes] = []
        while True:
            frame = await asyncio.wait_for(ws.recv(), 10)
            raw.append(frame)
            if orjson.loads(frame)["type"] == "response.completed":
                break
        with pytest.raises(TimeoutError):  # nothing after the terminal event: no [DONE]
            await asyncio.wait_for(ws.recv(), 0.3)
    assert all(isinstance(f, str) and not f.startswith(("event:", "data:")) for f in raw)
    events = [orjson.loads(f) for f in raw]
    response = assert_clean_turn(events)
    assert [e["type"] for e in events[:2]] == ["response.created", "response.in_progress"]
    assert output_text(response) == "Hello! You said: Hi there"
    assert response["status"] == "completed" and len(response) == 31


async def test_sequential_turns_restart_numbering(gw: ServedApp) -> None:
    async with ws_connect(gw) as ws:
        first = await run_turn(ws, model="mock", input="one", store=False)
        second = await run_turn(ws, model="mock", input="two", store=False)
    r1, r2 = assert_clean_turn(first), assert_clean_turn(second)
    assert r1["id"] != r2["id"]
    assert output_text(r2) == "Hello! You said: two"
    assert r2["previous_response_id"] is None


async def test_continuation_sends_only_new_items(gw: ServedApp, recorder: Recorder) -> None:
    start = len(recorder.requests)
    async with ws_connect(gw) as ws:
        r1 = assert_clean_turn(await run_turn(ws, model="rec", input="My color is cobalt.", store=False))
        r2 = assert_clean_turn(
            await run_turn(
                ws, model="rec", input="What is my color?", store=False, previous_response_id=r1["id"]
            )
        )
        r3 = assert_clean_turn(
            await run_turn(ws, model="rec", input="Thanks.", store=False, previous_response_id=r2["id"])
        )
    assert r2["previous_response_id"] == r1["id"] and r3["previous_response_id"] == r2["id"]
    t1, t2, t3 = recorder.transcripts()[start:]
    texts = [[(i["role"], i["content"][0]["text"]) for i in t] for t in (t1, t2, t3)]
    assert texts[0] == [("user", "My color is cobalt.")]
    assert texts[1] == [
        ("user", "My color is cobalt."),
        ("assistant", "Hello! You said: My color is cobalt."),
        ("user", "What is my color?"),
    ]
    assert texts[2] == [
        *texts[1],
        ("assistant", "Hello! You said: What is my color?"),
        ("user", "Thanks."),
    ]
    # The inherited assistant message is the very output item of turn 1 (same id).
    assert t2[1]["id"] == r1["output"][0]["id"]


async def test_store_false_id_is_unknown_on_another_connection(gw: ServedApp) -> None:
    async with ws_connect(gw) as ws:
        r1 = assert_clean_turn(await run_turn(ws, model="mock", input="remember", store=False))
    async with ws_connect(gw) as ws:
        [msg] = await run_turn(ws, model="mock", input="again", store=False, previous_response_id=r1["id"])
        assert_envelope(msg, 400, "previous_response_not_found", "previous_response_id")
        assert r1["id"] in msg["error"]["message"]
        # The socket stays usable: recovery without previous_response_id completes.
        recovered = assert_clean_turn(await run_turn(ws, model="mock", input="full context", store=False))
    assert output_text(recovered) == "Hello! You said: full context"


async def test_made_up_id_is_not_found(gw: ServedApp) -> None:
    async with ws_connect(gw) as ws:
        [msg] = await run_turn(ws, model="mock", input="x", store=False, previous_response_id="resp_nope")
        assert_envelope(msg, 400, "previous_response_not_found", "previous_response_id")


async def test_store_true_ids_continue_on_any_connection(gw: ServedApp) -> None:
    async with ws_connect(gw) as ws:
        r1 = assert_clean_turn(await run_turn(ws, model="mock", input="kept", store=True))
    async with ws_connect(gw) as ws:  # not in this socket's cache: hydrated from the store
        r2 = assert_clean_turn(await run_turn(ws, model="mock", input="next", previous_response_id=r1["id"]))
        # A failed continuation evicts only the local copy; the store still has it.
        bad = {"type": "function_call_output", "call_id": "call_missing", "output": "x"}
        [msg] = await run_turn(ws, model="mock", input=[bad], previous_response_id=r2["id"])
        assert_envelope(msg, 400, "invalid_function_call_output")
        assert_clean_turn(await run_turn(ws, model="mock", input="retry", previous_response_id=r2["id"]))


async def test_failed_continuation_evicts_the_cache(gw: ServedApp) -> None:
    async with ws_connect(gw) as ws:
        r1 = assert_clean_turn(await run_turn(ws, model="mock", input="start", store=False))
        orphan = {"type": "function_call_output", "call_id": "call_openresponses_missing", "output": "{}"}
        [msg] = await run_turn(ws, model="mock", input=[orphan], store=False, previous_response_id=r1["id"])
        assert_envelope(msg, 400, "invalid_function_call_output")
        [again] = await run_turn(ws, model="mock", input="retry", store=False, previous_response_id=r1["id"])
        assert_envelope(again, 400, "previous_response_not_found", "previous_response_id")
        assert_clean_turn(await run_turn(ws, model="mock", input="fresh", store=False))


async def test_failure_after_created_ends_with_response_failed_only(gw: ServedApp) -> None:
    install(gw, "breaks", Slow(pieces=5, delay=0.01, fail_after=2))
    async with ws_connect(gw) as ws:
        r1 = assert_clean_turn(await run_turn(ws, model="mock", input="start", store=False))
        events = await run_turn(ws, model="breaks", input="go", store=False, previous_response_id=r1["id"])
        failed = assert_clean_turn(events, terminal="response.failed")
        assert all(e["type"] != "error" for e in events)
        assert failed["status"] == "failed" and failed["error"]["code"] == "upstream_error"
        assert [e["delta"] for e in events if e["type"] == "response.output_text.delta"] == ["p0 ", "p1 "]
        # A continuation that ended in response.failed evicts the id it referenced too.
        [msg] = await run_turn(ws, model="mock", input="retry", store=False, previous_response_id=r1["id"])
        assert_envelope(msg, 400, "previous_response_not_found")


async def test_upstream_refusal_before_output_is_the_envelope_only(gw: ServedApp) -> None:
    install(gw, "refuses", FailFirst(UpstreamRejected("The provider rejected the request.")))
    async with ws_connect(gw) as ws:
        r1 = assert_clean_turn(await run_turn(ws, model="mock", input="start", store=False))
        [msg] = await run_turn(ws, model="refuses", input="go", store=False, previous_response_id=r1["id"])
        assert_envelope(msg, 400, "upstream_invalid_request")
        [msg] = await run_turn(ws, model="mock", input="go", store=False, previous_response_id=r1["id"])
        assert_envelope(msg, 400, "previous_response_not_found")


async def test_item_reference_resolves_from_the_connection_cache(gw: ServedApp, recorder: Recorder) -> None:
    async with ws_connect(gw) as ws:
        r1 = assert_clean_turn(await run_turn(ws, model="rec", input="alpha", store=False))
        ref = {"type": "item_reference", "id": r1["output"][0]["id"]}
        user = {"role": "user", "content": "and then?"}
        assert_clean_turn(await run_turn(ws, model="rec", input=[ref, user], store=False))
    last = recorder.transcripts()[-1]
    assert [i["role"] for i in last] == ["assistant", "user"]
    assert last[0]["content"][0]["text"] == "Hello! You said: alpha"


async def test_creates_sent_at_once_run_in_order(gw: ServedApp) -> None:
    install(gw, "slowish", Slow(pieces=3, delay=0.02))
    async with ws_connect(gw) as ws:
        for n in range(4):
            await ws.send(create(model="slowish" if n % 2 else "mock", input=f"n{n}", store=False))
        turns = [await read_turn(ws) for _ in range(4)]
    for n, events in enumerate(turns):
        response = assert_clean_turn(events)  # each turn's events contiguous, numbered from 0
        assert output_text(response) == ("p0 p1 p2 " if n % 2 else f"Hello! You said: n{n}")


async def test_background_is_rejected(gw: ServedApp) -> None:
    async with ws_connect(gw) as ws:
        [msg] = await run_turn(ws, model="mock", input="x", background=True)
        assert_envelope(msg, 400, "unsupported_parameter", "background")
        assert msg["error"]["type"] == "invalid_request_error"
        assert_clean_turn(await run_turn(ws, model="mock", input="x", background=False))


async def test_invalid_bodies_get_envelopes(gw: ServedApp) -> None:
    async with ws_connect(gw) as ws:
        [msg] = await run_turn(ws, model="mock", input="x", temperature=5)
        assert_envelope(msg, 400, "invalid_value", "temperature")
        [msg] = await run_turn(ws, model="nope", input="x")
        assert_envelope(msg, 400, "model_not_found", "model")
        [msg] = await run_turn(ws, input="x")
        assert_envelope(msg, 400, "missing_required_parameter", "model")
        assert_clean_turn(await run_turn(ws, model="mock", input="still here"))


async def test_bad_frames_get_envelopes_and_keep_the_socket(gw: ServedApp) -> None:
    async with ws_connect(gw) as ws:
        await ws.send("not json")
        assert_envelope((await read_turn(ws))[0], 400, "invalid_json")
        await ws.send("[1, 2]")
        assert_envelope((await read_turn(ws))[0], 400, "invalid_json")
        await ws.send(b'{"type": "response.create", "model": "mock", "input": "x"}')
        assert_envelope((await read_turn(ws))[0], 400, "unsupported_frame_type")
        await ws.send('{"type": "response.cancel"}')
        assert_envelope((await read_turn(ws))[0], 400, "unknown_message_type", "type")
        await ws.send('{"model": "mock", "input": "no type"}')
        assert_envelope((await read_turn(ws))[0], 400, "unknown_message_type", "type")
        await ws.send(create(model="mock", input="x" * 6000))  # over the 4 KiB cap, under 2x
        assert_envelope((await read_turn(ws))[0], 413, "payload_too_large")
        assert_clean_turn(await run_turn(ws, model="mock", input="fine"))


async def test_frames_far_over_the_cap_close_the_socket(gw: ServedApp) -> None:
    async with ws_connect(gw) as ws:
        await ws.send(create(model="mock", input="x" * 20_000))  # over 2x the cap: protocol limit
        with pytest.raises(Exception):  # noqa: B017 - the connection closes
            await read_turn(ws)
        assert ws.close_code == 1009


async def test_codex_alias(gw: ServedApp) -> None:
    async with ws_connect(gw, "/v1/codex/responses") as ws:
        r1 = assert_clean_turn(await run_turn(ws, model="mock", input="hi", store=False))
        assert_clean_turn(
            await run_turn(ws, model="mock", input="ok", store=False, previous_response_id=r1["id"])
        )
