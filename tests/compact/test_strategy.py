"""The compaction strategy: what is kept, what is summarized, the prompt, the transcript."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compact import strategy
from compact.strategy import OMITTED, SUMMARY_PROMPT, plan, recent_start, render, transcript

Item = dict[str, Any]


def msg(role: str, text: str, item_id: str | None = None) -> Item:
    kind = "output_text" if role == "assistant" else "input_text"
    return {
        "type": "message",
        "id": item_id or f"msg_{text}",
        "role": role,
        "content": [{"type": kind, "text": text}],
    }


def call(cid: str, name: str = "f") -> Item:
    return {"type": "function_call", "id": f"fc_{cid}", "call_id": cid, "name": name, "arguments": "{}"}


def out(cid: str, text: str = "ok") -> Item:
    return {"type": "function_call_output", "id": f"fco_{cid}", "call_id": cid, "output": text}


def ids(items: list[Item]) -> list[str]:
    return [i["id"] for i in items]


def test_prompt_lives_here_once_and_says_what_matters() -> None:
    p = SUMMARY_PROMPT
    for must in ("summar", "tool calls", "identifiers", "earlier summary", "Do not answer or continue"):
        assert must in p
    assert strategy.instructions(None) == p
    with_client = strategy.instructions("Always answer in French.")
    assert with_client.startswith(p) and with_client.endswith("Always answer in French.")


def test_short_input_keeps_everything() -> None:
    items = [msg("user", "a"), msg("assistant", "b")]
    p = plan(items, 4)
    assert p.older == [] and p.pinned == [] and p.recent == items


def test_system_and_developer_messages_are_pinned_recent_tail_kept() -> None:
    items = [
        msg("system", "sys"),
        msg("user", "u1"),
        msg("assistant", "a1"),
        msg("developer", "dev"),
        msg("user", "u2"),
        msg("assistant", "a2"),
        msg("user", "u3"),
    ]
    p = plan(items, 2)
    assert ids(p.pinned) == ["msg_sys", "msg_dev"]
    assert ids(p.older) == ["msg_u1", "msg_a1", "msg_u2"]
    assert ids(p.recent) == ["msg_a2", "msg_u3"]


def test_system_message_inside_the_tail_stays_in_place() -> None:
    items = [msg("user", "u1"), msg("assistant", "a1"), msg("system", "sys"), msg("user", "u2")]
    p = plan(items, 2)
    assert ids(p.recent) == ["msg_sys", "msg_u2"] and p.pinned == []


def test_keep_zero_summarizes_everything_but_system() -> None:
    items = [msg("system", "s"), msg("user", "u"), msg("assistant", "a")]
    p = plan(items, 0)
    assert ids(p.pinned) == ["msg_s"] and ids(p.older) == ["msg_u", "msg_a"] and p.recent == []


def test_a_call_is_never_split_from_its_output() -> None:
    items = [msg("user", "u1"), call("c1"), call("c2"), out("c1"), out("c2"), msg("assistant", "a")]
    # the last 2 are [out c2, a]: the tail grows back to call c2, which brings out c1 and so call c1
    assert recent_start(items, 2) == 1
    assert recent_start(items, 1) == 5
    p = plan(items, 3)
    assert ids(p.recent) == ["fc_c1", "fc_c2", "fco_c1", "fco_c2", "msg_a"]


def test_reasoning_stays_with_the_item_it_precedes() -> None:
    reasoning = {"type": "reasoning", "id": "rs_1", "summary": []}
    items = [msg("user", "u"), reasoning, call("c1"), out("c1")]
    assert recent_start(items, 2) == 1


@settings(deadline=None)
@given(
    st.lists(st.sampled_from(["user", "assistant", "system", "call", "reasoning"]), max_size=30),
    st.integers(min_value=0, max_value=12),
)
def test_plan_is_a_partition_that_never_orphans_an_output(kinds: list[str], keep: int) -> None:
    items: list[Item] = []
    for n, kind in enumerate(kinds):
        if kind == "call":
            items += [call(f"c{n}"), out(f"c{n}")]
        elif kind == "reasoning":
            items.append({"type": "reasoning", "id": f"rs_{n}", "summary": []})
        else:
            items.append(msg(kind, f"t{n}"))
    p = plan(items, keep)
    assert sorted(ids(p.pinned + p.older + p.recent)) == sorted(ids(items))
    assert len(p.recent) >= min(keep, len(items))
    recent_calls = {i["call_id"] for i in p.recent if i["type"] == "function_call"}
    for i in p.recent:
        if i["type"] == "function_call_output":
            assert i["call_id"] in recent_calls
    assert [i for i in items if i in p.recent] == p.recent  # order kept
    assert all(i["role"] in ("system", "developer") for i in p.pinned)


def test_earlier_summaries_are_always_folded_and_go_first() -> None:
    summary = msg("user", "old summary", item_id="cmp_1")
    items = [msg("user", "u1"), summary, msg("assistant", "a1")]
    p = plan(items, 3)
    assert ids(p.older) == ["cmp_1"]  # never handed back in the clear
    assert ids(p.recent) == ["msg_u1", "msg_a1"]
    p = plan([msg("user", "u0"), *items], 1)
    assert ids(p.older) == ["cmp_1", "msg_u0", "msg_u1"]


def test_render_covers_every_item_kind() -> None:
    assert render(msg("user", "hi")) == "[user]\nhi"
    assert render(msg("user", "s", item_id="cmp_9")).startswith("[earlier summary]\n")
    assert render(call("c1", "get_weather")) == "[tool call c1] get_weather({})"
    assert render(out("c1", "22C")) == "[tool result c1]\n22C"
    assert render({"type": "reasoning", "id": "r", "summary": []}) == ""
    assert render({"type": "reasoning", "id": "r", "summary": [{"type": "summary_text", "text": "t"}]}) == (
        "[assistant reasoning]\nt"
    )
    image = {
        "type": "message",
        "id": "m",
        "role": "user",
        "content": [
            {"type": "input_text", "text": "look"},
            {"type": "input_image", "image_url": "data:image/png;base64,AAAA"},
            {"type": "input_file", "filename": "a.pdf"},
        ],
    }
    assert render(image) == "[user]\nlook\n[image]\n[file a.pdf]"
    assert "AAAA" not in render(image)
    refusal = {
        "type": "message",
        "id": "m",
        "role": "assistant",
        "content": [{"type": "refusal", "refusal": "no"}],
    }
    assert render(refusal) == "[assistant]\n(refused) no"


def test_transcript_fits_its_budget_keeping_newest_and_summaries() -> None:
    items = [msg("user", "S" * 50, item_id="cmp_1")] + [msg("user", f"{n:03d}" + "x" * 96) for n in range(50)]
    full = transcript(items, 1_000_000)
    assert OMITTED not in full and full.count("[user]") == 50
    short = transcript(items, 1_000)
    assert len(short) <= 1_000
    assert OMITTED in short
    assert "[earlier summary]" in short and "049xxx" in short and "000xxx" not in short


@pytest.mark.parametrize("budget", [200, 400, 1_000])
def test_one_huge_entry_is_cut_not_dropped(budget: int) -> None:
    text = transcript([msg("user", "y" * 10_000)], budget)
    assert len(text) <= budget and "yyyy" in text


def test_empty_transcript() -> None:
    assert transcript([], 100) == ""
