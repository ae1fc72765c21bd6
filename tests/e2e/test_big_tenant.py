"""A tenant as big as its users: many AgentRuns created at once in one tenant (an evaluation
sweep applied through GitOps), on the release's default ledger layout (``single``), all end by
their own execution — ``completed``, none refused for how the ledger stores the tenant — with
more runs active at once than one ledger value holds (500: the admission that passes it splits
the tenant's ledger) and more queued than earlier releases queued (1,000), every queued run
showing its own position, and every model call charged once: the tenant's ``used`` equal to
the sum of its runs' usage plus what it charged as abandoned, exactly, that at most what the
model's requests no run's usage holds allow (a turn redelivered while its first worker, on a
saturated machine, missed the e2e stack's 4 s ack wait runs twice; the call its run did not
commit was billed by the provider and is charged as abandoned).

The size is a setting: ``AGENTRUN_SCALE_RUNS`` runs (default 1,600) in a tenant with
``maxConcurrentRuns`` ``AGENTRUN_SCALE_ACTIVE`` (default 550): what CI runs, a few minutes on
the local e2e stack. ``AGENTRUN_SCALE_RUNS=12000 AGENTRUN_SCALE_ACTIVE=2000`` is the full claim
(2,000 active and 10,000 queued from the start), not run in CI (heavy on a 2-core machine);
``bench/bench_ledger_scale.py`` measures the ledger alone at that size.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import threading
import time
from decimal import Decimal
from typing import Any

import nats
import pytest
import yaml

from agentrun import kernel
from agentrun.ledger import Book, LedgerStore
from agentrun_dev.kubectl import create_namespace, delete_namespace

from .conftest import E2EStack, mock_model, run_manifest
from .events import settled_book

# 1,600 runs: beside another test module the API server admits them too slowly for 500 to be
# active at once (187 seen beside the shard tests), so this module runs alone.
pytestmark = [pytest.mark.e2e, pytest.mark.alone]

RUNS = int(os.environ.get("AGENTRUN_SCALE_RUNS", "1600"))
ACTIVE = int(os.environ.get("AGENTRUN_SCALE_ACTIVE", "550"))
CHUNK = 250
"""AgentRuns per ``kubectl create`` (each created with a request of its own)."""


def run_names(count: int) -> list[str]:
    return [f"sweep-{i:05d}" for i in range(count)]


GOAL = "E2E-ONE-LONGER-TURN"
"""The runs' goal, followed by their ``namespace/name`` (``E2EStack.requests_by_run``)."""
CALL_TOKENS = 46
"""Tokens the scripted model reports for each of the runs' calls (40 prompt, 6 completion)."""


def create_runs(stack_: E2EStack, namespace: str, names: list[str]) -> None:
    """``kubectl create`` every run, in chunks, two chunks at a time."""

    def create(chunk: list[str]) -> None:
        items = [run_manifest(n, f"{GOAL} {namespace}/{n}", tools=[]) for n in chunk]
        body = {"apiVersion": "v1", "kind": "List", "items": items}
        stack_.kubectl(
            "create", "-n", namespace, "-f", "-", input=yaml.safe_dump(body), timeout=900
        )

    chunks = [names[i : i + CHUNK] for i in range(0, len(names), CHUNK)]
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        list(pool.map(create, chunks))


def terminal_reasons(stack_: E2EStack, namespace: str) -> dict[str, str]:
    """name → terminal reason ("" while not ended), light enough to poll at 10,000 runs."""
    out = stack_.kubectl(
        "get",
        "agentruns",
        "-n",
        namespace,
        "--no-headers",
        "-o",
        "custom-columns=NAME:.metadata.name,REASON:.status.terminalReason",
        timeout=300,
    ).stdout
    found = {}
    for line in out.splitlines():
        name, _, reason = line.partition(" ")
        reason = reason.strip()
        found[name] = "" if reason == "<none>" else reason
    return found


def queue_positions(stack_: E2EStack, namespace: str) -> dict[str, int]:
    """name → the queue position its status shows (runs showing one)."""
    out = stack_.kubectl(
        "get",
        "agentruns",
        "-n",
        namespace,
        "--no-headers",
        "-o",
        "custom-columns=NAME:.metadata.name,POSITION:.status.queuePosition",
        timeout=300,
    ).stdout
    found = {}
    for line in out.splitlines():
        name, _, position = line.partition(" ")
        if position.strip().isdigit():
            found[name] = int(position.strip())
    return found


def tenant_status(stack_: E2EStack, name: str) -> dict[str, Any]:
    obj = json.loads(stack_.kubectl("get", "agenttenant", name, "-o", "json").stdout)
    status: dict[str, Any] = obj.get("status") or {}
    return status


class Peaks:
    """The largest ``activeRuns`` and ``queuedRuns`` an AgentTenant's status showed, read
    every quarter second by a thread of its own until `stop`: the peak after a tenant is
    opened lasts about a run's turn (3 s), shorter than one pass of the test's main loop
    (listing every run) on a busy machine."""

    def __init__(self, stack_: E2EStack, tenant: str, **start: int) -> None:
        self.most = dict(start)
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, args=(stack_, tenant), daemon=True)
        self._thread.start()

    def _sample(self, stack_: E2EStack, tenant: str) -> None:
        while not self._done.wait(0.25):
            status = tenant_status(stack_, tenant)
            for key in self.most:
                self.most[key] = max(self.most[key], int(status.get(key) or 0))

    def stop(self) -> dict[str, int]:
        """Stop sampling; the peaks seen."""
        self._done.set()
        self._thread.join(timeout=60)
        return self.most


def read_book(nats_server: Any, tenant: str) -> Book | None:
    """The tenant's whole ledger, straight from JetStream KV."""

    async def read() -> Book | None:
        nc = await nats.connect(**nats_server.client_options())
        try:
            store = await LedgerStore.open(nc.jetstream(), create=False)
            return await store.read(tenant)
        finally:
            await nc.close()

    found: list[Book | None] = []
    thread = threading.Thread(target=lambda: found.append(asyncio.run(read())))
    thread.start()
    thread.join(timeout=120)
    return found[0]


def set_max_concurrent_runs(stack_: E2EStack, tenant: str, namespace: str, most: int) -> None:
    manifest = {
        "apiVersion": "agentrun.dev/v1alpha1",
        "kind": "AgentTenant",
        "metadata": {"name": tenant},
        "spec": {"namespaces": [namespace], "maxConcurrentRuns": most},
    }
    stack_.kubectl("apply", "-f", "-", input=yaml.safe_dump(manifest))


def keep_up(stack_: E2EStack) -> None:
    """Start the operator or a worker again if it exited, as their Deployments do: on a loaded
    machine, an API server slowed by thousands of runs can make the operator miss its Lease
    renewal, and it exits by design (a new leader takes over; nothing committed is lost)."""
    dead = [c for c in (stack_.operator, *stack_.workers) if not c.is_alive()]
    if dead:
        print(f"\nrestarting {len(dead)} exited component(s), as their Deployments would")
        stack_.restart_dead()


def wait_tenant(stack_: E2EStack, tenant: str, predicate: Any, *, timeout: float) -> dict[str, Any]:
    end = time.monotonic() + timeout
    while True:
        keep_up(stack_)
        status = tenant_status(stack_, tenant)
        if predicate(status):
            return status
        assert time.monotonic() < end, f"AgentTenant {tenant}: {status}"
        time.sleep(2)


def run_tokens(runs: dict[str, Any]) -> dict[str, int]:
    """name → the tokens (input and output) its status's usage shows, for each AgentRun of a
    list."""
    found = {}
    for item in runs["items"]:
        usage = (item.get("status") or {}).get("usage") or {}
        found[item["metadata"]["name"]] = usage.get("inputTokens", 0) + usage.get("outputTokens", 0)
    return found


def ledger_sums(runs: dict[str, Any]) -> tuple[int, Decimal]:
    """Σ of every run's own usage (tokens, USD), from its status. A status shows its cost to
    the micro-dollar (``costUSD``), the ledger holds it exact: each run's exact cost is priced
    again from its status's tokens at the e2e AgentModel's prices (and must round to what its
    status shows)."""
    prices = mock_model("http://unused")["spec"]["pricing"]
    pricing = kernel.Pricing(
        Decimal(prices["inputPerMillionUSD"]),
        Decimal(prices["cachedInputPerMillionUSD"]),
        Decimal(prices["outputPerMillionUSD"]),
    )
    usages = [(item.get("status") or {}).get("usage") or {} for item in runs["items"]]
    tokens = sum(run_tokens(runs).values())
    costs = [
        pricing.cost(
            input_tokens=u.get("inputTokens", 0),
            cached_input_tokens=u.get("cachedInputTokens", 0),
            output_tokens=u.get("outputTokens", 0),
        )
        for u in usages
    ]
    shown = [Decimal(u.get("costUSD") or "0") for u in usages]
    assert [f"{c:.6f}" for c in costs] == [f"{c:.6f}" for c in shown]
    return tokens, sum(costs, Decimal(0))


@pytest.mark.timeout(max(1_800, RUNS))
def test_runs_created_at_once_in_one_tenant_all_end_by_their_own_execution(
    stack_: E2EStack, nats_server: Any
) -> None:
    """A tenant made with the operator's default layout: its ledger is one value. The runs are
    all created while the tenant's one slot is held by a run waiting for an approval (so they
    are all queued at once, whatever the speed of ``kubectl create``); then the tenant's
    ``maxConcurrentRuns`` is raised and the gate cancelled: ``ACTIVE`` runs are admitted at
    once (the ledger split on the way past 500), the rest as runs end."""
    namespace = create_namespace(stack_.kubectl, prefix="big-tenant-")
    tenant = namespace
    set_max_concurrent_runs(stack_, tenant, namespace, 1)
    wait_tenant(stack_, tenant, lambda s: "activeRuns" in s, timeout=60)
    gate = run_manifest("gate", "E2E-APPROVAL gate", approval={"tools": ["calculate"]})
    stack_.apply(namespace, gate)
    stack_.wait_for(namespace, "gate", lambda s: s.get("phase") == "AwaitingApproval")
    names = run_names(RUNS)
    try:
        started = time.monotonic()
        create_runs(stack_, namespace, names)
        created = time.monotonic() - started
        queued = wait_tenant(
            stack_, tenant, lambda s: s.get("queuedRuns") == RUNS, timeout=max(300, RUNS / 10)
        )
        # every run shows its own position: at once when queued; one that moved (a run created
        # earlier arrived after it) within the refresh rate (AGENTRUN_QUEUE_STATUS_WRITES)
        end = time.monotonic() + max(120, RUNS / 20 + 60)
        while sorted((shown := queue_positions(stack_, namespace)).values()) != list(
            range(1, RUNS + 1)
        ):
            assert time.monotonic() < end, (
                f"{len(shown)} positions shown, up to {max(shown.values())}"
            )
            keep_up(stack_)
            time.sleep(2)
        last = (stack_.get(namespace, max(shown, key=lambda n: shown[n])) or {})["status"]
        assert last["phase"] == "Queued" and last["conditions"][0]["reason"] == "ConcurrencyLimit"
        assert f"at position {RUNS}: behind {RUNS - 1} run(s)" in last["message"]
        opened = time.monotonic()
        set_max_concurrent_runs(stack_, tenant, namespace, ACTIVE)
        stack_.kubectl("annotate", "agentrun", "gate", "-n", namespace, "agentrun.dev/cancel=true")
        peaks = Peaks(stack_, tenant, activeRuns=0, queuedRuns=int(queued["queuedRuns"]))
        try:
            while True:
                reasons = terminal_reasons(stack_, namespace)
                ended = sum(bool(r) for n, r in reasons.items() if n != "gate")
                if ended == RUNS:
                    break
                assert time.monotonic() - opened < RUNS, f"{ended} of {RUNS} runs ended"
                keep_up(stack_)
                time.sleep(2)
        finally:
            most = peaks.stop()
        took = time.monotonic() - opened
        counts: dict[str, int] = {}
        for name, reason in reasons.items():
            if name != "gate":
                counts[reason] = counts.get(reason, 0) + 1
        assert counts == {"completed": RUNS}  # each by its own execution; none by the queue
        assert reasons["gate"] == "cancelled"
        assert most["activeRuns"] > min(500, ACTIVE - 50), most  # the one-value ledger: 500
        assert most["queuedRuns"] == RUNS  # the one-value queue: 1,000
        # used == Σ runs' own usage, exactly: in the ledger and in the AgentTenant's status
        listed = stack_.kubectl("get", "agentruns", "-n", namespace, "-o", "json", timeout=600)
        runs = json.loads(listed.stdout)
        tokens, cost = ledger_sums(runs)
        # the last runs' closes land
        book = settled_book(nats_server, tenant, timeout=60, poll=1.0, read=read_book)
        assert (book.used_tokens, book.used_cost) == (
            tokens + book.abandoned_tokens,
            cost + book.abandoned_cost,
        )
        if book.abandoned_tokens or book.abandoned_cost:  # a turn run twice (see above)
            used = {f"{namespace}/{n}": u for n, u in run_tokens(runs).items()}
            allowed = stack_.abandoned_allowance(
                GOAL, lambda run: used.get(run, 0) // CALL_TOKENS, call_tokens=CALL_TOKENS
            )[namespace]
            dearest = max(
                Decimal(p) for p in mock_model("http://unused")["spec"]["pricing"].values()
            )
            assert book.abandoned_tokens <= allowed, (book.abandoned_tokens, allowed)
            assert book.abandoned_cost <= allowed * dearest / 1_000_000, book.abandoned_cost
        assert (book.active_runs, book.holds) == (0, {})
        assert not book.one_value or ACTIVE <= 500  # outgrown: split
        assert book.totals_mismatch() == []
        wait_tenant(
            stack_,
            tenant,
            lambda s: (
                ((s.get("budget") or {}).get("tokens") or {}).get("used") == book.used_tokens
                and ((s.get("budget") or {}).get("costUSD") or {}).get("used")
                == format(book.used_cost, "f")
            ),
            timeout=30,
        )
        starts = sorted(
            (item.get("status") or {}).get("startTime", "")
            for item in runs["items"]
            if item["metadata"]["name"] != "gate"
        )
        print(
            f"\n{RUNS} runs created in {created:.0f} s, all queued behind the gate; "
            f"maxConcurrentRuns {ACTIVE}: all ended {took:.0f} s after it was raised "
            f"({RUNS / took:.1f} runs/s); most active {most['activeRuns']}, most queued "
            f"{most['queuedRuns']}; admissions from {starts[0]} to {starts[-1]}; used {tokens} "
            f"tokens, {cost} USD by the runs, {book.abandoned_tokens} tokens abandoned"
        )
    finally:
        stack_.kubectl("delete", "agenttenant", tenant, "--ignore-not-found", "--wait=false")
        delete_namespace(stack_.kubectl, namespace)
