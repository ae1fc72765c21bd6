"""How a sharded operator process serves (``operator.main._serve``): kopf runs for the shards
held until the share changes; a stop signal once kopf runs ends the process, even when it
comes while a shard is being taken (kopf's own signal handling would take that stop for a
change of share, and the process would serve again). kopf itself is replaced by a stand-in
that does what the start-up handler and kopf do with the memo and the stop flag."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from typing import Any, ClassVar

import pytest

from agentrun.operator import main
from agentrun.operator.platform.leadership import LeaseTiming
from agentrun.operator.platform.shards import Plan
from agentrun.settings import OperatorSettings

RETRY = 0.01


class Leases:
    """The shard Leases as ``_serve`` reads them: every survey offers ``offer``."""

    def __init__(self, offer: Plan) -> None:
        self.offer = offer
        self.timing = LeaseTiming(duration=1.0, renew_deadline=0.6, retry=RETRY)
        self.surveys = 0

    async def survey(self, held: frozenset[int]) -> Plan:
        self.surveys += 1
        return self.offer


class Held:
    """``main._Held`` without Lease threads: records what is taken and given up."""

    def __init__(self, owned: set[int], offer: Plan) -> None:
        self._owned = set(owned)
        self.leases = Leases(offer)
        self.stopping = asyncio.Event()
        self.taken: list[int] = []
        self.given: list[int] = []

    @property
    def owned(self) -> frozenset[int]:
        return frozenset(self._owned)

    async def take(self, shards: Any) -> list[int]:
        won = list(shards)
        self._owned |= set(won)
        self.taken += won
        return won

    async def give(self, shards: Any) -> None:
        given = [s for s in shards if s in self._owned]
        self._owned -= set(given)
        self.given += given


def settings() -> OperatorSettings:
    return OperatorSettings(operator_shards=6)


async def test_a_stop_signal_while_a_shard_is_offered_stops_for_good(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The signal comes once kopf runs; shards are offered on every survey afterwards: kopf
    stops, nothing is taken, and ``_serve`` says not to serve again."""
    held = Held({0, 1}, Plan(take=(4,)))

    async def operator(*, memo: Any, stop_flag: asyncio.Event, **_: Any) -> None:
        assert memo.on_stop_signal is not None  # the start-up handler installs it
        memo.on_stop_signal()  # SIGTERM
        await asyncio.sleep(10 * RETRY)  # kopf's shutdown takes a while: surveys go on
        await stop_flag.wait()

    monkeypatch.setattr(main.kopf, "operator", operator)
    assert await main._serve(settings(), held) is False  # type: ignore[arg-type]
    assert held.taken == []
    assert held.stopping.is_set()


async def test_a_shard_offered_while_kopf_runs_restarts_it_for_the_new_share(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without a signal, a free shard is taken and kopf is stopped to serve the new share."""
    held = Held({0, 1}, Plan(take=(4,)))
    memos: list[Any] = []

    async def operator(*, memo: Any, stop_flag: asyncio.Event, **_: Any) -> None:
        memos.append(memo)
        await asyncio.wait_for(stop_flag.wait(), timeout=5)

    monkeypatch.setattr(main.kopf, "operator", operator)
    held.leases.offer = Plan(take=(4,))
    assert await main._serve(settings(), held) is True  # type: ignore[arg-type]
    assert held.taken == [4]
    assert memos[0].ownership.owned == frozenset({0, 1})  # the share kopf was started with
    assert not held.stopping.is_set()


async def test_kopf_stopping_by_itself_ends_the_serving(monkeypatch: pytest.MonkeyPatch) -> None:
    """kopf returned without the stop flag (its own failure, or a signal before the start-up
    handler ran): not served again."""
    held = Held({0}, Plan())

    async def operator(**_: Any) -> None:
        return None

    monkeypatch.setattr(main.kopf, "operator", operator)
    assert await main._serve(settings(), held) is False  # type: ignore[arg-type]


class Renewals:
    """``leadership.RenewalThread`` whose start blocks until released; records stops."""

    started = threading.Event()
    release = threading.Event()
    stopped: ClassVar[list[object]] = []

    def __init__(self, elector: object, **_: Any) -> None:
        self.elector = elector

    def start(self) -> None:
        Renewals.started.set()
        Renewals.release.wait(5)

    def stop(self) -> None:
        Renewals.stopped.append(self.elector)


class WonLeases:
    """Shard Leases that every take wins."""

    shards = 6

    def __init__(self) -> None:
        self.timing = LeaseTiming(duration=1.0, renew_deadline=0.6, retry=RETRY)

    def holder_seen(self, shard: int) -> str:
        return ""

    async def take(self, shard: int) -> bool:
        return True

    def handed_over(self, shard: int) -> object:
        return f"elector-{shard}"

    async def announce(self, shard: int, *, before: str) -> None:
        return None


async def test_a_take_cut_off_while_its_renewals_start_is_still_stopped_at_the_give(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A stop that cancels a take while its renewal thread starts: the shard counts as held,
    so giving everything up stops that thread too (it would renew the Lease on its own)."""
    monkeypatch.setattr(main.leadership, "RenewalThread", Renewals)
    held = main._Held(settings(), WonLeases())  # type: ignore[arg-type]
    taking = asyncio.create_task(held.take([4]))
    await asyncio.to_thread(Renewals.started.wait, 5)
    taking.cancel()
    Renewals.release.set()
    with contextlib.suppress(asyncio.CancelledError):
        await taking
    assert held.owned == frozenset({4})
    await held.give(list(held.owned))
    assert Renewals.stopped == ["elector-4"]
