"""Chaos across the whole stack with two tenants: 50 runs in two namespaces bound to two
AgentTenants (one with a token window smaller than its runs want, so its budget stops some;
six runs at a time each) while a worker, the operator, nats-server and kube-apiserver are
SIGKILLed and started again, one at a time and then two at once, and every third run is
cancelled in the middle of it.

Expected afterwards: every run ended with a reason of the closed vocabulary (only the ones its
tenant and the cancels explain); each run's turns committed once (0..n-1, no gap, no
duplicate), its model-call turns as many as its status's steps; each tenant's book holds
nothing and runs nothing, and charged exactly its runs' usage plus what it records as
abandoned; its AgentTenant status says the same; no run charged more calls than the model
answered for it, its abandoned charge is at most what the requests no run's usage holds allow
(``E2EStack.abandoned_allowance``: a call whose hold was dropped before its first record is
charged its prompt's bound), and the answered calls left uncharged are at most those a killed
worker held. While the faults go, a
tenant's active runs never exceed ``maxConcurrentRuns`` nor its used plus reserved tokens its
limit. (test_soak.py kills NATS cluster members, operators and workers with every run
completing; test_chaos.py one API server restart under one run.)

Its size comes from the environment, to run the same code harder by hand:
``AGENTRUN_CHAOS_RUNS`` (runs per tenant, default 25), ``AGENTRUN_CHAOS_EXTRA`` (random faults
after the fixed seven, default 0), ``AGENTRUN_CHAOS_DOWN`` (their longest outage in seconds,
default 3) and ``AGENTRUN_CHAOS_SEED``.
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest

from agentrun import kernel
from agentrun.ledger import Book
from agentrun_dev import components, console, controlplane

from .conftest import E2EStack, Restarts, apiserver, apply_all, named_runs, tenants_of
from .events import read_book, read_events, turn_numbers

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.long,
    pytest.mark.skipif(
        controlplane.existing_cluster_requested(), reason="restarts the local control plane"
    ),
]

RUNS_PER_TENANT = int(os.environ.get("AGENTRUN_CHAOS_RUNS", "25"))
EXTRA_FAULTS = int(os.environ.get("AGENTRUN_CHAOS_EXTRA", "0"))
LONGEST_DOWN = float(os.environ.get("AGENTRUN_CHAOS_DOWN", "3"))
SEED = int(os.environ.get("AGENTRUN_CHAOS_SEED", "20261206"))
CALL_TOKENS = 120
"""Each call of the E2E-SHARD scenario (scenarios.yaml): 100 + 20 tokens, three calls a run."""
TIGHT_TOKENS = 40 * CALL_TOKENS
"""The tight tenant's window: fewer calls than its runs want, so its budget stops some."""
CONCURRENT = 6
"""Each tenant's ``maxConcurrentRuns``: with two tenants, at most 12 calls in flight."""
GOAL = "E2E-SHARD chaos "
REASONS = {
    "tight": {"completed", "cancelled", "tenant_budget_exhausted"},
    "roomy": {"completed", "cancelled"},
}
FIXED_FAULTS: list[tuple[tuple[str, ...], float]] = [
    (("worker",), 1.0),
    (("operator",), 1.0),
    (("nats",), 2.0),
    (("apiserver",), 3.0),
    (("nats", "worker"), 2.0),
    (("apiserver", "operator"), 3.0),
    (("nats", "operator"), 2.0),
]
"""(what is killed at once, seconds down): servers first, since each is started again in
this order and a worker counts as up once it consumes."""
CANCEL_AT = 3
"""Before which fault every third run of each tenant is cancelled."""


class Chaos:
    """SIGKILLs the stack's processes and starts them again; remembers each kill."""

    def __init__(self, stack_: E2EStack, nats_server: Any, apiservers: Callable[[], Any]) -> None:
        self.stack_, self.nats, self.apiservers = stack_, nats_server, apiservers
        self.kills: list[tuple[str, float]] = []

    def _kill(self, what: str, rng: random.Random) -> Callable[[], None]:
        self.kills.append((what, time.time()))
        if what == "worker":
            components.kill_component(rng.choice(self.stack_.workers))
            return self.stack_.restart_dead
        if what == "operator":
            components.kill_component(self.stack_.operator)
            return self.stack_.restart_dead
        if what == "nats":
            components.kill_component(self.nats.component)
            return self._start_nats
        restarts, api = self.apiservers()
        components.kill_component(api)
        return lambda: restarts.started.append(
            restarts.launch.start(api.spec, probe=api.probe, ports=api.ports)
        )

    def _start_nats(self) -> None:
        old = self.nats.component
        self.nats.past_pids = (*self.nats.past_pids, old.record.pid)
        self.nats.component = components.start_component(
            old.spec,
            probe=old.probe,
            ports=old.ports,
            ready_timeout=old.ready_timeout,
            log=console.discard,
        )

    def fault(self, whats: tuple[str, ...], *, down: float, rng: random.Random) -> None:
        """SIGKILL every one of ``whats`` at once, wait ``down`` s, start them again in order."""
        starts = [self._kill(what, rng) for what in whats]
        time.sleep(down)
        for start in starts:
            start()

    def worker_kills(self) -> int:
        """How many times a worker was killed."""
        return sum(1 for what, _ in self.kills if what == "worker")


class Sampler(threading.Thread):
    """Reads the tenants' books every 0.3 s while the faults go (skipping while NATS is
    down): the most active runs and the most used plus reserved tokens each showed."""

    def __init__(self, nats_server: Any, tenants: list[str]) -> None:
        super().__init__(daemon=True)
        self.nats = nats_server
        self.worst: dict[str, tuple[int, int]] = {t: (0, 0) for t in tenants}
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.3):
            for tenant, (active, spent) in list(self.worst.items()):
                try:
                    book = read_book(self.nats, tenant)
                except Exception:  # NATS is down: the next sample
                    continue
                if book is not None:
                    self.worst[tenant] = (
                        max(active, len(book.active)),
                        max(spent, book.used_tokens + book.reserved_tokens),
                    )

    def stop(self) -> dict[str, tuple[int, int]]:
        """Stop sampling; the worst seen per tenant."""
        self.done.set()
        self.join(timeout=30)
        return self.worst


@pytest.fixture
def chaos(
    stack_: E2EStack, nats_server: Any, control_plane: Any, restarts: Restarts
) -> Iterator[Chaos]:
    """Kills and restarts on this session's stack (API servers started again are stopped at
    session end, by ``restarts``)."""
    yield Chaos(stack_, nats_server, lambda: (restarts, apiserver(control_plane, restarts)))
    stack_.restart_dead()


@pytest.fixture
def two_tenants(stack_: E2EStack) -> Iterator[dict[str, tuple[str, str]]]:
    """role (``tight``, ``roomy``) → (AgentTenant name, its namespace)."""
    specs: dict[str, dict[str, Any]] = {
        "tight": {
            "budget": {"tokens": TIGHT_TOKENS},
            "whenExhausted": "Fail",
            "maxConcurrentRuns": CONCURRENT,
        },
        "roomy": {"budget": {"tokens": 10_000_000}, "maxConcurrentRuns": CONCURRENT},
    }
    with tenants_of(stack_, specs) as made:
        yield made


def _cancel_every_third(stack_: E2EStack, namespaces: list[str]) -> None:
    for namespace in namespaces:
        for i in range(0, RUNS_PER_TENANT, 3):
            stack_.kubectl(
                "annotate",
                *("agentrun", f"c{i:03d}", "-n", namespace, "agentrun.dev/cancel=true"),
                check=False,
            )


def _statuses(stack_: E2EStack, namespace: str) -> dict[str, dict[str, Any]]:
    result = stack_.kubectl("get", "agentruns", "-n", namespace, "-o", "json", check=False)
    if result.returncode != 0:  # the API server is down
        return {}
    items = json.loads(result.stdout)["items"]
    return {i["metadata"]["name"]: i.get("status") or {} for i in items}


def _wait_all_ended(
    stack_: E2EStack, namespaces: list[str], *, timeout: float
) -> dict[str, dict[str, dict[str, Any]]]:
    end = time.monotonic() + timeout
    while True:
        stack_.revive_operator()
        runs = {ns: _statuses(stack_, ns) for ns in namespaces}
        going = [
            f"{ns}/{name}: {status}"
            for ns, named in runs.items()
            for name, status in named.items()
            if not status.get("terminalReason")
        ]
        if not going and sum(map(len, runs.values())) == RUNS_PER_TENANT * len(namespaces):
            return runs
        assert time.monotonic() < end, f"{len(going)} runs never ended: {going[:10]}"
        time.sleep(1.0)


def _run_problems(nats_server: Any, namespace: str, name: str, status: dict[str, Any]) -> list[str]:
    """What is wrong with the ended run's committed turns against its status."""
    events = read_events(nats_server, namespace, name)
    turns = turn_numbers(events)
    called = [e for e in events if e.record and not isinstance(e.record, kernel.Stopped)]
    steps = int((status.get("usage") or {}).get("steps", 0))
    if turns != list(range(len(turns))) or len(called) != steps:
        return [f"{namespace}/{name}: turns {turns}, {len(called)} called, steps {steps}"]
    return []


def _settled(nats_server: Any, tenant: str, *, timeout: float) -> Book:
    end = time.monotonic() + timeout
    while True:
        book = read_book(nats_server, tenant)
        assert book is not None
        if not book.active and not book.holds and not book.reserved_tokens:
            return book
        assert time.monotonic() < end, f"{tenant}: left {book.active} {book.holds}"
        time.sleep(0.5)


def _tenant_status_problems(stack_: E2EStack, tenant: str, book: Book) -> list[str]:
    """What the AgentTenant's status says otherwise than its settled book (once it caught up)."""
    want = (0, book.used_tokens, 0, book.abandoned_tokens)
    end = time.monotonic() + 20
    while True:
        got = json.loads(stack_.kubectl("get", "agenttenant", tenant, "-o", "json").stdout)
        status = got.get("status") or {}
        tokens = (status.get("budget") or {}).get("tokens") or {}
        seen = (
            status.get("activeRuns"),
            *(tokens.get(k) for k in ("used", "reserved", "abandoned")),
        )
        if seen == want:
            return []
        if time.monotonic() > end:
            return [f"{tenant}: status (active, used, reserved, abandoned) {seen} != book {want}"]
        time.sleep(0.5)


def _tenant_problems(
    stack_: E2EStack,
    nats_server: Any,
    role: str,
    place: tuple[str, str],
    runs: dict[str, dict[str, Any]],
    kills: Sequence[float],
) -> tuple[list[str], int]:
    """What is wrong with one tenant's ended runs and book; and the answered calls it left
    uncharged (its runs' calls past their usage, less what its book charged as abandoned).
    ``kills``: when a worker or NATS was killed (``E2EStack.abandoned_allowance``)."""
    tenant, namespace = place
    answered = stack_.answered_calls(GOAL)
    problems, charged, extra = [], 0, 0
    for name, status in sorted(runs.items()):
        if status["terminalReason"] not in REASONS[role]:
            problems.append(f"{namespace}/{name}: {status['terminalReason']}: {status['message']}")
        problems += _run_problems(nats_server, namespace, name, status)
        tokens = int((status.get("usage") or {}).get("totalTokens", 0))
        calls = answered[f"{namespace}/{name}"] * CALL_TOKENS
        if calls < tokens:
            problems.append(f"{namespace}/{name}: charged {tokens} tokens, answered {calls}")
        charged, extra = charged + tokens, extra + max(0, calls - tokens)
    book = _settled(nats_server, tenant, timeout=30)
    if book.used_tokens != charged + book.abandoned_tokens:
        problems.append(
            f"{tenant}: used {book.used_tokens} != runs {charged}"
            f" + abandoned {book.abandoned_tokens}"
        )
    used = {f"{namespace}/{n}": int((s.get("usage") or {}).get("totalTokens", 0))
            for n, s in runs.items()}  # fmt: skip
    allowed = stack_.abandoned_allowance(
        GOAL, lambda run: used.get(run, 0) // CALL_TOKENS, call_tokens=CALL_TOKENS, kills=kills
    )[namespace]
    if book.abandoned_tokens > allowed:  # more than the requests in no run's usage allow
        problems.append(f"{tenant}: abandoned {book.abandoned_tokens} > allowed {allowed}")
    problems += _tenant_status_problems(stack_, tenant, book)
    return problems, (extra - book.abandoned_tokens) // CALL_TOKENS


def test_two_tenants_runs_survive_workers_operator_nats_and_apiserver_killed(
    stack_: E2EStack, chaos: Chaos, two_tenants: dict[str, tuple[str, str]], nats_server: Any
) -> None:
    rng = random.Random(SEED)
    namespaces = [ns for _, ns in two_tenants.values()]
    for namespace in namespaces:
        names = [f"c{i:03d}" for i in range(RUNS_PER_TENANT)]
        apply_all(stack_, namespace, named_runs(GOAL, namespace, names, tools=["calculate"]))
    sampler = Sampler(nats_server, [tenant for tenant, _ in two_tenants.values()])
    sampler.start()
    kinds = ["nats", "apiserver", "operator", "worker"]  # the order they are started in
    extra = [
        (tuple(sorted(rng.sample(kinds, rng.choice([1, 2])), key=kinds.index)), LONGEST_DOWN)
        for _ in range(EXTRA_FAULTS)
    ]
    for index, (whats, down) in enumerate([*FIXED_FAULTS, *extra]):
        time.sleep(rng.uniform(1.0, 3.0))
        if index == CANCEL_AT:
            _cancel_every_third(stack_, namespaces)
        chaos.fault(whats, down=rng.uniform(0.5, down), rng=rng)
    runs = _wait_all_ended(stack_, namespaces, timeout=240)
    worst = sampler.stop()
    assert all(active <= CONCURRENT for active, _ in worst.values()), worst
    assert worst[two_tenants["tight"][0]][1] <= TIGHT_TOKENS, worst
    problems: list[str] = []
    kills = [at for what, at in chaos.kills if what in ("worker", "nats")]
    for role, place in two_tenants.items():
        found, uncharged = _tenant_problems(stack_, nats_server, role, place, runs[place[1]], kills)
        problems += found
        if uncharged > chaos.worker_kills() * 2 * CONCURRENT:  # what killed workers held
            problems.append(f"{role}: {uncharged} answered calls charged to nobody")
    assert not problems, "\n".join(problems)
