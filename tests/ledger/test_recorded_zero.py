"""A model call whose usage recorded on its hold is 0 (a provider that answered with 0 prompt
and 0 completion tokens, or a progress record made before any token) has a usage recorded:
whoever drops its hold but its owner — the sweep, the turn resolved by another committer, the
run's close — charges that 0, never the call's prompt bound, which is only for a hold with
nothing recorded. A redelivery's reservation sets such a hold aside holding 0 and is
contested (that delivery may have committed the turn), and the delivery keeps its hold. The
hold's row carries the marker (``Hold.recorded``: its spend fields present, whatever they
hold) in both layouts, and a row written by an earlier release reads as it did. Pure (``now``
passed in).
"""

from __future__ import annotations

import base64
import json
import pathlib
from decimal import Decimal

import pytest

from agentrun.ledger import Book, codec
from agentrun.ledger.entries import TenantLimits

from .test_dead_holds import NOW, PROMPT, USED, admitted, ask, charged, stored

NOTHING = (0, Decimal(0), 0, Decimal(0))
"""Nothing used and nothing abandoned: what a tenant is charged for a call that used 0."""

EARLIER_RELEASE = json.loads(
    (pathlib.Path(__file__).parent / "upgrade/one_value_ledger.json").read_text()
)
"""What the earlier release's own code stored (``test_upgrade``)."""

RECORDS = pytest.mark.parametrize("answered", [True, False], ids=["answer", "progress"])
"""A usage of 0 recorded as the call's answer, or as what its response delivered so far."""


def record_zero(b: Book, owner: str, *, turn: int = 0, answered: bool = True) -> None:
    assert b.record_spend(
        f"r:{turn}", owner=owner, tokens=0, cost_usd=Decimal(0), answered=answered
    )


@RECORDS
def test_a_swept_hold_with_a_recorded_zero_is_charged_zero_not_its_prompt_bound(
    answered: bool,
) -> None:
    b = admitted()
    ask(b, "dead")
    record_zero(b, "dead", answered=answered)
    b = stored(b)
    assert b.holds["r:0"].recorded and b.holds["r:0"].dropped_charge == (0, Decimal(0))
    assert b.drop_hold("r:0", committed_turn=-1)
    assert charged(b) == NOTHING and b.reserved_tokens == 0 and b.charged == {}


def test_a_turn_resolved_by_another_committer_charges_its_recorded_zero() -> None:
    b = admitted()
    ask(b, "first")
    record_zero(b, "first")
    b = stored(b)
    ask(b, "next")
    assert b.resolve_turn("r", 0, committer="next") == 0
    b.settle("r", turn=0, tokens=USED[0], cost_usd=USED[1], now=NOW)
    assert charged(b) == (*USED, 0, Decimal(0)) and b.holds == {}


def test_a_hold_with_a_recorded_zero_is_set_aside_holding_zero_and_contests() -> None:
    """Its delivery may have committed the turn (its answer recorded), so the reservation is
    contested; the hold set aside holds 0, not its prompt bound, and its delivery, alive,
    keeps it: its refresh and its records land there."""
    b = admitted()
    ask(b, "first")
    record_zero(b, "first")
    b = stored(b)
    assert ask(b, "next").contested is True
    aside = stored(b).holds["r:0/first"]
    assert (aside.tokens, aside.cost_usd, aside.recorded) == (0, Decimal(0), True)
    assert b.reserved_tokens == 500
    assert b.refresh("r:0", owner="first", expires=NOW + 600)
    assert b.record_spend("r:0", owner="first", tokens=0, cost_usd=Decimal(0), answered=False)
    assert b.release("r:0", owner="next")  # the run moved on: stale, no call
    assert b.resolve_turn("r", 0, committer="first") == 0  # its commit: the run's call
    assert charged(b) == NOTHING and b.holds == {}


def test_a_runs_close_charges_a_recorded_zero_of_a_later_turn_nothing() -> None:
    b = admitted()
    ask(b, "w1", turn=1)
    record_zero(b, "w1", turn=1)
    b = stored(b)
    assert b.close("r", turn=0, tokens=30, cost_usd=Decimal("0.0001"), end=NOW, now=NOW)
    assert charged(b) == (30, Decimal("0.0001"), 0, Decimal(0)) and b.holds == {}


def test_a_slow_delivery_whose_recorded_zero_was_swept_leaves_charged_zero() -> None:
    """Its hold swept while it was slow (charged its 0, not its prompt bound), it leaves its
    turn uncommitted with that 0 recorded: nothing is charged, at the sweep or as it leaves."""
    b = admitted()
    ask(b, "slow")
    record_zero(b, "slow")
    assert b.drop_hold("r:0", committed_turn=-1)
    b = stored(b)
    assert not b.abandon("r:0", owner="slow", tokens=0, cost_usd=Decimal(0), now=NOW)
    assert charged(b) == NOTHING


def test_a_slow_delivery_swept_after_a_zero_progress_record_is_charged_its_answer_once() -> None:
    """Swept after a progress record of 0 (charged 0, nothing remembered), its answer's
    record finds no hold: it leaves charging all its call used, once."""
    b = admitted()
    ask(b, "slow")
    record_zero(b, "slow", answered=False)
    assert b.drop_hold("r:0", committed_turn=-1)
    assert not b.record_spend("r:0", owner="slow", tokens=USED[0], cost_usd=USED[1])
    b = stored(b)
    assert b.abandon("r:0", owner="slow", tokens=USED[0], cost_usd=USED[1], now=NOW,
                     unrecorded=True)  # fmt: skip
    assert charged(b) == (*USED, *USED)


@pytest.mark.parametrize("one_value", [True, False], ids=["single", "split"])
def test_a_recorded_zero_is_stored_as_the_rows_spend_fields_in_both_layouts(
    one_value: bool,
) -> None:
    b = Book.new("acme", TenantLimits(tokens=100_000), now=NOW, one_value=one_value)
    assert b.admit("r", "ns", "r", now=NOW) is None
    ask(b, "first")
    record_zero(b, "first")
    ask(b, "w1", turn=1)
    if one_value:
        data = codec.encode_one_value(b)
        rows, read = json.loads(data)["holds"], codec.decode_one_value(data)
    else:
        data = codec.encode_book(b)
        rows, read = json.loads(data)["runs"]["r"]["holds"], codec.decode_book(data)
    assert rows["r:0"][-2:] == [0, "0"] and len(rows["r:1"]) == len(rows["r:0"]) - 2
    assert read.holds["r:0"].recorded and not read.holds["r:1"].recorded
    assert read.holds["r:1"].dropped_charge == PROMPT


def test_rows_an_earlier_release_wrote_read_as_they_did() -> None:
    """The earlier release's one value (``upgrade/one_value_ledger.json``, written by its own
    code): a hold with spend fields is recorded, one without is not — charged nothing, as it
    carries no prompt bound. A split run entry as the release before this change wrote it:
    a row without spend fields beside its prompt bound is charged that bound."""
    old = codec.decode_one_value(base64.b64decode(EARLIER_RELEASE["values"]["book.acme"]))
    answered, unanswered = old.holds["run-30:0"], old.holds["run-33:0"]
    assert answered.recorded and answered.dropped_charge == (2100, Decimal("0.0021"))
    assert not unanswered.recorded and unanswered.dropped_charge == (0, Decimal(0))
    assert old.holds["run-31:0/3ac28671b59c4866"].recorded
    entry = (
        '{"v":3,"tenant":"acme","uid":"r","entry":{"holds":{'
        f'"r:0":[0,500,"0.00425",{NOW + 60},"w1"],'
        f'"r:1":[1,120,"0.0004",{NOW + 60},"w2",120,"0.0004"]}},'
        '"prompts":{"r:0":[100,"0.00025"],"r:1":[100,"0.00025"]}}}'
    )
    read = codec.decode_run(entry.encode(), uid="r")
    assert not read.holds["r:0"].recorded and read.holds["r:0"].dropped_charge == PROMPT
    assert read.holds["r:1"].recorded and read.holds["r:1"].dropped_charge == USED
