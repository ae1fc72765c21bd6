"""The tenant ledger under concurrency: 3 tenants × 50 concurrent runs on 3 worker processes.

The scripted model reports known usage (100 + 20 tokens per call, three calls per run). After
every run has ended, for each tenant: settled usage ≤ its limit, exactly the sum of its runs'
own ``.status.usage``, and no reservation or active slot remains. The second test SIGKILLs a
worker mid-way: same invariants, except that a call the killed worker had made and not
committed is charged as abandoned (spent at the provider, in no run's usage): its usage if it
was recorded, else its prompt's bound (the request the scripted model received, answered or
not), never more than those requests allow; and no hold outlives its expiry by more than the
sweep bound.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator, Sequence
from decimal import Decimal
from typing import Any

import nats
import pytest

from agentrun.ledger import Book, Hold, LedgerStore, TenantLimits
from agentrun_dev import components, stack
from agentrun_dev.kubectl import create_namespace, delete_namespace

from .conftest import (
    HOLD_TTL,
    LEDGER_SWEEP,
    E2EStack,
    apply_all,
    apply_tenant,
    named_runs,
    run_manifest,
    tenants_of,
)
from .test_tenants import append_scenario

pytestmark = [pytest.mark.e2e, pytest.mark.long]

RUNS_PER_TENANT = 50
TOKENS_LIMIT = 9_000
"""Tenant "tokens": 50 runs want 18,000 tokens; the limit stops about half."""
COST_LIMIT = Decimal("0.05")
"""Tenant "cost": 50 runs want $0.0675 (each call $0.00045 at the mock model's prices)."""
CONCURRENT_LIMIT = 8
"""Tenant "slots": no budget pressure, 8 runs at a time, the rest queue."""
GOAL = "E2E-LEDGER invariant "
"""Each run's goal: this, then its ``namespace/name`` (to count the calls answered for it)."""
CALL_TOKENS = 120
"""Each model call's usage in the scenario (100 prompt + 20 completion)."""


class Ledger:
    """Reads tenant books straight from JetStream KV (what the workers and operator share)."""

    def __init__(self, server: Any) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.nc: Any = self._run(nats.connect(**server.client_options()))
        self.store: LedgerStore = self._run(LedgerStore.open(self.nc.jetstream()))

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=30)

    def book(self, tenant: str) -> Book | None:
        found: Book | None = self._run(self.store.read(tenant))
        return found

    def settled(self, tenant: str, *, timeout: float) -> Book:
        """Tenant ``tenant``'s book once no run is active in it and it holds nothing (the
        last settlements land right after the last status); fails after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while True:
            book = self.book(tenant)
            assert book is not None
            if not book.active and not book.holds:
                return book
            assert time.monotonic() < deadline, f"{tenant}: left {book.active} {book.holds}"
            time.sleep(0.5)

    def close(self) -> None:
        self._run(self.nc.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)


@pytest.fixture
def ledger(nats_server: Any) -> Iterator[Ledger]:
    handle = Ledger(nats_server)
    yield handle
    handle.close()


@pytest.fixture
def third_worker(stack_: E2EStack) -> Iterator[components.Component]:
    worker = stack.start_worker(3, env=stack_.env, launch=stack_.launch)
    yield worker
    components.stop_component(worker)


@pytest.fixture
def tenants(stack_: E2EStack) -> Iterator[dict[str, tuple[str, str]]]:
    """role → (AgentTenant name, its namespace)."""
    specs: dict[str, dict[str, Any]] = {
        # whenExhausted Fail: runs that can no longer start end at once instead of waiting
        # Queued for tomorrow's window (test_tenants.py covers Queue)
        "tokens": {"budget": {"tokens": TOKENS_LIMIT}, "whenExhausted": "Fail"},
        "cost": {"budget": {"costUSD": str(COST_LIMIT)}, "whenExhausted": "Fail"},
        "slots": {"budget": {"tokens": 10_000_000}, "maxConcurrentRuns": CONCURRENT_LIMIT},
    }
    with tenants_of(stack_, specs) as made:
        yield made


def _statuses(stack_: E2EStack, namespace: str) -> list[dict[str, Any]]:
    """Each AgentRun's status in ``namespace``, with its ``name``."""
    out = stack_.kubectl("get", "agentruns", "-n", namespace, "-o", "json").stdout
    items = json.loads(out)["items"]
    return [{**(item.get("status") or {}), "name": item["metadata"]["name"]} for item in items]


def _run_all(
    stack_: E2EStack,
    tenants: dict[str, tuple[str, str]],
    ledger: Ledger,
    *,
    during: Any = None,
    timeout: float = 240,
) -> dict[str, list[dict[str, Any]]]:
    """Apply every tenant's runs at once; poll until all ended, checking the live invariants
    (slots never above maxConcurrentRuns; no hold older than its expiry plus the sweep bound)
    and calling ``during(ended_count)`` on each poll."""
    for _, namespace in tenants.values():
        names = [f"r{index:02d}" for index in range(RUNS_PER_TENANT)]
        apply_all(stack_, namespace, named_runs(GOAL, namespace, names, tools=["calculate"]))
    bound = LEDGER_SWEEP + 2.0  # one sweep, plus the time it takes and our poll
    end = time.monotonic() + timeout
    while True:
        now = time.time()
        for role, (name, _) in tenants.items():
            book = ledger.book(name)
            if book is None:
                continue
            if role == "slots":
                assert len(book.active) <= CONCURRENT_LIMIT, book.active.keys()
            stale = [k for k, h in book.holds.items() if h.expires < now - bound]
            assert not stale, f"{name}: holds past their expiry by more than {bound}s: {stale}"
            if book.limits.tokens is not None:
                assert book.used_tokens + book.reserved_tokens <= book.limits.tokens
            if book.limits.cost_usd is not None:
                assert book.used_cost + book.reserved_cost <= book.limits.cost_usd
        statuses = {role: _statuses(stack_, ns) for role, (_, ns) in tenants.items()}
        ended = sum(1 for s in statuses.values() for x in s if x.get("terminalReason"))
        if during is not None:
            during(ended)
        if ended == RUNS_PER_TENANT * len(tenants):
            return statuses
        assert time.monotonic() < end, f"only {ended} runs ended in {timeout}s"
        time.sleep(1.0)


def _check_settled(
    stack_: E2EStack,
    tenants: dict[str, tuple[str, str]],
    ledger: Ledger,
    statuses: dict[str, list[dict[str, Any]]],
    *,
    killed: Sequence[float] = (),
) -> None:
    """Each tenant's settled book against its runs' usage. With nothing ``killed`` (the
    times, epoch seconds, a worker was SIGKILLed), every
    answered call is in a run's usage and nothing is abandoned; after a worker's SIGKILL its
    uncommitted calls may be charged as abandoned — answered ones their usage, and those its
    hold held no record of (answered or only received by the scripted model when it died)
    their prompt's bound, as are those it had reserved and not yet sent — at most what the
    requests no run's usage holds and the kill allow (``E2EStack.abandoned_allowance``)."""
    answered = stack_.answered_calls(GOAL)
    used = {
        f"{namespace}/{s['name']}": int((s.get("usage") or {}).get("totalTokens", 0))
        for role, (_, namespace) in tenants.items()
        for s in statuses[role]
    }
    allowed = stack_.abandoned_allowance(
        GOAL, lambda run: used.get(run, 0) // CALL_TOKENS, call_tokens=CALL_TOKENS, kills=killed
    )
    for role, (name, namespace) in tenants.items():
        book = ledger.settled(name, timeout=15)
        runs = statuses[role]
        usage = [s.get("usage") or {} for s in runs]  # runs failed at admission used nothing
        tokens = sum(int(u.get("totalTokens", 0)) for u in usage)
        cost = sum((Decimal(u.get("costUSD", "0")) for u in usage), Decimal(0))
        calls = sum(n for key, n in answered.items() if key.startswith(f"{namespace}/"))
        unused = calls * CALL_TOKENS - tokens  # answered, in no run's usage
        assert unused >= 0, (role, calls, tokens)
        if killed:
            allowance = allowed[namespace]
            assert book.abandoned_tokens <= allowance, (role, book.abandoned_tokens, allowance)
        else:
            assert (book.abandoned_tokens, book.abandoned_cost, unused) == (0, 0, 0), role
        assert book.used_tokens == tokens + book.abandoned_tokens, (role, book.used_tokens, tokens)
        assert book.used_cost == cost + book.abandoned_cost, (role, book.used_cost, cost)
        if book.limits.tokens is not None:
            assert book.used_tokens <= book.limits.tokens
        if book.limits.cost_usd is not None:
            assert book.used_cost <= book.limits.cost_usd
        reasons = {s["terminalReason"] for s in runs}
        if role == "slots":
            assert reasons == {"completed"}, reasons
        else:  # the budget stopped some runs, and only the budget
            assert reasons == {"completed", "tenant_budget_exhausted"}, reasons
            stopped = [s for s in runs if s["terminalReason"] == "tenant_budget_exhausted"]
            assert all(
                ("tokens" if role == "tokens" else "costUSD") in s["message"] for s in stopped
            )
            # each by one of the two guards: admission (its first call could not fit) or a
            # worker's reservation (its next call did not fit); how many of each is timing
            at_admission = [s for s in stopped if "whenExhausted is Fail" in s["message"]]
            mid_run = [s for s in stopped if "for this call exceeds" in s["message"]]
            assert len(at_admission) + len(mid_run) == len(stopped)


def test_three_tenants_fifty_runs_each_three_workers_never_overspend(
    stack_: E2EStack,
    third_worker: components.Component,
    tenants: dict[str, tuple[str, str]],
    ledger: Ledger,
) -> None:
    statuses = _run_all(stack_, tenants, ledger)
    _check_settled(stack_, tenants, ledger, statuses)


def test_a_worker_sigkilled_mid_way_leaves_no_overspend_and_no_stuck_hold(
    stack_: E2EStack,
    third_worker: components.Component,
    tenants: dict[str, tuple[str, str]],
    ledger: Ledger,
) -> None:
    killed: list[float] = []

    def kill_once(ended: int) -> None:
        if not killed and ended >= 20:
            components.kill_component(stack_.workers[0])
            killed.append(time.time())

    statuses = _run_all(stack_, tenants, ledger, during=kill_once)
    assert killed, "the worker was never killed"
    _check_settled(stack_, tenants, ledger, statuses, killed=killed)
    assert HOLD_TTL < 10  # the bound the live check enforced is short


@pytest.fixture
def tenant_ns(stack_: E2EStack) -> Iterator[tuple[str, str]]:
    """A fresh namespace and the name its AgentTenant gets (created by the test)."""
    namespace = create_namespace(stack_.kubectl)
    name = f"t-{namespace}"
    yield name, namespace
    stack_.kubectl("delete", "agentruns", "--all", "-n", namespace, "--wait=false")
    stack_.kubectl("delete", "agenttenant", name, "--ignore-not-found", "--wait=false")
    delete_namespace(stack_.kubectl, namespace)


def _apply_tenant(stack_: E2EStack, name: str, namespace: str, **spec: Any) -> None:
    apply_tenant(stack_, name, namespace, **spec)
    stack_.wait_tenant_observed(name, timeout=30)


def test_an_orphaned_hold_is_released_within_the_bound(
    stack_: E2EStack, tenant_ns: tuple[str, str], ledger: Ledger
) -> None:
    """A hold whose worker died (nobody refreshes it) is gone at most one sweep after it
    expires; a live run's hold is not touched."""
    name, namespace = tenant_ns
    _apply_tenant(stack_, name, namespace, budget={"tokens": 10_000})
    expires = time.time() + 1.0
    hold = Hold("dead-run", 3, 1_100, Decimal("0.01"), expires, "dead-worker", namespace, "gone")
    limits = TenantLimits(tokens=10_000)  # the AgentTenant's, opening its book as admission does
    refusal = ledger._run(
        ledger.store._change(
            name, lambda book: book.reserve("dead-run:3", hold, now=time.time()), limits=limits
        )
    )
    assert refusal is None
    book = ledger.book(name)
    assert book is not None and book.reserved_tokens == 1_100
    while True:
        book = ledger.book(name)
        assert book is not None
        if "dead-run:3" not in book.holds:
            break
        assert time.time() < expires + LEDGER_SWEEP + 2.0, "the hold outlived its bound"
        time.sleep(0.1)
    assert book.used_tokens == 0  # released, not charged: its turn never committed
    status = json.loads(stack_.kubectl("get", "agenttenant", name, "-o", "json").stdout)
    assert status["status"]["budget"]["tokens"]["limit"] == 10_000


def test_the_wall_clock_budget_is_charged_while_runs_go_and_ends_them(
    stack_: E2EStack, tenant_ns: tuple[str, str], ledger: Ledger
) -> None:
    """wallClockSeconds is the sum of run durations, charged live: two long runs in a tenant
    with 6 s end tenant_budget_exhausted after about 3 s each, without a turn boundary."""
    name, namespace = tenant_ns
    _apply_tenant(stack_, name, namespace, budget={"wallClockSeconds": 6})
    for run in ("w1", "w2"):
        stack_.apply(namespace, run_manifest(run, "E2E-LONG wall clock"))
    samples: list[float] = []
    deadline = time.monotonic() + 40
    ends: dict[str, dict[str, Any]] = {}
    while len(ends) < 2:
        assert time.monotonic() < deadline, f"runs still going: {ends}"
        tenant = json.loads(stack_.kubectl("get", "agenttenant", name, "-o", "json").stdout)
        used = tenant.get("status", {}).get("budget", {}).get("wallClockSeconds", {}).get("used")
        if used is not None:
            samples.append(float(used))
        for run in ("w1", "w2"):
            status = (stack_.get(namespace, run) or {}).get("status") or {}
            if status.get("terminalReason"):
                ends[run] = status
        time.sleep(0.3)
    assert any(0 < s < 6 for s in samples), f"wall time was not charged live: {samples}"
    for status in ends.values():
        assert status["terminalReason"] == "tenant_budget_exhausted", status
        # ended by the sweep mid-turn, or by a refused reservation at a turn boundary
        assert "wall-clock" in status["message"] or "wallClockSeconds" in status["message"]
        assert float(status["usage"]["wallSeconds"]) < 3 + LEDGER_SWEEP + 3.0
    # the operator closes a run in the ledger around its terminal status, not before it:
    # poll until both slots are free
    deadline = time.monotonic() + 15
    while True:
        book = ledger.book(name)
        assert book is not None
        if not book.active:
            break
        assert time.monotonic() < deadline, f"slots never freed: {book.active}"
        time.sleep(0.2)
    assert 6 <= book.used_wall < 6 + 2 * (LEDGER_SWEEP + 3.0)


CANCEL_IN_TOOL_SCENARIO = {
    "name": "cancel-in-tool",
    "match": {"goal": "E2E-CANCEL-IN-TOOL"},
    "turns": [
        {
            "tool_calls": [{"name": "sleep", "arguments": {"seconds": 30}}],
            "usage": {"prompt_tokens": 40, "completion_tokens": 10},
        },
        {
            "content": "not reached: the run is cancelled in its tool",
            "usage": {"prompt_tokens": 40, "completion_tokens": 10},
        },
    ],
}
"""A model call of 50 tokens, then a 30 s tool the test's cancel cuts."""


def test_a_turn_cancelled_after_its_model_call_is_still_charged(
    stack_: E2EStack, tenant_ns: tuple[str, str], ledger: Ledger
) -> None:
    """The provider bills a call that answered even if its turn never commits: cancelling
    the run during its tool phase charges the call to the tenant (as abandoned), once. The
    tool sleeps 30 s (cut by the cancel): the cancel goes through kubectl, the operator's
    watch and its broadcast, which on a loaded machine took longer than the 4 s of
    ``E2E-SLOW-TOOL``'s, and a turn committed before it would leave nothing abandoned."""
    name, namespace = tenant_ns
    append_scenario(stack_, CANCEL_IN_TOOL_SCENARIO)
    _apply_tenant(stack_, name, namespace, budget={"tokens": 100_000})
    stack_.apply(namespace, run_manifest("slow", "E2E-CANCEL-IN-TOOL abandoned"))
    deadline = time.monotonic() + 30
    while True:  # the answer is in (its usage is on the hold): the worker is in the 4 s tool
        book = ledger.book(name)
        holds = [] if book is None else book.holds.values()
        if any(h.name == "slow" and h.recorded for h in holds):
            break
        assert time.monotonic() < deadline, f"the model call never answered: {book}"
        time.sleep(0.05)
    stack_.kubectl("annotate", "agentrun", "slow", "-n", namespace, "agentrun.dev/cancel=true")
    ended = stack_.wait_terminal(namespace, "slow")
    assert ended["terminalReason"] == "cancelled"
    assert int((ended.get("usage") or {}).get("totalTokens", 0)) == 0  # never committed
    deadline = time.monotonic() + 15
    while True:
        book = ledger.book(name)
        assert book is not None
        if book.abandoned_tokens and not book.active:
            break
        assert time.monotonic() < deadline, f"not charged: {book}"
        time.sleep(0.2)
    assert book.used_tokens == book.abandoned_tokens == 50  # the scenario's 40 + 10
    assert not book.holds


def test_a_run_whose_first_call_can_never_fit_fails_and_does_not_block_the_queue(
    stack_: E2EStack, tenant_ns: tuple[str, str]
) -> None:
    """A goal of 700 bytes is a prompt of up to 700 tokens: under a 600-token tenant even its
    smallest call (that prompt and 128 output tokens) can never fit. It fails at once, naming
    the remedy, and the small run queued behind it runs."""
    name, namespace = tenant_ns
    _apply_tenant(stack_, name, namespace, budget={"tokens": 600}, maxConcurrentRuns=1)
    big_goal = "E2E-PARALLEL-ORDER: big " + "x" * 700
    stack_.apply(namespace, run_manifest("big", big_goal))
    stack_.apply(
        namespace,
        run_manifest("small", "E2E-PARALLEL-ORDER: small", budget={"maxTokens": 400}),
    )
    big = stack_.wait_terminal(namespace, "big")
    assert (big["phase"], big["terminalReason"]) == ("Failed", "tenant_budget_exhausted")
    assert "allows per window (600)" in big["message"]
    assert "shorten its goal and instructions" in big["message"]
    assert (big.get("usage") or {}).get("steps", 0) == 0  # no model call was made
    small = stack_.wait_terminal(namespace, "small", timeout=60)
    assert small["terminalReason"] in {"completed", "token_budget_exhausted"}, small
