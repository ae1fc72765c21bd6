"""An answered call's hold holds what the call used (``BookState.record_spend``): the budget's
edges between a model call's answer and its turn's settlement — another run's call fits exactly
as it would after the settlement, and a call that used more than its worst case is held for all
of it."""

from __future__ import annotations

from decimal import Decimal

from agentrun.ledger import Book, Hold, TenantLimits

from .conftest import NOW

LIMIT = 1_000


def pure_book() -> Book:
    b = Book(tenant="acme", limits=TenantLimits(tokens=LIMIT), window=NOW - 60)
    for uid in ("r1", "r2"):
        assert b.admit(uid, "ns", uid, now=NOW) is None
    return b


def hold(uid: str, turn: int, tokens: int, owner: str) -> Hold:
    return Hold(uid, turn, tokens, Decimal(0), NOW + 60, owner, "ns", uid)


def test_an_answered_hold_holds_what_its_call_used_so_another_call_fits_as_after_settlement() -> (
    None
):
    b = pure_book()
    assert b.reserve("r1:0", hold("r1", 0, 800, "w1"), now=NOW) is None
    assert b.reserve("r2:0", hold("r2", 0, 701, "w2"), now=NOW) is not None  # 800 + 701 > 1000
    assert b.record_spend("r1:0", owner="w1", tokens=300, cost_usd=Decimal(0))
    assert (b.used_tokens, b.reserved_tokens) == (0, 300)
    assert b.reserve("r2:0", hold("r2", 0, 701, "w2"), now=NOW) is not None  # 300 + 701
    assert b.reserve("r2:0", hold("r2", 0, 700, "w2"), now=NOW) is None  # exactly the limit
    # the settlement the next reservation makes moves the 300 from reserved to used
    b.catch_up("r1", turn=0, tokens=300, cost_usd=Decimal(0), now=NOW)
    assert (b.used_tokens, b.reserved_tokens) == (300, 700)
    assert b.totals_mismatch() == []


def test_a_call_that_used_more_than_its_worst_case_is_held_for_all_it_used() -> None:
    b = pure_book()
    assert b.reserve("r1:0", hold("r1", 0, 400, "w1"), now=NOW) is None
    # the provider counted 500 prompt tokens it was not sent
    assert b.record_spend("r1:0", owner="w1", tokens=900, cost_usd=Decimal(0))
    assert b.reserved_tokens == 900
    assert b.reserve("r2:0", hold("r2", 0, 101, "w2"), now=NOW) is not None
    assert b.reserve("r2:0", hold("r2", 0, 100, "w2"), now=NOW) is None
    assert b.totals_mismatch() == []


def test_a_spend_recorded_by_another_owner_changes_nothing() -> None:
    b = pure_book()
    assert b.reserve("r1:0", hold("r1", 0, 400, "w1"), now=NOW) is None
    assert not b.record_spend("r1:0", owner="w9", tokens=100, cost_usd=Decimal(0))
    assert (b.reserved_tokens, b.hold("r1:0").tokens) == (400, 400)  # type: ignore[union-attr]
