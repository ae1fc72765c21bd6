"""Texts cut to their bounds: a tool result cut to its stored size (``bounds.clip_result``:
the longest prefix whose UTF-8 as a JSON string, escapes included, fits), a model's text cut
to its UTF-8 bytes (``decision.clip_text``), and a turn's results held to their budget
(``bounds.bound_results``: whole in call order while they fit, the one crossing the budget cut,
every later one a placeholder). Never inside a character, always with a marker naming what was
cut; checked against the definitions themselves (every prefix tried) on generated texts full of
what stores larger than it looks."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from agentrun.kernel.bounds import (
    MIN_KEPT_BYTES,
    PLACEHOLDER_BYTES,
    RESULT_OVERHEAD,
    bound_for_cap,
    bound_results,
    clip_result,
    placeholder,
    results_budget,
    stored_bytes,
)
from agentrun.kernel.decision import clip_text
from agentrun.kernel.records import ToolResult

MARKER = "\n[agentrun: result truncated, {} more bytes]"


def test_stored_bytes_count_escapes_and_utf8_as_a_json_string_stores_them() -> None:
    cases = {"": 0, "a": 1, '"': 2, "\\": 2, "\n": 2, "\t": 2, "\x01": 6, "\x7f": 1}
    cases |= {"é": 2, "€": 3, "😀": 4, "\ud800": 3, 'a"b\n': 6}
    assert {text: stored_bytes(text) for text in cases} == cases


def test_a_text_that_fits_comes_back_whole_and_one_that_does_not_says_what_was_dropped() -> None:
    assert clip_result("hello", 5) == "hello"
    assert clip_result("hello", 4) == "hell" + MARKER.format(1)
    assert clip_result('"quoted"', 8) == '"quoted' + MARKER.format(1)  # a quote stores 2 bytes
    assert clip_result("ab😀cd", 5) == "ab" + MARKER.format(6)  # never inside the emoji
    assert clip_result("\x01" * 3, 17) == "\x01\x01" + MARKER.format(1)
    assert clip_result("abc", 0) == "" + MARKER.format(3)
    assert clip_result("abc", -5) == "" + MARKER.format(3)


texts = st.text(
    alphabet=st.sampled_from(["a", "b", '"', "\\", "\n", "\x01", "é", "€", "😀", "\ud800"]),
    max_size=40,
)


@settings(max_examples=500, deadline=None)
@given(texts, st.integers(-2, 120))
def test_the_cut_is_the_longest_prefix_that_fits(text: str, limit: int) -> None:
    clipped = clip_result(text, limit)
    if stored_bytes(text) <= limit:
        assert clipped == text
        return
    fits = max(k for k in range(len(text) + 1) if stored_bytes(text[:k]) <= limit or k == 0)
    dropped = len(text[fits:].encode("utf-8", "surrogatepass"))
    assert clipped == text[:fits] + MARKER.format(dropped)


# ------------------------------------------------------------------ a turn's results


def test_clip_text_keeps_the_longest_utf8_prefix_that_fits_and_names_the_bytes_cut() -> None:
    assert clip_text("hello", 5) == "hello"
    assert clip_text("hello", 3) == "hel\n[agentrun: cut, 2 more bytes]"
    assert clip_text("é" * 3, 5) == "éé\n[agentrun: cut, 2 more bytes]"  # not half an é
    assert clip_text("😀", 3) == "\n[agentrun: cut, 4 more bytes]"


@settings(max_examples=300, deadline=None)
@given(texts, st.integers(0, 120))
def test_clip_text_is_the_longest_whole_character_prefix_within_the_limit(
    text: str, limit: int
) -> None:
    data = text.encode("utf-8", "surrogatepass")
    clipped = clip_text(text, limit)
    if len(data) <= limit:
        assert clipped == text
        return
    fits = max(
        k for k in range(len(text) + 1) if len(text[:k].encode("utf-8", "surrogatepass")) <= limit
    )
    kept = text[:fits]
    cut = len(data) - len(kept.encode("utf-8", "surrogatepass"))
    assert clipped == f"{kept}\n[agentrun: cut, {cut} more bytes]"


def _size(results: tuple[ToolResult, ...]) -> int:
    return sum(
        RESULT_OVERHEAD
        + stored_bytes(r.tool_call_id)
        + stored_bytes(r.name)
        + stored_bytes(r.content)
        for r in results
    )


result_lists = st.lists(
    st.builds(
        ToolResult,
        tool_call_id=st.sampled_from(["c1", "call_2", "x"]),
        name=st.sampled_from(["srv__read", "t"]),
        content=st.builds(lambda piece, n: piece * n, texts, st.integers(0, 200)),
        is_error=st.booleans(),
    ),
    min_size=1,
    max_size=4,
)


@settings(max_examples=300, deadline=None)
@given(result_lists, st.integers(0, 12_000))
def test_results_are_kept_whole_in_order_then_cut_then_replaced_within_the_budget(
    results: list[ToolResult], extra: int
) -> None:
    floors = sum(
        RESULT_OVERHEAD + stored_bytes(r.tool_call_id) + stored_bytes(r.name)
        + min(stored_bytes(r.content), PLACEHOLDER_BYTES)
        for r in results
    )  # fmt: skip
    budget = floors + extra
    bounded = bound_results(results, budget=budget)
    if _size(tuple(results)) <= budget:
        assert bounded == tuple(results)
        return
    assert _size(bounded) <= budget
    assert [(r.tool_call_id, r.name, r.is_error, r.fault) for r in bounded] == [
        (r.tool_call_id, r.name, r.is_error, r.fault) for r in results
    ]
    first = next(i for i, (a, b) in enumerate(zip(bounded, results, strict=True)) if a != b)
    crossing, original = bounded[first].content, results[first].content
    if crossing.startswith("[agentrun: result dropped"):
        assert crossing == placeholder(stored_bytes(original), budget=budget)
    else:
        kept, _, marker = crossing.rpartition("\n")
        assert original.startswith(kept) and stored_bytes(kept) >= MIN_KEPT_BYTES - 200
        more = len(original.encode("utf-8", "surrogatepass")) - len(
            kept.encode("utf-8", "surrogatepass")
        )
        assert marker == (
            f"[agentrun: result cut, {more} more bytes: this turn's tool results reached their "
            f"cap of {budget} bytes]"
        )
    for later, was in zip(bounded[first + 1 :], results[first + 1 :], strict=True):
        size = stored_bytes(was.content)
        assert later.content == (
            was.content if size <= PLACEHOLDER_BYTES else placeholder(size, budget=budget)
        )


def _result(i: int, content: str) -> ToolResult:
    return ToolResult(f"c{i}", "t", content)


def _overhead(i: int) -> int:
    return RESULT_OVERHEAD + stored_bytes(f"c{i}") + stored_bytes("t")


def test_results_that_fill_the_budget_exactly_are_kept_whole() -> None:
    results = (_result(0, "a" * 3000), _result(1, "b" * 500))
    exact = _overhead(0) + 3000 + _overhead(1) + 500
    assert bound_results(results, budget=exact) == results
    assert bound_results(results, budget=exact - 1) != results


def test_a_result_that_fits_its_room_exactly_is_kept_whole() -> None:
    """The room of a result is the budget less what came before and the least the later ones
    need (their overhead and a placeholder's bytes each): a result of exactly that size stays
    whole, and the later one that no longer fits becomes its placeholder."""
    results = (_result(0, "a" * 3000), _result(1, "b" * 300))
    budget = _overhead(0) + 3000 + _overhead(1) + PLACEHOLDER_BYTES
    first, second = bound_results(results, budget=budget)
    assert first == results[0]
    assert second.content == placeholder(300, budget=budget)


def test_a_later_result_as_long_as_a_placeholder_is_kept_whole() -> None:
    results = (_result(0, "a" * 3000), _result(1, "b" * PLACEHOLDER_BYTES))
    results += (_result(2, "c" * (PLACEHOLDER_BYTES + 1)),)
    budget = 2000
    bounded = bound_results(results, budget=budget)
    assert bounded[1] == results[1]
    assert bounded[2].content == placeholder(PLACEHOLDER_BYTES + 1, budget=budget)


def test_a_crossing_result_with_exactly_the_least_room_is_cut_not_dropped() -> None:
    """``MIN_KEPT_BYTES`` of room is enough to keep a cut; one byte less is a placeholder. A
    text without escapes keeps its room less the 200 bytes the marker may take."""
    results = (_result(0, "a" * 5000),)
    budget = _overhead(0) + MIN_KEPT_BYTES
    [cut] = bound_results(results, budget=budget)
    kept = MIN_KEPT_BYTES - 200
    assert cut.content == "a" * kept + (
        f"\n[agentrun: result cut, {5000 - kept} more bytes: this turn's tool results reached "
        f"their cap of {budget} bytes]"
    )
    [dropped] = bound_results(results, budget=budget - 1)
    assert dropped.content == placeholder(5000, budget=budget - 1)


def test_a_crossing_result_of_escapes_and_lone_surrogates_is_cut_within_its_room() -> None:
    """Text that stores larger than it reads (two bytes a newline, three a lone surrogate)
    shrinks in proportion until it fits: never past the room, never a loop."""
    budget = _overhead(0) + 2000
    for text in ("\n" * 5000, "\ud800" * 3000, "a\n" * 2500):
        [cut] = bound_results((_result(0, text),), budget=budget)
        kept, _, marker = cut.content.rpartition("\n[agentrun: result cut, ")
        assert text.startswith(kept) and len(kept) > 0
        assert 2000 - 150 <= stored_bytes(cut.content) <= 2000
        assert marker.endswith(f"reached their cap of {budget} bytes]")


def test_a_resume_turn_s_results_have_the_whole_budget_no_reply_takes_a_byte_of_it() -> None:
    """At a cap of 128 KiB half the cap and what the reserve leaves are both 64 KiB: a resume
    turn (no model reply) may fill all of it."""
    cap = 131_072
    assert results_budget(cap) == 65_536
    whole = (_result(0, "a" * (65_536 - _overhead(0))),)
    assert bound_for_cap(whole, cap=cap, reply=None) == whole
    over = (_result(0, "a" * (65_537 - _overhead(0))),)
    assert bound_for_cap(over, cap=cap, reply=None) != over
