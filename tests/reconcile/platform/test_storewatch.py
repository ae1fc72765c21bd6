"""Noticing the NATS store lost: the pure rule (``judge``) and the loop that applies it."""

from __future__ import annotations

import asyncio
import datetime
import subprocess
import sys
from collections.abc import Mapping

import pytest

from agentrun.operator.platform.storewatch import STORE_LOST_EXIT, Created, StoreWatch, judge

T0 = datetime.datetime(2026, 12, 1, 10, 0, tzinfo=datetime.UTC)
T1 = T0 + datetime.timedelta(hours=3)
WATCHED = ("TURNS", "EVENTS", "KV_LEDGER")
START = {"TURNS": T0, "EVENTS": T0, "KV_LEDGER": T0}


def test_the_same_streams_with_their_creation_times_are_the_same_store() -> None:
    assert judge(START, dict(START), WATCHED) is None


def test_a_missing_stream_or_bucket_is_named() -> None:
    seen = {"EVENTS": T0}
    assert str(judge(START, seen, WATCHED)) == "missing: TURNS, KV_LEDGER"


def test_a_stream_made_anew_under_the_same_name_is_named() -> None:
    seen = {"TURNS": T1, "EVENTS": T1, "KV_LEDGER": T0}
    assert str(judge(START, seen, WATCHED)) == "made anew since the operator started: TURNS, EVENTS"


def test_both_are_reported_together() -> None:
    seen = {"TURNS": T1}
    assert str(judge(START, seen, WATCHED)) == (
        "missing: EVENTS, KV_LEDGER; made anew since the operator started: TURNS"
    )


def test_a_creation_time_the_server_does_not_report_is_not_compared() -> None:
    assert judge({**START, "TURNS": None}, {**START, "TURNS": T1}, WATCHED) is None
    assert judge(START, {**START, "TURNS": None}, WATCHED) is None


class Store:
    """A scripted probe: each call answers the next of ``answers`` (an exception is raised),
    the last one for ever; records the calls."""

    def __init__(self, *answers: Mapping[str, Created] | Exception) -> None:
        self.answers = list(answers)
        self.calls = 0

    async def __call__(self) -> Mapping[str, Created]:
        answer = self.answers[min(self.calls, len(self.answers) - 1)]
        self.calls += 1
        if isinstance(answer, Exception):
            raise answer
        return answer


async def watch_until(store: Store, *, calls: int) -> list[str]:
    """Run a StoreWatch on ``store`` (probing every 1 ms) until it reported or ``store`` was
    asked ``calls`` times; what it reported."""
    lost: list[str] = []
    watch = StoreWatch(store, WATCHED, on_lost=lost.append, interval=0.001)
    task = asyncio.create_task(watch.run())
    async with asyncio.timeout(10):
        while not task.done() and store.calls < calls:
            await asyncio.sleep(0.001)
    watch.stop()
    await task
    return lost


async def test_an_intact_store_through_a_nats_outage_is_never_reported() -> None:
    outage = TimeoutError("nats: timeout")
    store = Store(START, outage, ConnectionError("no servers"), outage, START)
    assert await watch_until(store, calls=50) == []


async def test_an_outage_before_the_first_answer_takes_the_baseline_after_it() -> None:
    store = Store(TimeoutError(), {"TURNS": T1, "EVENTS": T1, "KV_LEDGER": T1})
    assert await watch_until(store, calls=50) == []


async def test_a_stream_made_anew_after_an_outage_is_reported_once_at_once() -> None:
    store = Store(START, TimeoutError(), {**START, "EVENTS": T1})
    assert await watch_until(store, calls=1000) == ["made anew since the operator started: EVENTS"]
    assert store.calls == 3


async def test_a_missing_stream_is_reported_when_two_probes_in_a_row_miss_it() -> None:
    gone = {"TURNS": T0, "EVENTS": T0}
    store = Store(START, gone, START, gone, TimeoutError(), gone, gone)
    assert await watch_until(store, calls=1000) == ["missing: KV_LEDGER"]
    assert store.calls == 7  # a single miss (calls 2 and 4), then a miss, an outage, a miss


async def test_a_stream_missing_at_the_first_answer_is_reported_too() -> None:
    store = Store({"TURNS": T0})
    assert await watch_until(store, calls=1000) == ["missing: EVENTS, KV_LEDGER"]
    assert store.calls == 2


async def test_stop_ends_the_watch_between_probes() -> None:
    store = Store(START)
    watch = StoreWatch(store, WATCHED, on_lost=pytest.fail, interval=30.0)
    task = asyncio.create_task(watch.run())
    await asyncio.sleep(0.05)
    watch.stop()
    async with asyncio.timeout(5):
        await task
    assert store.calls == 1


def test_the_exit_status_is_not_the_lost_lease_one() -> None:
    from agentrun.operator.main import LOST_LEADERSHIP_EXIT

    assert STORE_LOST_EXIT not in (0, 1, LOST_LEADERSHIP_EXIT)


def test_the_exit_logs_one_error_naming_what_was_seen_and_ends_the_process_at_once() -> None:
    code = (
        "import logging, sys; logging.basicConfig(stream=sys.stderr, level=logging.INFO);"
        "from agentrun.operator.platform.storewatch import exit_store_lost;"
        "exit_store_lost('missing: KV_AGENTRUN_LEDGER'); print('returned')"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == STORE_LOST_EXIT
    assert "returned" not in done.stdout
    errors = [line for line in done.stderr.splitlines() if line.startswith("ERROR")]
    assert len(errors) == 1
    assert "store this operator started on is gone (missing: KV_AGENTRUN_LEDGER)" in errors[0]
