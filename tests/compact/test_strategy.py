"""The compaction strategy: what is kept, what is summarized, the prompt, the transcript."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compact import strategy
from compact.strategy import (
    OMITTED,
    SUMMARY_PROMPT,
    TAIL_SHARE,
    compact_plan,
    compact_start,
    plan,
    recent_start,
    render,
    transcript,
)
from gateway.kernel.estimate import estimate, estimate_item
from gateway.kernel.settings import CompactionSettings, ConfigError, load_settings

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


def sized(role: str, tokens: int, name: str) -> Item:
    """A message the estimator counts as exactly ``tokens`` tokens (4 bytes a token, 4 per item)."""
    return msg(role, "x" * (4 * (tokens - 4)), item_id=f"msg_{name}")


def result(cid: str, tokens: int) -> Item:
    """A function_call_output of exactly ``tokens`` estimated tokens."""
    return out(cid, "r" * (4 * (tokens - 4)))


def verbatim_tokens(p: strategy.Plan) -> int:
    return estimate(p.pinned) + estimate(p.recent)


def test_the_sizing_helpers_mean_what_they_say() -> None:
    assert estimate_item(sized("user", 100, "a")) == 100 and estimate_item(result("c", 7_000)) == 7_000
    assert estimate_item(call("c")) == 6  # "f" + "{}": 1/4 + 2 x 3/4, two tokens, plus the item overhead


def test_everything_that_fits_is_kept_and_nothing_summarized() -> None:
    items = [msg("system", "s"), msg("user", "a"), call("c1"), out("c1"), msg("assistant", "b")]
    p = plan(items, estimate(items))
    assert p.older == [] and p.pinned == [] and p.recent == items
    assert plan(items, 10**9).recent == items


def test_a_bulky_tail_is_summarized_not_kept() -> None:
    # The shape that used to come back larger: a huge tool result, then a long assistant message.
    items = [
        sized("system", 20, "sys"),
        sized("user", 50, "u1"),
        sized("assistant", 50, "a1"),
        sized("user", 30, "u2"),
        call("c1"),
        result("c1", 7_500),
        sized("assistant", 1_800, "a2"),
    ]
    p = plan(items, 2_000)
    assert ids(p.pinned) == ["msg_sys"]
    assert ids(p.recent) == ["msg_a2"]
    assert ids(p.older) == ["msg_u1", "msg_a1", "msg_u2", "fc_c1", "fco_c1"]
    assert verbatim_tokens(p) == 1_820 <= 2_000
    # the long assistant message alone is over the budget too: then it is summarized as well
    p = plan(items, 1_000)
    assert p.recent == [] and ids(p.pinned) == ["msg_sys"] and len(p.older) == 6


def test_a_bulky_head_is_summarized_and_the_small_tail_kept() -> None:
    items = [
        sized("user", 10_000, "big_u"),
        sized("assistant", 5_000, "big_a"),
        sized("user", 40, "u"),
        sized("assistant", 40, "a"),
        sized("user", 20, "u2"),
    ]
    p = plan(items, 200)
    assert ids(p.older) == ["msg_big_u", "msg_big_a"]
    assert ids(p.recent) == ["msg_u", "msg_a", "msg_u2"]
    assert verbatim_tokens(p) == 100


def test_one_giant_tool_result_goes_to_the_summary_with_its_call() -> None:
    items = [sized("user", 30, "u"), call("c1"), result("c1", 50_000)]
    p = plan(items, 20_000)
    assert p.recent == [] and ids(p.older) == ["msg_u", "fc_c1", "fco_c1"]
    # a small item after it is kept; nothing older than the giant is, even if it would fit
    items.append(sized("assistant", 30, "a"))
    p = plan(items, 20_000)
    assert ids(p.recent) == ["msg_a"] and ids(p.older) == ["msg_u", "fc_c1", "fco_c1"]


def test_a_call_and_output_straddling_the_budget_are_summarized_together() -> None:
    items = [sized("user", 30, "u"), call("c1"), result("c1", 300), sized("assistant", 100, "a")]
    # room for the output and the message, not for the call: neither half of the pair is kept
    p = plan(items, 400 + estimate_item(call("c1")) - 1)
    assert ids(p.recent) == ["msg_a"] and ids(p.older) == ["msg_u", "fc_c1", "fco_c1"]
    p = plan(items, 400 + estimate_item(call("c1")))  # now the call fits too
    assert ids(p.recent) == ["fc_c1", "fco_c1", "msg_a"] and ids(p.older) == ["msg_u"]


def test_parallel_calls_are_kept_only_with_all_their_outputs() -> None:
    items = [msg("user", "u1"), call("c1"), call("c2"), out("c1"), out("c2"), msg("assistant", "a")]
    whole = estimate(items[1:])
    # [call c2, out c1, out c2, a] fits but would orphan out c1: the tail stays at [a]
    assert recent_start(items, whole - 1) == 5
    assert recent_start(items, whole) == 1
    assert ids(plan(items, whole).recent) == ["fc_c1", "fc_c2", "fco_c1", "fco_c2", "msg_a"]


def test_pinned_messages_are_kept_and_count_against_the_budget_first() -> None:
    items = [
        sized("system", 100, "sys"),
        sized("user", 50, "u1"),
        sized("assistant", 50, "a1"),
        sized("developer", 20, "dev"),
        sized("user", 40, "u2"),
        sized("assistant", 40, "a2"),
        sized("user", 40, "u3"),
    ]
    p = plan(items, 250)  # 120 pinned + 120 of tail; a1 would make it 290
    assert ids(p.pinned) == ["msg_sys"]  # the developer message is in the tail, so stays in place
    assert ids(p.older) == ["msg_u1", "msg_a1"]
    assert ids(p.recent) == ["msg_dev", "msg_u2", "msg_a2", "msg_u3"]
    assert verbatim_tokens(p) == 240
    p = plan(items, 200)  # 120 pinned + 80
    assert ids(p.pinned) == ["msg_sys", "msg_dev"] and ids(p.recent) == ["msg_a2", "msg_u3"]
    p = plan(items, 50)  # the pinned messages alone exceed it: they stay, nothing else does
    assert ids(p.pinned) == ["msg_sys", "msg_dev"] and p.recent == []


def test_system_message_inside_the_tail_stays_in_place() -> None:
    items = [msg("user", "u1"), msg("assistant", "a1"), msg("system", "sys"), msg("user", "u2")]
    p = plan(items, 10**6, max_items=2)
    assert ids(p.recent) == ["msg_sys", "msg_u2"] and p.pinned == []


def test_zero_budget_summarizes_everything_but_system() -> None:
    items = [msg("system", "s"), msg("user", "u"), msg("assistant", "a")]
    for p in (plan(items, 0), plan(items, 10**6, max_items=0)):
        assert ids(p.pinned) == ["msg_s"] and ids(p.older) == ["msg_u", "msg_a"] and p.recent == []


def test_keep_recent_items_caps_the_tail_without_splitting_a_pair() -> None:
    items = [msg("user", "u1"), call("c1"), call("c2"), out("c1"), out("c2"), msg("assistant", "a")]
    assert recent_start(items, 10**6, max_items=5) == 1
    assert recent_start(items, 10**6, max_items=4) == 5  # 4 items would split the calls
    assert recent_start(items, 10**6, max_items=6) == 0
    assert ids(plan(items, 10**6, max_items=1).recent) == ["msg_a"]


def test_reasoning_stays_with_the_item_it_precedes() -> None:
    reasoning = {"type": "reasoning", "id": "rs_1", "summary": []}
    items = [msg("user", "u"), reasoning, call("c1"), out("c1")]
    pair = estimate(items[2:])
    assert recent_start(items, pair) == 4  # the pair fits, but not without its reasoning
    assert recent_start(items, pair + estimate_item(reasoning)) == 1
    assert recent_start(items, 10**6, max_items=3) == 1


def transcripts(max_tokens: int) -> st.SearchStrategy[list[tuple[str, int]]]:
    """Up to 30 (kind, estimated tokens) pairs for ``build``."""
    kinds = st.sampled_from(["user", "assistant", "system", "call", "reasoning", "summary"])
    return st.lists(st.tuples(kinds, st.integers(min_value=4, max_value=max_tokens)), max_size=30)


def build(kinds: list[tuple[str, int]]) -> list[Item]:
    """Items of the given kinds and estimated sizes (a call comes with its output)."""
    items: list[Item] = []
    for n, (kind, tokens) in enumerate(kinds):
        if kind == "call":
            items += [call(f"c{n}"), result(f"c{n}", max(tokens, 5))]
        elif kind == "reasoning":
            items.append({"type": "reasoning", "id": f"rs_{n}", "summary": []})
        elif kind == "summary":
            items.append(msg("user", "s" * tokens, item_id=f"cmp_{n}"))
        else:
            items.append(sized(kind, tokens, str(n)))
    return items


def valid_start(items: list[Item], start: int) -> bool:
    """No output in items[start:] whose call is before ``start``; no reasoning just before it,
    unless it is a user message."""
    if start == len(items):
        return True
    before = {i["call_id"] for i in items[:start] if i["type"] == "function_call"}
    orphaned = any(i["type"] == "function_call_output" and i["call_id"] in before for i in items[start:])
    after_reasoning = start > 0 and items[start - 1]["type"] == "reasoning"
    return not orphaned and (not after_reasoning or strategy.is_user_turn(items[start]))


@settings(deadline=None, max_examples=300)
@given(
    transcripts(400),
    st.integers(min_value=0, max_value=3_000),
    st.none() | st.integers(min_value=0, max_value=12),
)
def test_plan_is_the_longest_valid_tail_within_the_budget(
    kinds: list[tuple[str, int]], budget: int, max_items: int | None
) -> None:
    items = build(kinds)
    p = plan(items, budget, max_items)
    start = recent_start(items, budget, max_items)
    assert sorted(ids(p.pinned + p.older + p.recent)) == sorted(ids(items))
    assert [i for i in items if i in p.recent] == p.recent  # order kept
    assert all(strategy.is_pinned(i) for i in p.pinned)
    assert not any(strategy.is_summary(i) for i in p.pinned + p.recent)
    assert valid_start(items, start)
    pinned = [i for i in items if strategy.is_pinned(i)]
    if estimate(pinned) <= budget:
        assert verbatim_tokens(p) <= budget
    else:
        assert [i for i in p.recent if not strategy.is_pinned(i)] == []
    if max_items is not None:
        assert len(p.recent) <= max_items
    # the longest such tail: starting at the next valid index before it would break a limit
    earlier = next((s for s in range(start - 1, -1, -1) if valid_start(items, s)), None)
    if earlier is not None:
        tail = [i for i in items[earlier:] if not strategy.is_summary(i)]
        cost = estimate(pinned) + estimate([i for i in tail if not strategy.is_pinned(i)])
        assert cost > budget or (max_items is not None and len(tail) > max_items)


def test_earlier_summaries_are_always_folded_and_go_first() -> None:
    summary = msg("user", "old summary", item_id="cmp_1")
    items = [msg("user", "u1"), summary, msg("assistant", "a1")]
    p = plan(items, 10**6)
    assert ids(p.older) == ["cmp_1"]  # never handed back in the clear
    assert ids(p.recent) == ["msg_u1", "msg_a1"]
    p = plan([msg("user", "u0"), *items], 10**6, max_items=1)
    assert ids(p.older) == ["cmp_1", "msg_u0", "msg_u1"]


# -- an explicit compaction (POST /v1/responses/compact) ---------------------------------------------
BUDGET = 19_200  # the default: 15% of a 128,000-token window


def agent_turns() -> list[Item]:
    """The issue's shape, ~10k tokens: a short ask, a 30k-character tool result, a long answer, a
    short last message. All of it is within the default budget."""
    return [
        sized("user", 20, "u1"),
        call("c1"),
        result("c1", 7_500),
        sized("assistant", 2_000, "a1"),
        sized("user", 15, "u2"),
    ]


def test_everything_before_the_newest_user_message_is_summarized() -> None:
    items = agent_turns()
    assert estimate(items) < BUDGET and plan(items, BUDGET).older == []  # inline's rule keeps it all
    p = compact_plan(items, BUDGET)
    assert ids(p.older) == ["msg_u1", "fc_c1", "fco_c1", "msg_a1"] and ids(p.recent) == ["msg_u2"]
    assert p.pinned == []


def test_only_a_user_message_is_kept_whole_with_nothing_to_summarize() -> None:
    for items in (
        [msg("user", "hi")],
        [msg("system", "s"), msg("user", "hi")],
        [msg("user", "hi"), msg("assistant", "a")],
    ):
        p = compact_plan(items, BUDGET)
        assert p.older == [] and p.recent == items  # as before: nothing precedes the newest user turn
    assert compact_plan([], BUDGET) == strategy.Plan([], [], [])


def test_pinned_messages_stay_and_the_newest_user_turn_keeps_its_calls() -> None:
    items = [
        sized("system", 100, "sys"),
        *agent_turns(),
        sized("developer", 30, "dev"),
        call("c2"),
        out("c2", "22C"),
        sized("assistant", 40, "a2"),
    ]
    p = compact_plan(items, BUDGET)
    assert ids(p.pinned) == ["msg_sys"]
    assert ids(p.older) == ["msg_u1", "fc_c1", "fco_c1", "msg_a1"]
    assert ids(p.recent) == ["msg_u2", "msg_dev", "fc_c2", "fco_c2", "msg_a2"]


def test_the_tail_is_bounded_by_a_share_of_the_input_not_only_the_budget() -> None:
    # The newest user turn holds the bulk: its 7,500-token result is over half of the input, so the
    # tail is the newest items within that share, and the user message goes to the summary.
    items = [sized("user", 20, "u1"), sized("assistant", 20, "a1"), sized("user", 20, "u2"), call("c1")]
    items += [result("c1", 7_500), sized("assistant", 2_000, "a2")]
    assert estimate(items[2:]) < BUDGET
    p = compact_plan(items, BUDGET)
    assert ids(p.recent) == ["msg_a2"] and ids(p.older) == ["msg_u1", "msg_a1", "msg_u2", "fc_c1", "fco_c1"]
    assert estimate(p.recent) <= TAIL_SHARE * estimate(items)
    # the budget still bounds it too
    p = compact_plan(items, 1_000)
    assert p.recent == [] and len(p.older) == len(items)


def test_a_huge_newest_user_message_stays_verbatim() -> None:
    items = [sized("user", 50, "u1"), sized("assistant", 50, "a1"), sized("user", 30_000, "big")]
    p = compact_plan(items, BUDGET)
    assert ids(p.older) == ["msg_u1", "msg_a1"] and ids(p.recent) == ["msg_big"]
    items.append(sized("assistant", 40, "a2"))  # with what follows it, when that fits
    assert ids(compact_plan(items, BUDGET).recent) == ["msg_big", "msg_a2"]


def test_the_tail_never_splits_a_call_from_its_output() -> None:
    # an output after the newest user message answers a call before it: the tail starts after both
    items = [
        sized("user", 20, "u1"),
        call("c1"),
        sized("user", 20, "u2"),
        out("c1"),
        sized("assistant", 20, "a"),
    ]
    p = compact_plan(items, BUDGET)
    assert ids(p.recent) == ["msg_a"] and ids(p.older) == ["msg_u1", "fc_c1", "msg_u2", "fco_c1"]


def test_reasoning_goes_with_what_follows_it() -> None:
    reasoning = {"type": "reasoning", "id": "rs_1", "summary": []}
    items = [sized("user", 20, "u1"), sized("assistant", 20, "a1"), sized("user", 20, "u2"), reasoning]
    items += [call("c1"), out("c1")]
    assert ids(compact_plan(items, BUDGET).recent) == ["msg_u2", "rs_1", "fc_c1", "fco_c1"]
    # a reasoning item just before the newest user message is summarized, the message kept
    items = [sized("user", 20, "u1"), reasoning, sized("user", 20, "u2")]
    p = compact_plan(items, BUDGET)
    assert ids(p.older) == ["msg_u1", "rs_1"] and ids(p.recent) == ["msg_u2"]


def test_earlier_summaries_are_folded_first() -> None:
    summary = msg("user", "old summary", item_id="cmp_1")
    p = compact_plan(
        [msg("system", "s"), summary, msg("user", "u1"), msg("assistant", "a1"), msg("user", "u2")], BUDGET
    )
    assert ids(p.pinned) == ["msg_s"] and ids(p.older) == ["cmp_1", "msg_u1", "msg_a1"]
    assert ids(p.recent) == ["msg_u2"]
    # an earlier summary alone before the newest user message is something to fold, not to keep
    p = compact_plan([summary, msg("user", "u2")], BUDGET)
    assert ids(p.older) == ["cmp_1"] and ids(p.recent) == ["msg_u2"]


def test_keep_recent_items_still_caps_the_tail() -> None:
    items = [msg("user", "u1"), msg("assistant", "a1"), msg("user", "u2"), msg("assistant", "a2")]
    assert ids(compact_plan(items, BUDGET, max_items=1).recent) == ["msg_a2"]
    assert ids(compact_plan(items, BUDGET, max_items=2).recent) == ["msg_u2", "msg_a2"]


@settings(deadline=None, max_examples=300)
@given(transcripts(4_000), st.integers(min_value=0, max_value=30_000))
def test_an_explicit_tail_is_valid_and_at_most_about_half_the_input(
    kinds: list[tuple[str, int]], budget: int
) -> None:
    items = build(kinds)
    start = compact_start(items, budget)
    p = compact_plan(items, budget)
    assert sorted(ids(p.pinned + p.older + p.recent)) == sorted(ids(items))
    assert valid_start(items, start)
    users = [n for n, i in enumerate(items) if strategy.is_user_turn(i)]
    if users and all(strategy.is_pinned(i) for i in items[: users[-1]]):
        assert start == recent_start(items, budget)  # nothing before the newest user turn
        return
    if users:
        assert start >= users[-1]  # everything before the newest user message is summarized
    tail = [i for i in p.recent if not strategy.is_pinned(i)]
    unpinned = estimate([i for i in items if not strategy.is_pinned(i)])
    if start == (users[-1] if users else None):
        tail = tail[1:]  # the newest user message stays whatever its size; what follows it fits
    pinned = estimate([i for i in items if strategy.is_pinned(i)])
    assert estimate(tail) <= min(budget - pinned, TAIL_SHARE * unpinned) or tail == []


# -- the budget ------------------------------------------------------------------------------------
def test_the_budget_defaults_to_15_percent_of_the_context_window() -> None:
    default = CompactionSettings()
    assert default.keep_recent_tokens is None and default.keep_recent_items is None
    assert default.recent_budget(128_000) == 19_200 and default.recent_budget(32_000) == 4_800
    assert CompactionSettings(keep_recent_fraction=0.1).recent_budget(200_000) == 20_000
    absolute = CompactionSettings(keep_recent_tokens=6_000, keep_recent_fraction=0.5)
    assert absolute.recent_budget(128_000) == absolute.recent_budget(1_000_000) == 6_000


@pytest.mark.parametrize(
    "bad", [{"keep_recent_tokens": -1}, {"keep_recent_fraction": 1.5}, {"keep_recent_items": -1}]
)
def test_bad_budgets_are_refused(bad: dict[str, Any]) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(compaction=bad)
    assert f"compaction.{next(iter(bad))}" in str(info.value)


def test_the_budget_can_be_set_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATEWAY_COMPACTION__KEEP_RECENT_TOKENS", "3000")
    assert load_settings().compaction.recent_budget(128_000) == 3_000


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
