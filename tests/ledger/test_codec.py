"""The ledger's JSON (``agentrun.ledger.codec``), pinned: what a tenant's ledger looks like in KV
in both layouts, byte for byte (a release that reads these must find these names and row
orders, and a rolling upgrade has both releases reading each other's values), every field
coming back as written, values of earlier releases read with their defaults, malformed values
refused as ``LedgerCorrupt``, and ``split``'s rules for where each run's entry lives.

Pure: no NATS (the store's use of these values is tested against a real server in
``test_store.py`` and ``test_layout.py``)."""

from __future__ import annotations

import dataclasses
import json
from decimal import Decimal

import pytest

from agentrun.ledger import Active, Book, Hold, TenantLimits, codec
from agentrun.ledger.entries import FIRST_WAITERS, LedgerCorrupt, RunEntry, Waiter

HOUR = 3_600.0
T0 = 1_700_000_000.0 - 1_700_000_000.0 % HOUR
"""The start of an hour window: 2023-11-14 22:00:00 UTC."""
LIMITS = TenantLimits(
    tokens=10_000,
    cost_usd=Decimal("2.5"),
    wall_seconds=600.0,
    window_seconds=HOUR,
    max_concurrent_runs=4,
)


def full_book(*, one_value: bool) -> Book:
    """A ledger using every field the JSON carries: used with abandoned and credited parts, an
    edited window end, an active run with a hold waiting for its answer (with its call's prompt
    bound) and one answered (held by an earlier release: no prompt bound), a
    waiting call, a call charged as abandoned with what it was charged, a run remembered as
    ended, and a hold of a run that is no longer active; the active run's slot names its life
    (a second: rerun once)."""
    b = Book(tenant="acme", limits=LIMITS, window=T0, end=T0 + 2 * HOUR, one_value=one_value)
    b.used_tokens, b.used_cost, b.used_wall = 1_200, Decimal("0.125"), 42.5
    b.abandoned_tokens, b.abandoned_cost = 300, Decimal("0.03")
    b.credited_tokens, b.credited_cost = 20, Decimal("0.002")
    b.start_run("r1", Active("ns-a", "run-one", T0 + 10.0, 2, 900, Decimal("0.09"), life=1))
    waiting = Hold("r1", 3, 500, Decimal("0.05"), T0 + 70.0, "w1", "ns-a", "run-one")
    b.put_hold("r1:3", waiting.holding(500, Decimal("0.05"), prompt=(180, Decimal("0.018"))))
    # answered as an earlier release recorded it: the hold still its worst case, not its spend
    answered = Hold("r1", 2, 400, Decimal("0.04"), T0 + 60.0, "w2", "ns-a", "run-one", 350)
    b.put_hold("r1:2", dataclasses.replace(answered, spent_cost=Decimal("0.035"), recorded=True))
    b.put_hold("r4:1", Hold("r4", 1, 100, Decimal("0.01"), T0 + 65.0, "w3"))
    b.put_waiter("r2:0", Waiter(T0 + 20.0, 250, Decimal("0.025"), T0 + 30.0))
    b.load_memo("r1:1/w9", T0 + 3_700.0)
    b.load_spent("r1:1/w9", 120, Decimal("0.012"))
    b.load_end("r3", T0 + 3_650.0)
    return b


ONE_VALUE_JSON = (
    '{"v":2,"tenant":"acme",'
    '"limits":{"tokens":10000,"costUSD":"2.5","wallClockSeconds":600.0,"windowSeconds":3600.0,'
    '"maxConcurrentRuns":4},'
    f'"window":{T0},'
    '"used":{"tokens":1200,"costUSD":"0.125","wallClockSeconds":42.5,"abandonedTokens":300,'
    '"abandonedCostUSD":"0.03","creditedTokens":20,"creditedCostUSD":"0.002"},'
    '"holds":{'
    f'"r1:3":["r1",3,500,"0.05",{T0 + 70.0},"w1"],'
    f'"r1:2":["r1",2,400,"0.04",{T0 + 60.0},"w2",350,"0.035"],'
    f'"r4:1":["r4",1,100,"0.01",{T0 + 65.0},"w3"]}},'
    f'"active":{{"r1":["ns-a","run-one",{T0 + 10.0},2,900,"0.09"]}},'
    f'"waiting":{{"r2:0":[{T0 + 20.0},250,"0.025",{T0 + 30.0}]}},'
    f'"charged":{{"r1:1/w9":{T0 + 3_700.0}}},'
    f'"end":{T0 + 2 * HOUR},'
    '"spent":{"r1:1/w9":[120,"0.012"]},'
    f'"ended":{{"r3":{T0 + 3_650.0}}},'
    '"lives":{"r1":1},'
    '"prompts":{"r1:3":[180,"0.018"]}}'
)
"""``full_book`` as a ``single`` tenant's one value (format 2): the layout every earlier
release reads, its optional fields left out when empty."""


def test_a_one_value_ledger_is_written_in_format_2_with_these_names_and_row_orders() -> None:
    assert codec.encode_one_value(full_book(one_value=True)).decode() == ONE_VALUE_JSON


def test_a_one_value_ledger_leaves_out_what_earlier_releases_never_wrote_while_empty() -> None:
    fresh = Book.new("acme", TenantLimits(), now=T0 + 5.0, one_value=True)
    assert fresh.one_value and not Book.new("acme", TenantLimits(), now=T0).one_value
    assert json.loads(codec.encode_one_value(fresh)) == {
        "v": 2,
        "tenant": "acme",
        "limits": {
            "tokens": None,
            "costUSD": None,
            "wallClockSeconds": None,
            "windowSeconds": 86_400.0,
            "maxConcurrentRuns": None,
        },
        "window": T0 - T0 % 86_400.0,
        "used": {
            "tokens": 0,
            "costUSD": "0",
            "wallClockSeconds": 0.0,
            "abandonedTokens": 0,
            "abandonedCostUSD": "0",
        },
        "holds": {},
        "active": {},
        "end": T0 - T0 % 86_400.0 + 86_400.0,
    }


def test_a_one_value_ledger_reads_back_exactly_as_it_was() -> None:
    written = full_book(one_value=True)
    read = codec.decode_one_value(ONE_VALUE_JSON.encode())
    assert read == written
    assert (read.reserved_tokens, read.reserved_cost) == (1_000, Decimal("0.10"))
    assert (read.active_runs, read.since_offsets) == (1, 10.0)
    answered = Hold("r1", 2, 400, Decimal("0.04"), T0 + 60.0, "w2", "ns-a", "run-one", 350)
    answered.spent_cost, answered.recorded = Decimal("0.035"), True
    assert read.hold("r1:2") == answered  # the hold's place comes from its run's slot
    assert read.hold("r4:1") == Hold("r4", 1, 100, Decimal("0.01"), T0 + 65.0, "w3", "", "")
    assert read.runs["r3"].ended == T0 + 3_650.0 and read.runs["r1"].spent == {
        "r1:1/w9": (120, Decimal("0.012"))
    }
    assert codec.decode_totals(ONE_VALUE_JSON.encode()) == codec.Totals(
        written, frozenset(), one_value=True
    )


def test_a_one_value_ledger_of_an_earlier_release_reads_with_the_defaults() -> None:
    earlier = json.loads(ONE_VALUE_JSON)
    for later in ("end", "spent", "ended", "lives", "prompts"):
        del earlier[later]
    for later in ("creditedTokens", "creditedCostUSD"):
        del earlier["used"][later]
    read = codec.decode_one_value(json.dumps(earlier).encode())
    assert read.end == T0 + HOUR  # the window plus its length
    assert (read.credited_tokens, read.credited_cost) == (0, Decimal(0))
    assert "r3" not in read.runs and read.runs["r1"].spent == {}
    assert read.charged == {"r1:1/w9": T0 + 3_700.0}
    assert read.active["r1"].life is None  # a slot of an earlier release: its life not known
    assert read.hold("r1:3").prompt_tokens == 0  # type: ignore[union-attr]  # charged nothing


def test_the_oldest_waiting_calls_of_a_one_value_ledger_are_its_first_whatever_the_key_order() -> (
    None
):
    value = json.loads(ONE_VALUE_JSON)
    count = FIRST_WAITERS + 3
    # keys ordered against their age ("w00" waits the shortest); two share a moment
    value["waiting"] = {
        f"w{i:02d}:0": [T0 + 100.0 - i, 10, "0.001", T0 + 900.0] for i in range(count)
    }
    value["waiting"]["w01:0"][0] = value["waiting"]["w02:0"][0] = T0 + 50.0
    read = codec.decode_one_value(json.dumps(value).encode())
    assert len(read.waiting) == count
    by_age = sorted(value["waiting"], key=lambda k: (value["waiting"][k][0], k))
    assert list(read.first_waiters) == by_age[:FIRST_WAITERS]


TOTALS_JSON = (
    '{"v":3,"tenant":"acme",'
    '"limits":{"tokens":10000,"costUSD":"2.5","wallClockSeconds":600.0,"windowSeconds":3600.0,'
    '"maxConcurrentRuns":4},'
    f'"window":{T0},'
    '"used":{"tokens":1200,"costUSD":"0.125","wallClockSeconds":42.5,"abandonedTokens":300,'
    '"abandonedCostUSD":"0.03","creditedTokens":20,"creditedCostUSD":"0.002"},'
    '"reserved":{"tokens":1000,"costUSD":"0.10"},'
    '"active":{"runs":1,"sinceOffsets":10.0},'
    f'"firstWaiters":{{"r2:0":[{T0 + 20.0},250,"0.025",{T0 + 30.0}]}},'
    '"runs":{"r1":{'
    f'"active":["ns-a","run-one",{T0 + 10.0},2,900,"0.09"],'
    f'"holds":{{"r1:3":[3,500,"0.05",{T0 + 70.0},"w1"],'
    f'"r1:2":[2,400,"0.04",{T0 + 60.0},"w2",350,"0.035"]}},'
    '"waiting":{},'
    f'"charged":{{"r1:1/w9":{T0 + 3_700.0}}},'
    '"spent":{"r1:1/w9":[120,"0.012"]},'
    '"ended":0.0,"life":1,'
    '"prompts":{"r1:3":[180,"0.018"]}}},'
    f'"end":{T0 + 2 * HOUR}}}'
)
"""``full_book``'s totals (format 3) with run ``r1`` inline: the totals carry the sums, the
first waiting calls and the inline runs' entries; every other run is a value of its own."""


def test_split_totals_are_written_in_format_3_with_these_names_and_row_orders() -> None:
    assert codec.encode_totals(full_book(one_value=False), inline={"r1"}).decode() == TOTALS_JSON


def test_a_run_apart_is_written_as_its_own_value_and_read_back_only_as_that_run() -> None:
    b = full_book(one_value=False)
    assert (
        codec.encode_run(b, "r4")
        == (
            '{"v":3,"tenant":"acme","uid":"r4","entry":{"active":null,'
            f'"holds":{{"r4:1":[1,100,"0.01",{T0 + 65.0},"w3"]}},'
            '"waiting":{},"charged":{},"spent":{},"ended":0.0,"life":null,"prompts":{}}}'
        ).encode()
    )
    for uid in ("r1", "r2", "r3", "r4"):
        value = codec.encode_run(b, uid)
        assert value is not None
        assert codec.decode_run(value, uid=uid) == b.runs[uid]
    with pytest.raises(LedgerCorrupt, match="the ledger entry stored for run r9 is run r4's"):
        codec.decode_run(codec.encode_run(b, "r4") or b"", uid="r9")
    assert codec.encode_run(b, "nobody") is None
    b.load("r5", RunEntry())
    assert codec.encode_run(b, "r5") is None  # an empty entry: its value can go


def test_split_totals_read_back_with_their_inline_runs_and_the_runs_apart_are_not_loaded() -> None:
    written = full_book(one_value=False)
    totals = codec.decode_totals(TOTALS_JSON.encode())
    assert totals.inline == frozenset({"r1"}) and not totals.one_value
    read = totals.book
    assert set(read.runs) == {"r1"}
    assert read.runs["r1"] == written.runs["r1"]
    for field in dataclasses.fields(Book):
        if field.name != "runs":
            assert getattr(read, field.name) == getattr(written, field.name), field.name
    everything = codec.decode_book(codec.encode_book(written))
    assert everything == written


def test_split_totals_of_an_earlier_release_read_with_the_defaults() -> None:
    earlier = json.loads(TOTALS_JSON)
    del earlier["end"], earlier["firstWaiters"], earlier["runs"]
    del earlier["used"]["creditedTokens"], earlier["used"]["creditedCostUSD"]
    read = codec.decode_totals(json.dumps(earlier).encode())
    assert read.inline == frozenset() and read.book.runs == {}
    assert read.book.end == T0 + HOUR
    assert read.book.first_waiters == {}
    assert (read.book.credited_tokens, read.book.credited_cost) == (0, Decimal(0))


def test_a_run_entry_of_an_earlier_release_reads_with_its_slot_s_life_not_known() -> None:
    """A run's entry written (or rewritten) by a release that kept no lives has none: its
    slot is taken for any life's (``Active.life`` ``None``)."""
    earlier = json.loads(TOTALS_JSON)
    del earlier["runs"]["r1"]["life"]
    read = codec.decode_totals(json.dumps(earlier).encode()).book
    assert read.active["r1"] == dataclasses.replace(
        full_book(one_value=False).active["r1"], life=None
    )


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (b"not json", "malformed ledger totals"),
        (b'{"v":4}', "malformed ledger totals"),
        (TOTALS_JSON.replace('"tokens":1200', '"tokens":"many"').encode(), "used.tokens"),
        (TOTALS_JSON.replace('"costUSD":"0.10"', '"costUSD":"ten cents"').encode(), "reserved"),
        (TOTALS_JSON.replace('"w1"]', '"w1",1]').encode(), "holds"),
        (ONE_VALUE_JSON.replace('"tenant":"acme",', "").encode(), "malformed ledger entry"),
        (ONE_VALUE_JSON.replace('"r4",1,100', '"r4",1,"x"').encode(), "malformed ledger entry"),
    ],
    ids=["not JSON", "another format", "a count", "a decimal", "a row", "one value", "a row"],
)
def test_a_malformed_value_is_refused_as_corrupt_naming_what(value: bytes, message: str) -> None:
    with pytest.raises(LedgerCorrupt, match=message):
        codec.decode_totals(value)


def test_a_malformed_run_value_is_refused_as_corrupt_naming_the_run() -> None:
    with pytest.raises(LedgerCorrupt, match="malformed ledger entry of run r4"):
        codec.decode_run(b'{"v":3,"tenant":"acme","uid":"r4"}', uid="r4")


def test_only_a_format_2_value_is_taken_for_a_one_value_ledger() -> None:
    assert codec.is_one_value(ONE_VALUE_JSON.encode())
    assert not codec.is_one_value(TOTALS_JSON.encode())
    assert not codec.is_one_value(b'{"v":20,"tenant":"acme"}')
    assert not codec.is_one_value(b' {"v":2,"tenant":"acme"}')


# ------------------------------------------------------------------------------------ split


def book_with(*uids: str) -> Book:
    """A split ledger with an active run for each of ``uids``."""
    b = Book(tenant="acme", limits=LIMITS, window=T0)
    for uid in uids:
        b.start_run(uid, Active("ns", f"name-{uid}", T0 + 1.0))
    return b


def test_a_new_run_goes_inline_while_there_is_room_then_into_a_value_of_its_own() -> None:
    b = book_with("a", "b", "c")
    laid = codec.split(b, inline={"a"}, stored={"b": None, "c": None}, room=2)
    assert laid.inline == frozenset({"a", "b"})  # in uid order: b takes the last place
    assert laid.runs == {"c": codec.encode_run(b, "c")}
    assert codec.decode_totals(laid.totals).inline == frozenset({"a", "b"})
    assert codec.decode_totals(laid.totals).book.runs == {"a": b.runs["a"], "b": b.runs["b"]}


def test_a_run_keeps_where_it_is_and_a_run_apart_stays_apart_whatever_the_room() -> None:
    b = book_with("a", "b")
    stored = {"b": codec.encode_run(b, "b")}
    laid = codec.split(b, inline={"a"}, stored=stored, room=10)
    assert laid.inline == frozenset({"a"}) and laid.runs == {"b": codec.encode_run(b, "b")}


def test_an_emptied_entry_goes_and_frees_its_place() -> None:
    b = book_with("a", "b")
    b.load("a-gone-inline", RunEntry())  # sorts before the runs after it, which still count
    b.load("gone-apart", RunEntry())
    laid = codec.split(
        b, inline={"a", "a-gone-inline"}, stored={"b": None, "gone-apart": b"old"}, room=3
    )
    assert laid.inline == frozenset({"a", "b"})
    assert laid.runs == {"gone-apart": None}  # its stored value is deleted


def test_an_inline_run_left_with_only_the_memory_that_it_ended_moves_apart() -> None:
    b = book_with("a")
    b.load("done", RunEntry(ended=T0 + 3_000.0))
    laid = codec.split(b, inline={"a", "done"}, stored={}, room=2)
    assert laid.inline == frozenset({"a"})
    assert laid.runs == {"done": codec.encode_run(b, "done")}
    assert codec.decode_run(laid.runs["done"] or b"", uid="done").ended == T0 + 3_000.0


def test_a_change_to_a_run_it_did_not_name_is_refused() -> None:
    b = book_with("a", "stranger")
    with pytest.raises(ValueError, match="touched run stranger without naming it"):
        codec.split(b, inline={"a"}, stored={}, room=5)
    b.runs["stranger"] = RunEntry()  # an empty entry it did not name is simply not written
    assert codec.split(b, inline={"a"}, stored={}, room=5).runs == {}
    b.start_run("z", Active("ns", "z", T0))  # a run after it in uid order still counts
    laid = codec.split(b, inline={"a"}, stored={"z": b"old"}, room=5)
    assert laid.runs == {"z": codec.encode_run(b, "z")}
