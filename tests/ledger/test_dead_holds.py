"""A model call whose hold is dropped with nothing recorded on it, by anyone but its owner: its
worker died (SIGKILL, OOM, a lost node) after its reservation and before the call's first
record, so its request most likely went out and the provider billed its prompt. The hold
carries the call's prompt bound (``Hold.prompt_tokens``, set by ``Book.reserve_call``), and
whoever drops it — the sweep of expired holds, the turn resolved once its committer is known
(after a redelivery set it aside), the run's close — charges that bound as abandoned, once;
a delivery that was only slow is charged what its call used beyond it, has it taken back when
its turn commits by it or when its call never answered; the owner's own release charges
nothing; a hold of no model call (the admission's) is never charged. Pure (``now`` passed in).
"""

from __future__ import annotations

from decimal import Decimal

import pytest

from agentrun import kernel
from agentrun.ledger import Book, CallNeed, Granted, Hold, codec
from agentrun.ledger.entries import TenantLimits

NOW = 19_675 * 86_400.0 + 3_600.0
PRICING = kernel.Pricing(Decimal("2.50"), Decimal("1.25"), Decimal("10"))
"""USD per 1M input / cached input / output tokens."""
CALL = CallNeed(100, 400, PRICING, min_output_tokens=128)
"""A call whose prompt's bound is 100 tokens (0.00025 USD) and worst case 500 (0.00425)."""
PROMPT = (100, Decimal("0.00025"))
"""What that call is charged when its hold is dropped unrecorded: its prompt's bound."""
USED = (120, Decimal("0.0004"))
"""What that call used when it answered."""


def admitted(*, first_call: int = 0) -> Book:
    """Run ``r`` admitted; with ``first_call``, holding that many tokens for its first call
    (``r:admission``) until a worker reserves it."""
    b = Book.new("acme", TenantLimits(tokens=100_000), now=NOW)
    assert b.admit("r", "ns", "r", now=NOW, need_tokens=first_call) is None
    return b


def ask(b: Book, owner: str, *, turn: int = 0, now: float = NOW) -> Granted:
    hold = Hold("r", turn, 0, Decimal(0), now + 60, owner, "ns", "r")
    granted = b.reserve_call(f"r:{turn}", CALL, hold, now=now)
    assert isinstance(granted, Granted)
    return granted


def charged(b: Book) -> tuple[int, Decimal, int, Decimal]:
    return b.used_tokens, b.used_cost, b.abandoned_tokens, b.abandoned_cost


def stored(b: Book) -> Book:
    """``b`` as the store writes and reads it back (each change is applied to a fresh copy)."""
    return codec.decode_book(codec.encode_book(b))


def test_a_held_call_carries_its_prompt_bound_and_the_admission_hold_none() -> None:
    b = admitted(first_call=228)
    assert b.holds["r:admission"].dropped_charge == (0, Decimal(0))
    ask(b, "w1")
    held = stored(b).holds["r:0"]
    assert (held.prompt_tokens, held.prompt_cost) == PROMPT
    assert held.dropped_charge == PROMPT and (held.tokens, held.cost_usd) == (
        500,
        Decimal("0.00425"),
    )


def test_a_dead_workers_unrecorded_hold_swept_is_charged_its_prompt_bound_once() -> None:
    b = admitted()
    ask(b, "w1")
    assert b.drop_hold("r:0", committed_turn=-1)
    b = stored(b)
    assert not b.drop_hold("r:0", committed_turn=-1)  # a second sweep finds nothing
    assert charged(b) == (*PROMPT, *PROMPT)
    assert b.runs["r"].spent == {"r:0/w1": PROMPT} and b.reserved_tokens == 0


def test_an_unrecorded_hold_of_a_committed_turn_is_dropped_uncharged() -> None:
    """Its turn is in the run's usage (its committer's spend write was lost): charged there."""
    b = admitted()
    ask(b, "w1", turn=2)
    assert b.drop_hold("r:2", committed_turn=2)
    assert charged(b) == (0, Decimal(0), 0, Decimal(0))


def test_a_hold_of_no_model_call_is_never_charged() -> None:
    """The admission's hold (turn -1, no prompt) at a close that committed nothing, and a hold
    reserved without a call's prompt (``Book.reserve``, as an earlier release's)."""
    b = admitted(first_call=228)
    assert b.reserve("r:1", Hold("r", 1, 300, Decimal("0.003"), NOW + 60, "old"), now=NOW) is None
    assert b.close("r", turn=-1, tokens=0, cost_usd=Decimal(0), end=NOW, now=NOW)
    assert charged(b) == (0, Decimal(0), 0, Decimal(0)) and b.holds == {}


def test_a_runs_close_charges_its_unrecorded_hold_of_a_later_turn_its_prompt_bound() -> None:
    b = admitted()
    ask(b, "w1", turn=1)
    assert b.close("r", turn=0, tokens=30, cost_usd=Decimal("0.0001"), end=NOW, now=NOW)
    assert charged(b) == (130, Decimal("0.00035"), *PROMPT)


def test_a_set_aside_unrecorded_hold_is_charged_once_when_its_turn_resolves() -> None:
    """A redelivery reserves while the first delivery's hold holds no record: it is set aside
    (uncontested: that delivery cannot have committed an answer it never recorded), holding
    its prompt's bound; resolved by the redelivery as committer, it is charged that, once,
    however many parties resolve or sweep the turn after, in whichever order."""
    b = admitted()
    ask(b, "dead")
    assert ask(b, "next").contested is False
    aside = stored(b).holds["r:0/dead"]
    assert (aside.tokens, aside.cost_usd, aside.recorded) == (*PROMPT, False)
    assert b.reserved_tokens == 100 + 500
    assert b.resolve_turn("r", 0, committer="next") == 1
    b = stored(b)
    assert b.resolve_turn("r", 0, committer="next") == 0  # the next turn's reservation
    assert not b.drop_hold("r:0/dead", committed_turn=0)  # the sweep, or the close
    b.settle("r", turn=0, tokens=120, cost_usd=Decimal("0.0004"), now=NOW)
    assert charged(b) == (220, Decimal("0.00065"), *PROMPT) and b.holds == {}


def test_a_set_aside_unrecorded_hold_swept_before_its_turn_resolves_is_charged_once() -> None:
    b = admitted()
    ask(b, "dead")
    ask(b, "next")
    assert b.drop_hold("r:0/dead", committed_turn=-1)  # expired: nothing committed yet
    assert b.resolve_turn("r", 0, committer="next") == 0
    assert charged(b) == (*PROMPT, *PROMPT)


def test_a_set_aside_hold_of_the_turns_committer_is_not_charged() -> None:
    """The first delivery committed (its spend write lost), then died: its call is the run's."""
    b = admitted()
    ask(b, "first")
    ask(b, "next")
    assert b.release("r:0", owner="next")  # the run moved on: no call
    assert b.resolve_turn("r", 0, committer="first") == 0
    assert charged(b) == (0, Decimal(0), 0, Decimal(0)) and b.holds == {}


def test_an_alive_delivery_set_aside_records_its_answer_there_and_is_charged_that() -> None:
    b = admitted()
    ask(b, "slow")
    ask(b, "next")
    assert b.record_spend("r:0", owner="slow", tokens=USED[0], cost_usd=USED[1])
    assert b.resolve_turn("r", 0, committer="next") == 1
    assert charged(b) == (*USED, *USED)


def test_an_alive_delivery_whose_unrecorded_hold_was_charged_is_charged_only_the_rest() -> None:
    """Resolved while its call was in flight (charged its prompt's bound), it answers, its
    record finds no hold, and it leaves uncommitted: charged what it used beyond the bound."""
    b = admitted()
    ask(b, "slow")
    ask(b, "next")
    assert b.resolve_turn("r", 0, committer="next") == 1
    assert not b.record_spend("r:0", owner="slow", tokens=USED[0], cost_usd=USED[1])
    b = stored(b)
    assert b.abandon("r:0", owner="slow", tokens=USED[0], cost_usd=USED[1], now=NOW,
                     unrecorded=True)  # fmt: skip
    assert not b.abandon("r:0", owner="slow", tokens=USED[0], cost_usd=USED[1], now=NOW,
                         unrecorded=True)  # fmt: skip
    assert charged(b) == (*USED, *USED)


def test_an_alive_delivery_whose_hold_was_swept_and_which_commits_is_not_charged_twice() -> None:
    b = admitted()
    ask(b, "slow")
    assert b.drop_hold("r:0", committed_turn=-1)  # its refreshes did not land
    assert charged(b) == (*PROMPT, *PROMPT)
    assert b.resolve_turn("r", 0, committer="slow") == 0  # its commit's settlement
    b.settle("r", turn=0, tokens=USED[0], cost_usd=USED[1], now=NOW)
    assert charged(b) == (*USED, 0, Decimal(0))
    assert (b.credited_tokens, b.credited_cost) == PROMPT


def test_a_live_workers_call_that_never_connected_is_charged_nothing() -> None:
    """Its own release drops its hold uncharged, also one set aside for it."""
    b = admitted()
    ask(b, "w1")
    assert not b.release("r:0", owner="other")
    assert b.release("r:0", owner="w1")
    ask(b, "w1", turn=1)
    ask(b, "w2", turn=1)
    assert b.release("r:1", owner="w1")  # set aside by w2's reservation
    assert list(b.holds) == ["r:1"] and b.holds["r:1"].owner == "w2"
    assert charged(b) == (0, Decimal(0), 0, Decimal(0))


@pytest.mark.parametrize("ended", [False, True], ids=["run-active", "run-closed"])
def test_a_slow_workers_release_takes_back_the_prompt_charged_when_its_hold_dropped(
    ended: bool,
) -> None:
    """Its hold swept (or dropped by the run's close) while it was slow, charged its prompt's
    bound; then its call fails to connect and it releases: the call was never made."""
    b = admitted()
    ask(b, "slow", turn=1)
    if ended:
        assert b.close("r", turn=0, tokens=0, cost_usd=Decimal(0), end=NOW, now=NOW)
    else:
        assert b.drop_hold("r:1", committed_turn=0)
    assert charged(b) == (*PROMPT, *PROMPT)
    b = stored(b)
    assert not b.release("r:1", owner="slow")
    assert not b.release("r:1", owner="slow")  # once
    assert charged(b) == (0, Decimal(0), 0, Decimal(0))
    assert (b.credited_tokens, b.credited_cost) == PROMPT


def test_an_unrecorded_hold_without_a_prompt_bound_is_replaced_not_set_aside() -> None:
    """A hold written by an earlier release carries no prompt bound: a redelivery's
    reservation replaces it, as before, and nothing is charged for it."""
    b = admitted()
    assert b.reserve("r:0", Hold("r", 0, 300, Decimal("0.003"), NOW + 60, "old"), now=NOW) is None
    assert ask(b, "next").contested is False
    assert list(b.holds) == ["r:0"] and b.reserved_tokens == 500
    assert b.resolve_turn("r", 0, committer="next") == 0
    assert charged(b) == (0, Decimal(0), 0, Decimal(0))


def test_a_free_models_unrecorded_hold_is_still_charged_its_prompt_tokens() -> None:
    """A model without prices (a token budget only): its prompt's bound costs 0 USD, and its
    tokens are still set aside, charged, and taken back."""
    b = admitted()
    free = CallNeed(100, 400, kernel.Pricing(Decimal(0), Decimal(0), Decimal(0)))
    hold = Hold("r", 0, 0, Decimal(0), NOW + 60, "dead", "ns", "r")
    assert isinstance(b.reserve_call("r:0", free, hold, now=NOW), Granted)
    ask(b, "next")
    assert b.holds["r:0/dead"].dropped_charge == (100, Decimal(0))
    assert b.resolve_turn("r", 0, committer="next") == 1
    assert charged(b) == (100, Decimal(0), 100, Decimal(0))
    assert not b.release("r:0", owner="dead")  # its call never connected, after all
    assert charged(b) == (0, Decimal(0), 0, Decimal(0))


def test_a_release_without_an_owner_drops_only_a_hold_under_its_key() -> None:
    b = admitted()
    ask(b, "w1")
    ask(b, "w2")  # w1's set aside
    assert not b.release("r:1")
    assert b.release("r:0") and list(b.holds) == ["r:0/w1"]
    assert not b.release("r:0")
    assert charged(b) == (0, Decimal(0), 0, Decimal(0))


def test_a_delivery_set_aside_unrecorded_is_told_its_hold_is_gone_until_it_records() -> None:
    """Set aside with nothing recorded, the hold holds its call's prompt bound only, not its
    worst case: the delivery's refresh says it has none (it stops its call), and the expiry
    stays; once its call's answer is recorded there, the refresh keeps it alive."""
    b = admitted()
    ask(b, "slow")
    ask(b, "next")
    assert not b.refresh("r:0", owner="slow", expires=NOW + 600)
    assert b.holds["r:0/slow"].expires == NOW + 60
    assert b.refresh("r:0", owner="next", expires=NOW + 600)
    assert b.record_spend("r:0", owner="slow", tokens=USED[0], cost_usd=USED[1])
    assert b.refresh("r:0", owner="slow", expires=NOW + 600)
    assert b.holds["r:0/slow"].expires == NOW + 600
    assert not b.refresh("r:0", owner="nobody", expires=NOW + 600)


def test_resolving_a_turn_counts_only_the_calls_it_charged() -> None:
    """Another delivery's hold with nothing to charge (no record, no prompt bound: an earlier
    release's) is dropped, not counted."""
    b = admitted()
    assert b.reserve("r:0", Hold("r", 0, 300, Decimal("0.003"), NOW + 60, "old"), now=NOW) is None
    assert b.resolve_turn("r", 0, committer="next") == 0
    assert b.holds == {} and charged(b) == (0, Decimal(0), 0, Decimal(0))


def test_a_delivery_set_aside_unrecorded_records_no_progress_there_and_stops() -> None:
    """What a response delivered so far, recorded on a hold set aside with nothing recorded
    (which holds only the call's prompt bound), would let the call stream on with its worst
    case no longer held: refused, so the delivery stops its call, charging what it used as
    it leaves; its answer is recorded there."""
    b = admitted()
    ask(b, "slow")
    ask(b, "next")
    progress = (150, Decimal("0.00075"))
    assert not b.record_spend(
        "r:0", owner="slow", tokens=progress[0], cost_usd=progress[1], answered=False
    )
    assert not b.refresh("r:0", owner="slow", expires=NOW + 600)
    assert b.abandon("r:0", owner="slow", tokens=progress[0], cost_usd=progress[1], now=NOW)
    assert charged(b) == (*progress, *progress)
    assert b.resolve_turn("r", 0, committer="next") == 0  # charged once


def test_a_take_back_after_the_window_rolled_leaves_the_charge_in_its_window() -> None:
    """The sweep charged a slow delivery's unrecorded hold its prompt bound; the window
    rolled (the memo outlives it); the delivery's call never connected and it releases:
    the charge stays in the window it was made in, never taken out of the new window's
    ``used`` (below the runs' usage, here below 0)."""
    b = Book.new("acme", TenantLimits(tokens=100_000, window_seconds=600.0), now=NOW)
    assert b.admit("r", "ns", "r", now=NOW) is None
    ask(b, "slow", turn=1)
    assert b.drop_hold("r:1", committed_turn=0)  # swept expired
    assert charged(b) == (*PROMPT, *PROMPT)
    assert b.roll(b.end + 1.0)
    b = stored(b)
    assert not b.release("r:1", owner="slow")
    assert charged(b) == (0, Decimal(0), 0, Decimal(0))
    assert not b.uncharge("r:1/slow")  # nor when its turn turns out committed by it


DEAR = CallNeed(50, 400, kernel.Pricing(Decimal(100), Decimal(50), Decimal(100)))
"""A call of a dearer model: a prompt bound of fewer tokens (50) that cost more (0.005 USD)."""
CHEAP = CallNeed(200, 400, kernel.Pricing(Decimal("0.1"), Decimal("0.05"), Decimal("0.4")))
"""A call of a cheaper model: a prompt bound of more tokens (200) that cost less (0.00002)."""


@pytest.mark.parametrize("need", [DEAR, CHEAP], ids=["fewer-tokens", "less-cost"])
def test_a_take_back_after_the_window_rolled_leaves_a_new_windows_charge_of_another_model(
    need: CallNeed,
) -> None:
    """As above, with a call charged as abandoned in the new window too, holding more of the
    old charge's cost but fewer of its tokens, or the other way round: the old charge is not
    this window's, and nothing of the new one is taken back."""
    b = Book.new("acme", TenantLimits(tokens=100_000, window_seconds=600.0), now=NOW)
    assert b.admit("r", "ns", "r", now=NOW) is None
    ask(b, "slow", turn=1)
    assert b.drop_hold("r:1", committed_turn=0)
    now = b.end + 1.0
    assert b.roll(now)
    hold = Hold("r", 2, 0, Decimal(0), now + 60, "other", "ns", "r")
    assert isinstance(b.reserve_call("r:2", need, hold, now=now), Granted)
    new = b.holds["r:2"].dropped_charge
    assert (new[0] < PROMPT[0]) != (new[1] < PROMPT[1])  # one more, the other less
    assert b.drop_hold("r:2", committed_turn=1)
    assert not stored(b).release("r:1", owner="slow")
    assert not b.release("r:1", owner="slow")
    assert charged(b) == (*new, *new)


def test_a_set_aside_unrecorded_hold_keeps_its_prompt_bound_in_both_layouts() -> None:
    for one_value in (True, False):
        b = Book.new("acme", TenantLimits(tokens=100_000), now=NOW, one_value=one_value)
        assert b.admit("r", "ns", "r", now=NOW) is None
        ask(b, "dead")
        ask(b, "next")
        if one_value:
            read = codec.decode_one_value(codec.encode_one_value(b))
        else:
            read = codec.decode_book(codec.encode_book(b))
        assert read.holds["r:0/dead"].dropped_charge == PROMPT
        assert (read.holds["r:0"].prompt_tokens, read.holds["r:0"].prompt_cost) == PROMPT
        assert read.resolve_turn("r", 0, committer="next") == 1
        assert charged(read) == (*PROMPT, *PROMPT)
