"""A three-server JetStream cluster under load, its servers failing (issue 23, "JetStream,
replicated"): 100 concurrent runs across 2 tenants on 2 workers, the operator and the ledger
on a real API server, the scripted model answering — while

- the server leading ``AGENTRUN_EVENTS`` is SIGKILLed and started again on its store;
- all three servers are restarted one at a time, each caught up (``/jsz``) before the next;
- the leaders move: ``AGENTRUN_EVENTS``, the ledger's KV stream, the workers' and the
  operator's durable consumers step down, twice each.

Expected every time: every run ``completed`` (its script's own end); every turn asked of the
model exactly once (requests counted per run and turn); each tenant's ledger exactly the sum
of its runs' usage, with nothing abandoned, held or active; no TurnRequest left over.

The stack is this module's own (its NATS cluster, mock model, operator and two workers), on
the session's API server: it lives outside ``tests/e2e`` so that the e2e package's operator
(stopped after that package) never reconciles these runs too.
"""

from __future__ import annotations

import asyncio
import collections
import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import nats
import nats.js.errors
import pytest
import yaml
from e2e.conftest import E2EStack, mock_model, run_manifest, wait_consuming

from agentrun import protocol
from agentrun.ledger import Book, LedgerStore
from agentrun.protocol import RunEvent
from agentrun_dev import components, natscluster, stack
from agentrun_dev.kubectl import create_namespace, delete_namespace

pytestmark = [pytest.mark.e2e, pytest.mark.long, pytest.mark.timeout(600)]

RUNS_PER_TENANT = 50
TURNS = 6
"""Model calls per run: five tool calls, then the answer (each answered after ``LATENCY_MS``:
the load lasts long enough for a rolling restart of three servers)."""
LATENCY_MS = 1500
PROMPT, COMPLETION = 100, 20
"""Tokens the scripted model reports for every call."""
MARK = "NATS-FAULTS"
SCENARIO = {
    "name": "nats-faults",
    "match": {"goal": MARK},
    "turns": [
        *(
            {
                "tool_calls": [{"name": "calculate", "arguments": {"expression": f"{{turn}}+{i}"}}],
                "usage": {"prompt_tokens": PROMPT, "completion_tokens": COMPLETION},
                "latency_ms": LATENCY_MS,
            }
            for i in range(TURNS - 1)
        ),
        {
            "content": "Done.",
            "usage": {"prompt_tokens": PROMPT, "completion_tokens": COMPLETION},
            "latency_ms": LATENCY_MS,
        },
    ],
}
GOAL = re.compile(MARK + r" ([a-z0-9-]+/r\d+)")
LEDGER_KV = protocol.kv_stream(protocol.LEDGER_BUCKET)
EFFECTS_KV = protocol.kv_stream(protocol.EFFECTS_BUCKET)
STALL = 60.0
"""Seconds a run may show no progress (no step, no end) once its fault is over: a slow, loaded
machine takes longer, but a run that stops moving for this long was left stuck by the fault."""
SETTLE = 30.0
"""Seconds the ledger and the turn queue get to settle after the last run ended (its close
and the last acks land right after its terminal status)."""


class Admin:
    """An admin NATS client on its own event loop: ledger books, leaders, step-downs."""

    def __init__(self, cluster: natscluster.NatsCluster) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.nc: Any = self.run(nats.connect(**cluster.client_options(), max_reconnect_attempts=-1))
        # bound, not provisioned: an open with ``create`` would set the bucket's replicas
        self.store: LedgerStore = self.run(LedgerStore.open(self.nc.jetstream(), create=False))

    def run(self, coro: Any, timeout: float = 60) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=timeout)

    def book(self, tenant: str) -> Book | None:
        found: Book | None = self.run(self.store.read(tenant))
        return found

    def leader(self, stream: str) -> str:
        info = self.run(self.nc.jetstream(timeout=5).stream_info(stream))
        return str(info.cluster.leader)

    def step_down(self, stream: str, consumer: str | None = None) -> tuple[str, str]:
        moved: tuple[str, str] = self.run(
            natscluster.step_down(self.nc, stream, consumer=consumer, timeout=20)
        )
        return moved

    def replicas(self) -> dict[str, int]:
        """Every stream agentrun made (its KV buckets' included) → its replica count."""
        js = self.nc.jetstream(timeout=5)
        names = (protocol.STREAM_TURNS, protocol.STREAM_EVENTS, LEDGER_KV, EFFECTS_KV)
        return {n: int(self.run(js.stream_info(n)).config.num_replicas or 1) for n in names}

    def turns_queued(self) -> int:
        info = self.run(self.nc.jetstream(timeout=5).stream_info(protocol.STREAM_TURNS))
        return int(info.state.messages)

    def diagnose(self, namespace: str, name: str, uid: str) -> dict[str, Any]:
        """What NATS holds of a stuck run: its events (kind, turn, seq), the TurnRequests of
        it still in the work queue (turn, base, deliveries), the workers' consumer (pending,
        ack pending, redelivered) and the operator's on the events (the same, and its pull
        requests waiting)."""
        return dict(self.run(self._diagnose(namespace, name, uid)))

    def events(self, namespace: str, name: str) -> list[tuple[RunEvent, float]]:
        """Run ``namespace/name``'s events in order, each with the time JetStream stored it
        (epoch seconds), read from the stream's leader."""
        found: list[tuple[RunEvent, float]] = self.run(self._events(namespace, name))
        return found

    async def _events(self, namespace: str, name: str) -> list[tuple[RunEvent, float]]:
        jsm = self.nc.jsm()
        subject = protocol.event_subject(namespace, name)
        events, seq = [], 1
        while True:
            try:
                raw = await jsm.get_msg(protocol.STREAM_EVENTS, seq=seq, next=True, subject=subject)
            except nats.js.errors.NotFoundError:
                return events
            stored = raw.time.timestamp() if raw.time is not None else 0.0
            events.append((RunEvent.decode(raw.data or b"", seq=int(raw.seq or 0)), stored))
            seq = int(raw.seq or 0) + 1

    async def _diagnose(self, namespace: str, name: str, uid: str) -> dict[str, Any]:
        jsm = self.nc.jsm()
        events = [(e.kind, e.summary.turn, e.seq) for e, _ in await self._events(namespace, name)]
        info = await jsm.stream_info(protocol.STREAM_TURNS)
        queued = []
        for at in range(int(info.state.first_seq or 0), int(info.state.last_seq or 0) + 1):
            try:
                raw = await jsm.get_msg(protocol.STREAM_TURNS, seq=at)
            except nats.js.errors.NotFoundError:
                continue
            request = protocol.decode_turn_request(raw.data or b"")
            if request.run_uid == uid:
                queued.append((at, request.turn, request.expected_seq, raw.headers))
        consumer = await jsm.consumer_info(protocol.STREAM_TURNS, protocol.WORKERS_CONSUMER)
        operator = await jsm.consumer_info(protocol.STREAM_EVENTS, protocol.OPERATOR_CONSUMER)
        return {
            "uid": uid,
            "events": events,
            "queued": queued,
            "workers": (consumer.num_pending, consumer.num_ack_pending, consumer.num_redelivered),
            "operator": (
                operator.num_pending,
                operator.num_ack_pending,
                operator.num_redelivered,
                operator.num_waiting,
            ),
        }

    def close(self) -> None:
        self.run(self.nc.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)


def model_on_cluster(
    logs: Path,
    scenarios: list[dict[str, Any]],
    control_plane: Any,
    cluster: natscluster.NatsCluster,
) -> tuple[components.Launch, components.Component, dict[str, str]]:
    """Start the scripted model with ``scenarios`` (logs in ``logs``); return the launch, the
    model and the environment of processes on ``cluster`` (every server's URL, R3 streams and
    buckets) with the Lease at the product's defaults (15 s, renew deadline 10 s), not the e2e
    stack's short ones (8 s, 6 s, for quick failovers): under this load a renewal took up to
    4.4 s on two cores, near the short deadline (past it the operator exits, as designed, and
    the tests start it again)."""
    path = logs / "scenarios.yaml"
    path.write_text(yaml.safe_dump({"scenarios": scenarios}))
    launch = components.Launch(log_dir=logs, die_with_parent=True)
    mock = stack.start_mockllm([path], launch=launch)
    env = stack.service_env(
        kubeconfig=str(control_plane.kubeconfig),
        nats=cluster.servers[0],
        replicas=len(cluster.servers),
        urls=cluster.urls,
    )
    env.update(
        AGENTRUN_LEASE_DURATION="15", AGENTRUN_LEASE_RENEW_DEADLINE="10", AGENTRUN_LEASE_RETRY="2"
    )
    return launch, mock, env


@pytest.fixture(scope="module")
def faults_stack(
    control_plane: Any,
    crds: Any,
    kubectl: Any,
    nats_cluster: natscluster.NatsCluster,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[E2EStack]:
    """The operator, two workers and the scripted model on this module's NATS cluster, every
    process given all three servers' URLs and R3 streams and buckets."""
    launch, mock, env = model_on_cluster(
        tmp_path_factory.mktemp("natsfaults-logs"), [SCENARIO], control_plane, nats_cluster
    )
    # The turn ack wait is the default (30 s; heartbeats every 10 s). At 10 s, an election
    # after the SIGKILL that outlasted the heartbeats' slack on a loaded 2-core machine had a
    # turn in flight redelivered to the other worker, which asked the model again (1 run in
    # 4): a worker cut off from the consumer for longer than the ack wait is, to JetStream,
    # a dead one. That bound is the product's, said in docs/operations.md.
    env.update(AGENTRUN_STATUS_INTERVAL="0.5")
    operator = stack.start_operator(env, launch=launch)
    workers = [stack.start_worker(i, env=env, launch=launch) for i in (1, 2)]
    handle = E2EStack(kubectl, launch, env, mock, operator, workers)
    try:
        for worker in workers:
            wait_consuming(worker, timeout=60)
        kubectl("apply", "-f", "-", input=yaml.safe_dump(mock_model(stack.mockllm_url(mock))))
        yield handle
    finally:
        for component in [*handle.workers, handle.operator, handle.mock]:
            components.stop_component(component)


@pytest.fixture
def tenants(faults_stack: E2EStack) -> Iterator[dict[str, str]]:
    """Two AgentTenants of a fresh namespace each, admitting one run at a time until `Load`
    opens them to all their runs: name → namespace."""
    made: dict[str, str] = {}
    for _ in range(2):
        namespace = create_namespace(faults_stack.kubectl)
        name = f"t-{namespace}"
        tenant = {
            "apiVersion": "agentrun.dev/v1alpha1",
            "kind": "AgentTenant",
            "metadata": {"name": name},
            "spec": {
                "namespaces": [namespace],
                "budget": {"tokens": 10_000_000},
                "maxConcurrentRuns": 1,
            },
        }
        faults_stack.kubectl("apply", "-f", "-", input=yaml.safe_dump(tenant))
        made[name] = namespace
    for name in made:
        faults_stack.wait_tenant_observed(name, timeout=60)
    yield made
    for name, namespace in made.items():
        faults_stack.kubectl("delete", "agentruns", "--all", "-n", namespace, "--wait=false")
        faults_stack.kubectl("delete", "agenttenant", name, "--ignore-not-found", "--wait=false")
        delete_namespace(faults_stack.kubectl, namespace)


class Load:
    """The 100 runs of one test, polled with kubectl. They are applied while each tenant
    admits one run at a time, then the tenants are opened to all of them at once: on a busy
    API server, creating 100 runs takes longer than a run (30 s for 100, against 9 s a run,
    seen beside another test run), so runs applied straight away would mostly end before the
    last were created, and before the fault."""

    def __init__(self, stack_: E2EStack, tenants: dict[str, str]) -> None:
        self.stack = stack_
        self.tenants = tenants
        for namespace in tenants.values():
            runs = [
                run_manifest(f"r{i:02d}", f"{MARK} {namespace}/r{i:02d}", tools=["calculate"])
                for i in range(RUNS_PER_TENANT)
            ]
            body = {"apiVersion": "v1", "kind": "List", "items": runs}
            stack_.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(body))
        self.asked_before = self.asked()
        opened = json.dumps({"spec": {"maxConcurrentRuns": RUNS_PER_TENANT}})
        for name in tenants:
            stack_.kubectl("patch", "agenttenant", name, "--type=merge", "-p", opened)

    def asked(self) -> int:
        """Model calls of these runs so far, as the scripted model counts them."""
        namespaces = tuple(self.tenants.values())
        bodies = [json.dumps(r["body"]) for r in self.stack.mock_requests()]
        return sum(1 for b in bodies if any(f"{MARK} {ns}/" in b for ns in namespaces))

    def statuses(self) -> dict[str, list[dict[str, Any]]]:
        """Tenant name → its runs' ``.status`` (``metadata.name`` added as ``name``). Each
        poll first starts the operator again if it gave its Lease up (``revive_operator``: on
        a loaded machine the API server can answer slower than the renew deadline, and the
        operator then exits as designed, for its Deployment to restart it)."""
        self.stack.revive_operator()
        found: dict[str, list[dict[str, Any]]] = {}
        for tenant, namespace in self.tenants.items():
            out = self.stack.kubectl("get", "agentruns", "-n", namespace, "-o", "json").stdout
            items = json.loads(out)["items"]
            found[tenant] = [
                {
                    **(item.get("status") or {}),
                    "name": item["metadata"]["name"],
                    "uid": item["metadata"]["uid"],
                }
                for item in items
            ]
        return found

    def ended(self) -> int:
        return sum(1 for s in self.statuses().values() for x in s if x.get("terminalReason"))

    def wait_started(self, calls: int, *, timeout: float = 60) -> None:
        """Wait until the scripted model got `calls` requests of these runs since the tenants
        were opened (the load is on; the model's count, not the runs' status, which the
        operator writes behind it)."""
        end = time.monotonic() + timeout
        while (asked := self.asked() - self.asked_before) < calls:
            assert time.monotonic() < end, f"only {asked} model calls in {timeout} s"
            time.sleep(0.2)

    def wait_all_ended(
        self, admin: Admin, *, stall: float = STALL
    ) -> dict[str, list[dict[str, Any]]]:
        """Every run's status once all ended. Bounded by progress, not by a total: a slow
        machine may take longer, but a run whose status shows no step and no end for `stall`
        seconds is stuck (AssertionError naming such runs and their last status)."""
        seen: dict[str, tuple[Any, ...]] = {}
        moved: dict[str, float] = {}
        while True:
            statuses = self.statuses()
            now = time.monotonic()
            unfinished = []
            for tenant, runs in statuses.items():
                for status in runs:
                    key, mark = f"{tenant}/{status['name']}", _progress(status)
                    if seen.get(key) != mark:
                        seen[key], moved[key] = mark, now
                    if not status.get("terminalReason"):
                        unfinished.append((key, {**status, "namespace": self.tenants[tenant]}))
            if not unfinished:
                return statuses
            stuck = [s for key, s in unfinished if now - moved[key] > stall]
            if stuck:
                found = [admin.diagnose(s["namespace"], s["name"], s["uid"]) for s in stuck[:3]]
                raise AssertionError(
                    f"{len(stuck)} runs without progress for {stall} s: {found}; "
                    f"operator restarts: {self.stack.operator_restarts or 'none'}; "
                    f"the operator's last warnings: {_warnings(self.stack.operator)}"
                )
            time.sleep(1.0)


def _warnings(component: components.Component, *, last: int = 15) -> list[str]:
    """The last WARNING and ERROR lines of ``component``'s log (what a stall report needs)."""
    lines = component.spec.log_path.read_text(errors="replace").splitlines()
    keep = (" WARNING ", " ERROR ", " CRITICAL ", "--- agentrun: start")
    return [line[:300] for line in lines if any(k in line for k in keep)][-last:]


def _progress(status: dict[str, Any]) -> tuple[Any, ...]:
    """What changes in a run's status as it goes: its steps, phase and end."""
    usage = status.get("usage") or {}
    return (usage.get("steps"), status.get("phase"), status.get("terminalReason"))


def check_outcome(
    stack_: E2EStack, admin: Admin, load: Load, statuses: dict[str, list[dict[str, Any]]]
) -> None:
    """The invariants of issue 23, after every run ended."""
    reasons = collections.Counter(s.get("terminalReason") for r in statuses.values() for s in r)
    assert reasons == {"completed": RUNS_PER_TENANT * 2}, (
        reasons,
        [s for r in statuses.values() for s in r if s.get("terminalReason") != "completed"][:3],
    )
    asked: dict[str, collections.Counter[int]] = collections.defaultdict(collections.Counter)
    for request in stack_.mock_requests():
        found = GOAL.search(json.dumps(request["body"]))
        if found is not None and found.group(1).split("/")[0] in load.tenants.values():
            asked[found.group(1)][int(request["turn"])] += 1
    once = collections.Counter(range(TURNS))
    wrong = {goal: dict(turns) for goal, turns in asked.items() if turns != once}
    assert len(asked) == RUNS_PER_TENANT * 2, f"{len(asked)} runs asked the model"
    assert not wrong, f"turns asked of the model other than once: {list(wrong.items())[:5]}"
    for tenant, runs in statuses.items():
        book = settled(admin, tenant)
        usage = [s["usage"] for s in runs]
        assert all(u["steps"] == TURNS for u in usage), [u["steps"] for u in usage]
        tokens = sum(int(u["totalTokens"]) for u in usage)
        assert tokens == RUNS_PER_TENANT * TURNS * (PROMPT + COMPLETION)
        cost = sum((Decimal(u["costUSD"]) for u in usage), Decimal(0))
        assert (book.abandoned_tokens, book.abandoned_cost) == (0, 0), tenant
        assert (book.used_tokens, book.used_cost) == (tokens, cost), tenant
    end = time.monotonic() + SETTLE
    while (queued := admin.turns_queued()) != 0:
        assert time.monotonic() < end, f"{queued} TurnRequests left after every run ended"
        time.sleep(0.5)


def settled(admin: Admin, tenant: str) -> Book:
    """`tenant`'s book once nothing is held or active (AssertionError after ``SETTLE`` s)."""
    end = time.monotonic() + SETTLE
    while True:
        book = admin.book(tenant)
        assert book is not None, tenant
        if not book.active and not book.holds:
            return book
        assert time.monotonic() < end, f"{tenant}: left {book.active} {book.holds}"
        time.sleep(0.5)


def _under_load(load: Load, fault: Callable[[], None], admin: Admin) -> None:
    """Run `fault` once the load is on, and check it was over before the last run ended; every
    stream is kept by the three servers (what the faults are survived by)."""
    assert set(admin.replicas().values()) == {3}, admin.replicas()
    load.wait_started(20)
    before = load.ended()
    fault()
    after = load.ended()
    total = RUNS_PER_TENANT * len(load.tenants)
    assert before < total // 2, f"{before} runs had ended before the fault: not mid-load"
    assert after < total, "every run ended before the fault was over: it was not under load"


def server_named(cluster: natscluster.NatsCluster, name: str) -> Any:
    return next(s for s in cluster.servers if s.component.name == f"nats-server-{name}")


def test_the_events_leader_sigkilled_and_restarted_on_its_store(
    faults_stack: E2EStack,
    tenants: dict[str, str],
    admin: Admin,
    nats_cluster: natscluster.NatsCluster,
) -> None:
    load = Load(faults_stack, tenants)

    def kill_and_restart() -> None:
        victim = admin.leader(protocol.STREAM_EVENTS)
        server = server_named(nats_cluster, victim)
        components.kill_component(server.component)
        time.sleep(3.0)  # the load goes on two servers a while
        server.restart()  # the same ports and store directory
        natscluster.wait_caught_up(nats_cluster, victim, timeout=90)

    _under_load(load, kill_and_restart, admin)
    check_outcome(faults_stack, admin, load, load.wait_all_ended(admin))


def test_a_rolling_restart_of_all_three_servers(
    faults_stack: E2EStack,
    tenants: dict[str, str],
    admin: Admin,
    nats_cluster: natscluster.NatsCluster,
) -> None:
    load = Load(faults_stack, tenants)

    def rolling_restart() -> None:
        for index, server in enumerate(nats_cluster.servers):
            server.restart()  # SIGTERM, then started again on its store
            natscluster.wait_caught_up(nats_cluster, f"n{index + 1}", timeout=90)

    _under_load(load, rolling_restart, admin)
    check_outcome(faults_stack, admin, load, load.wait_all_ended(admin))


def test_stream_and_consumer_leaders_moved(
    faults_stack: E2EStack, tenants: dict[str, str], admin: Admin
) -> None:
    load = Load(faults_stack, tenants)
    groups = [
        (protocol.STREAM_EVENTS, None),
        (LEDGER_KV, None),
        (protocol.STREAM_TURNS, protocol.WORKERS_CONSUMER),
        (protocol.STREAM_EVENTS, protocol.OPERATOR_CONSUMER),
    ]
    moves: list[tuple[str, str]] = []

    def step_downs() -> None:
        for _ in range(2):
            for stream, consumer in groups:
                moves.append(admin.step_down(stream, consumer))
                time.sleep(0.5)

    _under_load(load, step_downs, admin)
    assert len(moves) == 8 and all(old != new for old, new in moves), moves
    check_outcome(faults_stack, admin, load, load.wait_all_ended(admin))
