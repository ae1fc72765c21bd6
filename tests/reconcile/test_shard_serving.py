"""How a sharded operator process serves (``operator.main._serve``): kopf runs for the shards
held until the share changes; a stop signal ends the process whenever it comes: while a
shard is being taken, while kopf stops for a new share (kopf's own handler drops a signal
then, and the process would serve again), or during kopf's start-up (kopf's own stop, with
no share change meanwhile). kopf itself is replaced by a stand-in that does what kopf does
with signals, the memo and the stop flag (`kopf_like`)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from typing import Any, ClassVar

import kopf
import pytest

from agentrun import process
from agentrun.operator import main
from agentrun.operator.handlers import startup as startup_handlers
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


class Signals:
    """The event loop's SIGTERM handler, as ``process.stop_on_signals`` and kopf set it: the
    last one installed gets the signal."""

    def __init__(self) -> None:
        self.handler: Any = None

    def install(self, stop: Any) -> None:
        self.handler = stop

    def term(self) -> None:
        self.handler()


class Api:
    """The start-up handler's API client: closed if the start-up is stopped part-way."""

    async def close(self) -> None:
        return None


@pytest.fixture
def signals(monkeypatch: pytest.MonkeyPatch) -> Signals:
    found = Signals()
    monkeypatch.setattr(process, "stop_on_signals", found.install)
    return found


@pytest.fixture
def kopf_like(monkeypatch: pytest.MonkeyPatch, signals: Signals) -> Any:
    """A factory of stand-ins for ``kopf.operator`` that treat signals as kopf does and run
    the real start-up handler (``handlers.startup.start``; its API server and NATS calls
    replaced by ones that wait ``startup`` seconds): the start-up activity's first step runs,
    then kopf installs a handler of its own that sets a flag only the running operator reads;
    kopf stops on its stop flag or its own signal, and its shutdown takes ``shutdown``
    seconds (its wait for hung tasks), during which its own handler's flag is read by nobody.
    ``on_running(memo)`` is called once the start-up handler returned."""

    def make(*, startup: float, shutdown: float, on_running: Any = None) -> Any:
        async def connect() -> Api:
            return Api()

        async def list_tenants(api: Any) -> list[dict[str, Any]]:
            await asyncio.sleep(startup)
            return []

        async def start_parts(*args: Any, **kwargs: Any) -> object:
            await asyncio.sleep(0)
            return object()

        monkeypatch.setattr(startup_handlers.Kube, "connect", connect)
        monkeypatch.setattr(startup_handlers, "_list_tenants", list_tenants)
        monkeypatch.setattr(startup_handlers.wiring, "start_parts", start_parts)

        async def operator(*, memo: Any, stop_flag: asyncio.Event, **_: Any) -> None:
            own_signal = asyncio.Event()

            async def start_up() -> None:
                await startup_handlers.start(settings=kopf.OperatorSettings(), memo=memo)
                if on_running is not None:
                    on_running(memo)

            starting = asyncio.create_task(start_up())
            await asyncio.sleep(0)
            signals.install(own_signal.set)
            waits = [
                asyncio.create_task(stop_flag.wait()),
                asyncio.create_task(own_signal.wait()),
            ]
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            for task in (*waits, starting):
                task.cancel()
            await asyncio.sleep(shutdown)

        return operator

    return make


async def test_a_stop_signal_while_kopf_stops_for_a_new_share_stops_for_good(
    monkeypatch: pytest.MonkeyPatch, signals: Signals, kopf_like: Any
) -> None:
    """A free shard is taken, kopf stops to serve the new share, and SIGTERM comes during
    its shutdown: the process stops for good (kopf's own handler would drop it)."""
    held = Held({0, 1}, Plan(take=(4,)))

    async def operator(*, memo: Any, stop_flag: asyncio.Event, **kwargs: Any) -> None:
        run = kopf_like(startup=RETRY, shutdown=20 * RETRY)
        stopping = asyncio.create_task(run(memo=memo, stop_flag=stop_flag, **kwargs))
        await stop_flag.wait()  # the change of share
        signals.term()
        await stopping

    monkeypatch.setattr(main.kopf, "operator", operator)
    assert await main._serve(settings(), held) is False  # type: ignore[arg-type]
    assert held.stopping.is_set()
    assert held.taken == [4]
    assert signals.handler is main._already_stopping  # a second signal cannot cut the clean-up


async def test_a_stop_signal_while_a_shard_is_offered_stops_for_good(
    monkeypatch: pytest.MonkeyPatch, signals: Signals, kopf_like: Any
) -> None:
    """The signal comes once start-up ended; shards are offered on every survey afterwards:
    kopf stops, nothing is taken, and ``_serve`` says not to serve again."""
    held = Held({0, 1}, Plan(take=(4,)))
    operator = kopf_like(startup=0, shutdown=10 * RETRY, on_running=lambda _: signals.term())
    monkeypatch.setattr(main.kopf, "operator", operator)
    assert await main._serve(settings(), held) is False  # type: ignore[arg-type]
    assert held.taken == []
    assert held.stopping.is_set()


async def test_no_share_changes_before_start_up_ends_so_kopfs_own_stop_ends_the_serving(
    monkeypatch: pytest.MonkeyPatch, signals: Signals, kopf_like: Any
) -> None:
    """A signal during a slow start-up goes to kopf's own handler: kopf stops; no shard was
    taken meanwhile (surveys wait for the start-up), so the stop is not taken for a change."""
    held = Held({0, 1}, Plan(take=(4,)))

    async def operator(*, memo: Any, stop_flag: asyncio.Event, **kwargs: Any) -> None:
        run = kopf_like(startup=30 * RETRY, shutdown=10 * RETRY)
        running = asyncio.create_task(run(memo=memo, stop_flag=stop_flag, **kwargs))
        await asyncio.sleep(10 * RETRY)  # kopf's handler is in place, start-up still going
        signals.term()
        await running

    monkeypatch.setattr(main.kopf, "operator", operator)
    assert await main._serve(settings(), held) is False  # type: ignore[arg-type]
    assert held.taken == []
    assert held.leases.surveys == 0


async def test_a_shard_offered_while_kopf_runs_restarts_it_for_the_new_share(
    monkeypatch: pytest.MonkeyPatch, signals: Signals, kopf_like: Any
) -> None:
    """Without a signal, a free shard is taken and kopf is stopped to serve the new share."""
    held = Held({0, 1}, Plan(take=(4,)))
    memos: list[Any] = []
    operator = kopf_like(startup=0, shutdown=0, on_running=memos.append)
    monkeypatch.setattr(main.kopf, "operator", operator)
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
    Renewals.started.clear()
    Renewals.release.clear()
    Renewals.stopped.clear()
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
