"""Leader election on a Lease: one holder at a time, takeover only after the Lease stood still
for its duration, a leader that cannot renew gives up before a standby may start."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import threading
import time
from collections.abc import Awaitable, Callable

import pytest

from agentrun.operator.platform import leadership
from agentrun.operator.platform.leadership import (
    LeaderElector,
    LeaseConflict,
    LeaseRecord,
    LeaseTiming,
)

TIMING = LeaseTiming(duration=10.0, renew_deadline=6.0, retry=1.0)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class MemoryLeases:
    """One Lease with optimistic concurrency on its version, as the API server keeps it."""

    def __init__(self) -> None:
        self.record: LeaseRecord | None = None
        self.version = 0
        self.failing = False

    async def read(self) -> LeaseRecord | None:
        if self.failing:
            raise OSError("API server away")
        return self.record

    async def create(self, record: LeaseRecord) -> LeaseRecord:
        if self.record is not None:
            raise LeaseConflict("exists")
        return self._store(record)

    async def update(self, record: LeaseRecord) -> LeaseRecord:
        if self.failing:
            raise OSError("API server away")
        if self.record is None or record.version != self.record.version:
            raise LeaseConflict("moved on")
        return self._store(record)

    def _store(self, record: LeaseRecord) -> LeaseRecord:
        self.version += 1
        self.record = dataclasses.replace(record, version=str(self.version))
        return self.record


def pair() -> tuple[MemoryLeases, Clock, LeaderElector, LeaderElector]:
    store, clock = MemoryLeases(), Clock()
    a = LeaderElector(store, identity="a", timing=TIMING, clock=clock)
    b = LeaderElector(store, identity="b", timing=TIMING, clock=clock)
    return store, clock, a, b


async def test_the_first_process_creates_the_lease_and_the_second_stands_by() -> None:
    store, _, a, b = pair()
    assert await a.try_acquire_or_renew()
    assert not await b.try_acquire_or_renew()
    assert store.record is not None and store.record.holder == "a"
    assert a.leading and not b.leading


async def test_a_standby_takes_over_only_after_the_lease_stood_still_for_its_duration() -> None:
    store, clock, a, b = pair()
    assert await a.try_acquire_or_renew()
    assert not await b.try_acquire_or_renew()  # b starts observing now
    clock.now += 9.9  # a died: no renewal since
    assert not await b.try_acquire_or_renew()
    clock.now += 0.2
    assert await b.try_acquire_or_renew()
    assert store.record is not None
    assert (store.record.holder, store.record.transitions) == ("b", 1)


async def test_a_renewing_leader_keeps_the_lease_however_long_it_runs() -> None:
    _, clock, a, b = pair()
    assert await a.try_acquire_or_renew()
    for _ in range(30):
        clock.now += TIMING.retry
        assert await a.try_acquire_or_renew()
        assert not await b.try_acquire_or_renew()


async def test_a_standby_that_never_saw_the_lease_change_waits_a_full_duration() -> None:
    """Clocks are never compared: a standby started long after the holder died still waits
    the Lease duration on its own clock before it takes over."""
    _, clock, a, b = pair()
    assert await a.try_acquire_or_renew()
    clock.now += 3600
    assert not await b.try_acquire_or_renew()
    clock.now += TIMING.duration
    assert await b.try_acquire_or_renew()


async def test_two_standbys_racing_for_an_expired_lease_cannot_both_win() -> None:
    store, clock, a, b = pair()
    c = LeaderElector(store, identity="c", timing=TIMING, clock=clock)
    assert await a.try_acquire_or_renew()
    assert not await b.try_acquire_or_renew()
    assert not await c.try_acquire_or_renew()
    clock.now += TIMING.duration + 1
    stale_read = await store.read()
    assert await b.try_acquire_or_renew()
    assert stale_read is not None
    with pytest.raises(LeaseConflict):  # c's update on the version it read loses
        await store.update(dataclasses.replace(stale_read, holder="c"))
    assert not await c.try_acquire_or_renew()  # and c now sees b's fresh renewal
    assert store.record is not None and store.record.holder == "b"


async def test_a_released_lease_is_taken_at_once() -> None:
    store, _, a, b = pair()
    assert await a.try_acquire_or_renew()
    assert not await b.try_acquire_or_renew()
    await a.release()
    assert store.record is not None and store.record.holder == ""
    assert await b.try_acquire_or_renew()


async def test_a_renewal_applied_unseen_does_not_stop_the_release() -> None:
    """A renewal cut off in flight was written, but the leader never saw its version: the
    release reads the Lease again and still hands it over at once."""
    store, _, a, b = pair()
    assert await a.try_acquire_or_renew()
    assert store.record is not None
    await store.update(store.record)  # a's renewal, applied while a was cancelled
    await a.release()
    assert store.record is not None and store.record.holder == ""
    assert await b.try_acquire_or_renew()


async def test_a_lease_taken_by_another_is_not_released() -> None:
    store, _, a, _ = pair()
    assert await a.try_acquire_or_renew()
    assert store.record is not None
    await store.update(dataclasses.replace(store.record, holder="c"))
    await a.release()
    assert store.record is not None and store.record.holder == "c"


async def test_the_leader_gives_up_before_any_standby_may_take_over(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Renewals fail: ``hold`` returns after the renew deadline, which is shorter than the
    Lease duration a standby waits."""
    store, clock, a, _ = pair()
    assert await a.try_acquire_or_renew()
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        clock.now += seconds

    monkeypatch.setattr(leadership.asyncio, "sleep", sleep)
    store.failing = True
    await a.hold()
    assert TIMING.renew_deadline <= sum(slept) < TIMING.duration


async def test_the_leader_stops_holding_when_another_process_holds_the_lease(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store, clock, a, _ = pair()
    assert await a.try_acquire_or_renew()

    async def sleep(seconds: float) -> None:
        clock.now += seconds
        assert store.record is not None
        store._store(dataclasses.replace(store.record, holder="intruder"))

    monkeypatch.setattr(leadership.asyncio, "sleep", sleep)
    await a.hold()
    assert not a.leading


def test_micro_time_always_has_six_fraction_digits() -> None:
    import datetime

    moment = datetime.datetime(2026, 11, 30, 12, 0, 0, tzinfo=datetime.UTC)
    assert leadership.micro_time(moment) == "2026-11-30T12:00:00.000000Z"


async def test_a_hung_renewal_does_not_outlive_the_renew_deadline() -> None:
    """The API server accepts the connection and never answers: ``hold`` still returns by
    the renew deadline (real time, short timings)."""
    timing = LeaseTiming(duration=1.0, renew_deadline=0.5, retry=0.1)
    store = MemoryLeases()
    leader = LeaderElector(store, identity="a", timing=timing)
    assert await leader.try_acquire_or_renew()

    async def hang() -> LeaseRecord | None:
        await asyncio.Event().wait()
        return None

    store.read = hang  # type: ignore[method-assign]
    started = time.monotonic()
    async with asyncio.timeout(5):
        await leader.hold()
    assert time.monotonic() - started < timing.duration


class ThreadSafeLeases(MemoryLeases):
    """``MemoryLeases`` read and written from two threads (the renewal thread, the test)."""

    def __init__(self) -> None:
        super().__init__()
        self.lock = threading.Lock()
        self.renewed: list[float] = []
        """When each update landed (monotonic seconds)."""

    async def update(self, record: LeaseRecord) -> LeaseRecord:
        with self.lock:
            written = await super().update(record)
            self.renewed.append(time.monotonic())
            return written

    def longest_gap(self, since: float) -> float:
        """The longest time from ``since`` to now without a renewal."""
        times = [since, *(t for t in self.renewed if t > since), time.monotonic()]
        return max(b - a for a, b in itertools.pairwise(times))


FAST = LeaseTiming(duration=1.5, renew_deadline=0.6, retry=0.1)


async def test_a_busy_event_loop_lets_the_lease_lapse_unless_it_is_renewed_from_a_thread() -> None:
    """A burst of work holding the operator's event loop for longer than the Lease's duration
    (here: 3 x 0.6 s without yielding): renewals from a task on that loop stop meanwhile, so a
    standby could take the Lease over while this leader still acts; ``RenewalThread`` renews
    on its own loop all along, and releases the Lease when stopped."""
    store = ThreadSafeLeases()
    on_loop = LeaderElector(store, identity="a", timing=FAST)
    assert await on_loop.try_acquire_or_renew()
    holding = asyncio.create_task(on_loop.hold())
    await asyncio.sleep(2 * FAST.retry)
    start = time.monotonic()
    time.sleep(3 * FAST.renew_deadline)  # the event loop busy: no renewal can run
    assert store.longest_gap(start) > FAST.duration  # the Lease lapsed: a standby may lead
    holding.cancel()
    await asyncio.gather(holding, return_exceptions=True)

    store = ThreadSafeLeases()
    elector = LeaderElector(store, identity="a", timing=FAST)
    assert await elector.try_acquire_or_renew()
    lost = threading.Event()
    closed: list[bool] = []

    async def connect() -> tuple[leadership.LeaseStore, Callable[[], Awaitable[None]]]:
        async def close() -> None:
            closed.append(True)

        return store, close

    renewals = leadership.RenewalThread(elector, connect=connect, on_lost=lost.set)
    await asyncio.to_thread(renewals.start)
    start = time.monotonic()
    time.sleep(3 * FAST.renew_deadline)  # the same burst
    assert not lost.is_set()
    # renewed every 0.1 s; a busy machine may delay the thread, far less than the deadline
    assert store.longest_gap(start) < FAST.renew_deadline
    await asyncio.to_thread(renewals.stop)
    assert store.record is not None and store.record.holder == "" and closed == [True]
    assert not lost.is_set()


async def test_a_renewal_thread_that_loses_the_lease_says_so_from_its_thread() -> None:
    store = ThreadSafeLeases()
    elector = LeaderElector(store, identity="a", timing=FAST)
    assert await elector.try_acquire_or_renew()
    lost = threading.Event()

    async def connect() -> tuple[leadership.LeaseStore, Callable[[], Awaitable[None]]]:
        async def close() -> None:
            return None

        return store, close

    renewals = leadership.RenewalThread(elector, connect=connect, on_lost=lost.set)
    await asyncio.to_thread(renewals.start)
    store.failing = True  # the API server away: no renewal
    assert await asyncio.to_thread(lost.wait, 10 * FAST.renew_deadline)
    await asyncio.to_thread(renewals.stop)


async def test_a_renewal_thread_without_a_client_ends_leadership() -> None:
    elector = LeaderElector(ThreadSafeLeases(), identity="a", timing=FAST)
    lost = threading.Event()

    async def connect() -> tuple[leadership.LeaseStore, Callable[[], Awaitable[None]]]:
        raise OSError("no kubeconfig")

    renewals = leadership.RenewalThread(elector, connect=connect, on_lost=lost.set)
    await asyncio.to_thread(renewals.start)
    assert lost.is_set()
    await asyncio.to_thread(renewals.stop)


async def test_peek_judges_the_lease_as_a_takeover_would_and_writes_nothing() -> None:
    store, clock, a, b = pair()
    assert await b.peek() == ""  # no Lease yet
    assert await a.try_acquire_or_renew()
    version = store.version
    assert await b.peek() == "a" and await a.peek() == "a"
    clock.now += TIMING.duration - 0.1
    assert await b.peek() == "a"  # unchanged, but not for its duration yet
    clock.now += 0.2
    assert await b.peek() == ""  # stood still for its duration on b's clock: free
    assert store.version == version  # peeking wrote nothing
    assert await b.try_acquire_or_renew()  # and the takeover agrees
    await b.release()
    assert await a.peek() == ""  # released: free at once
