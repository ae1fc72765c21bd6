"""The checks of tenants' schemas run on threads of their own, in turn per tenant: one
tenant's thousand new schemas wait behind each other, not in front of another tenant's one."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from agentrun.operator.platform.fairwork import FairWork


class Recorder:
    """Blocking jobs that record the order they start in; the first ones wait for ``go``."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.go = threading.Event()
        self.lock = threading.Lock()

    def job(self, name: str, *, hold: bool = True) -> str:
        with self.lock:
            self.started.append(name)
        if hold:
            assert self.go.wait(5), "never let go"
        return name


async def until(predicate: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition never held"
        await asyncio.sleep(0.005)


async def test_a_party_flooding_waits_behind_itself_and_another_goes_next() -> None:
    work, seen = FairWork(threads=1), Recorder()
    flood = [asyncio.create_task(work.run("noisy", seen.job, f"noisy-{i}")) for i in range(20)]
    await until(lambda: seen.started == ["noisy-0"] and work.waiting == 19)
    quiet = asyncio.create_task(work.run("quiet", seen.job, "quiet-0"))
    await until(lambda: work.waiting == 20)
    seen.go.set()
    assert await quiet == "quiet-0"
    assert await asyncio.gather(*flood) == [f"noisy-{i}" for i in range(20)]
    assert seen.started[:3] == ["noisy-0", "noisy-1", "quiet-0"]  # noisy's next was queued first
    assert [s for s in seen.started if s.startswith("noisy")] == [f"noisy-{i}" for i in range(20)]
    work.close()


async def test_parties_take_turns_round_robin() -> None:
    work, seen = FairWork(threads=1), Recorder()
    first = asyncio.create_task(work.run("a", seen.job, "a-0"))
    await until(lambda: seen.started == ["a-0"])
    tasks = [
        asyncio.create_task(work.run(party, seen.job, f"{party}-{i}", hold=False))
        for party, count in (("a", 3), ("b", 3), ("c", 1))
        for i in range(1, count + 1)
    ]
    await until(lambda: work.waiting == 7)
    seen.go.set()
    await asyncio.gather(first, *tasks)
    assert seen.started == ["a-0", "a-1", "b-1", "c-1", "a-2", "b-2", "a-3", "b-3"]
    work.close()


async def test_the_namespaces_of_one_tenant_share_its_turn() -> None:
    tenant_of = {"big-1": "tenant/big", "big-2": "tenant/big", "other": "other"}
    work, seen = FairWork(threads=1, party=tenant_of.__getitem__), Recorder()
    first = asyncio.create_task(work.run("big-1", seen.job, "big-1/0"))
    await until(lambda: seen.started == ["big-1/0"])
    flood = [
        asyncio.create_task(work.run(ns, seen.job, f"{ns}/{i}", hold=False))
        for i in range(1, 6)
        for ns in ("big-1", "big-2")
    ]
    other = asyncio.create_task(work.run("other", seen.job, "other/0", hold=False))
    await until(lambda: work.waiting == 11)
    seen.go.set()
    await asyncio.gather(first, other, *flood)
    assert seen.started.index("other/0") == 2  # after the one running and the tenant's next


async def test_threads_run_at_once_up_to_their_number_and_no_more() -> None:
    work = FairWork(threads=2)
    running, most, lock, go = 0, 0, threading.Lock(), threading.Event()

    def job() -> None:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        go.wait(5)
        with lock:
            running -= 1

    tasks = [asyncio.create_task(work.run(f"ns-{i % 3}", job)) for i in range(9)]
    await until(lambda: running == 2 and work.waiting == 7)
    go.set()
    await asyncio.gather(*tasks)
    assert most == 2
    work.close()


async def test_an_error_is_raised_to_its_caller_and_frees_the_thread() -> None:
    work = FairWork(threads=1)

    def fails() -> None:
        raise ValueError("bad schema")

    with pytest.raises(ValueError, match="bad schema"):
        await work.run("ns", fails)
    assert await asyncio.wait_for(work.run("ns", lambda: 7), 2) == 7
    work.close()


async def test_a_check_cancelled_while_waiting_is_dropped_and_takes_no_thread() -> None:
    work, seen = FairWork(threads=1), Recorder()
    running = asyncio.create_task(work.run("a", seen.job, "a-0"))
    await until(lambda: seen.started == ["a-0"])
    dropped = asyncio.create_task(work.run("b", seen.job, "b-0", hold=False))
    kept = asyncio.create_task(work.run("c", seen.job, "c-0", hold=False))
    await until(lambda: work.waiting == 2)
    dropped.cancel()
    await asyncio.gather(dropped, return_exceptions=True)
    assert work.waiting == 1
    seen.go.set()
    assert await kept == "c-0"
    await running
    assert seen.started == ["a-0", "c-0"]
    assert await asyncio.wait_for(work.run("d", lambda: "free"), 2) == "free"
    work.close()


async def test_a_check_cancelled_while_running_keeps_its_thread_until_it_ends() -> None:
    work, seen = FairWork(threads=1), Recorder()
    running = asyncio.create_task(work.run("a", seen.job, "a-0"))
    await until(lambda: seen.started == ["a-0"])
    running.cancel()
    await asyncio.gather(running, return_exceptions=True)
    waiting = asyncio.create_task(work.run("b", seen.job, "b-0", hold=False))
    await asyncio.sleep(0.1)
    assert seen.started == ["a-0"]  # the thread still runs the cancelled check
    seen.go.set()
    assert await asyncio.wait_for(waiting, 2) == "b-0"
    work.close()


def test_it_needs_a_thread() -> None:
    with pytest.raises(ValueError, match="at least one thread"):
        FairWork(threads=0)
