"""Load held (issue 23): the whole stack past one machine's single processes — a three-server
JetStream cluster (R3 streams and buckets), two operator processes active-active over four
shards, three workers — carries runs of five tenants with mixed lengths while a chaos loop
kills, in turn, one NATS server (the run events' leader: SIGKILL, started again on its store),
one operator (SIGKILL; the other takes its shards over, then it comes back and they are shared
again) and one worker (SIGKILL, started again at once; the turns it held are redelivered after
the ack wait). A round is those three faults; rounds are at least ``QUIET`` seconds apart, up
to ``AGENTRUN_SOAK_ROUNDS`` of them while runs are being created or queued; the first must end
with runs still going. Runs are created while the faults go (``CHUNK`` to a ``kubectl apply``).

Expected: every run ``completed`` with each of its turns committed once (one ``turn`` event
per turn of its script in its event stream; its status's steps and tokens exactly its
script's); a (run, turn) asked of the model twice only if that call was in flight on the
killed worker (asked at most ``IN_FLIGHT`` s before the kill, and again after it), never three
times; each
tenant's ledger exactly the sum of its runs' usage plus its abandoned charge, that charge no
more than those calls, nothing active or held; no TurnRequest left over.

Reported (printed, and written as JSON to ``AGENTRUN_SOAK_REPORT`` when set, which
``bench/bench_soak.py`` reads): runs completed, turns lost, turns committed twice, calls asked
again, ledger differences, p50/p99 of a turn's overhead (committed event n → model request
n+1) during the faults and outside them, and the longest a run waited between two turns.

Its size comes from the environment so that the bench runs the same code longer:
``AGENTRUN_SOAK_RUNS`` (runs per tenant, default 24: 120 runs), ``AGENTRUN_SOAK_CONCURRENCY``
(each tenant's ``maxConcurrentRuns``, default 3: the load lasts through a round) and
``AGENTRUN_SOAK_ROUNDS`` (default 1): about 2.5 minutes here at the defaults, set-up included.
Marked ``alone``: the operators' Lease renewals and the timing of the faults need the machine
to themselves.
"""

from __future__ import annotations

import collections
import concurrent.futures
import json
import os
import re
import statistics
import time
import uuid
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import yaml
from e2e.conftest import E2EStack, lost_lease, mock_model, run_manifest, wait_consuming

from agentrun import protocol
from agentrun.operator.platform.shards import lease_name, member_lease_name, shard_of
from agentrun_dev import components, natscluster, probes, procs, stack
from agentrun_dev.kubectl import delete_namespace

from .faults_support import Admin, model_on_cluster, server_named, settled, tenant_manifest

pytestmark = [pytest.mark.e2e, pytest.mark.alone, pytest.mark.timeout(1800)]

TENANTS = 5
SHARDS = 4
RUNS_PER_TENANT = int(os.environ.get("AGENTRUN_SOAK_RUNS", "24"))
CONCURRENCY = int(os.environ.get("AGENTRUN_SOAK_CONCURRENCY", "3"))
ROUNDS = int(os.environ.get("AGENTRUN_SOAK_ROUNDS", "1"))
QUIET = 20.0
"""Seconds without a fault between two rounds: the overhead outside the faults is read there
(and after the last round)."""
CHUNK = 25
"""Runs created by one ``kubectl apply``."""
LENGTHS = (2, 4, 6)
"""Model calls per run, by run index modulo three: tool calls, then the answer."""
LATENCY_MS = 2000
PROMPT, COMPLETION = 100, 20
CALL_TOKENS = PROMPT + COMPLETION
LEASE_BASE = "agentrun-soak"
"""``AGENTRUN_LEASE_NAME`` of this module's operators: Leases apart from any other test's."""
ACK_WAIT = 30.0
"""The turn consumer's ack wait (the product's default): a killed worker's turns wait this."""
TAKEOVER = 15.0 + 2.0 + 20.0
"""Seconds from an operator's SIGKILL until the other holds its shards: the Lease duration,
a retry, and margin for a loaded 2-core machine."""
IN_FLIGHT = LATENCY_MS / 1000 + 15.0
"""Seconds before a worker's kill a call it held may have been asked: the model's answer and
the commit after it, slow on a loaded machine (a turn's overhead reached 5 s at p99 in the
bench), and well short of the NATS fault that precedes the worker's in a round."""
STALL = 90.0
"""Seconds a run may show no progress before it counts as stuck (a worker's kill alone costs
the ack wait)."""


def _scenario(length: int) -> dict[str, Any]:
    """The scripted model's scenario of runs of ``length`` model calls (goal ``SOAK-<length>``):
    ``length - 1`` calls of ``calculate``, then the answer, each after ``LATENCY_MS``."""
    usage = {"prompt_tokens": PROMPT, "completion_tokens": COMPLETION}
    call = {"name": "calculate", "arguments": {"expression": "{turn}+1"}}
    return {
        "name": f"soak-{length}",
        "match": {"goal": f"SOAK-{length} "},
        "turns": [
            *(
                {"tool_calls": [call], "usage": usage, "latency_ms": LATENCY_MS}
                for _ in range(length - 1)
            ),
            {"content": "Done.", "usage": usage, "latency_ms": LATENCY_MS},
        ],
    }


def _length(index: int) -> int:
    """Model calls of run number ``index`` (``LENGTHS`` in turn)."""
    return LENGTHS[index % len(LENGTHS)]


class Operators:
    """The two operator processes, ``a`` and ``b``, sharing ``SHARDS`` shards. A process that
    exits by itself for a lost Lease (a slow API server on a loaded machine) is started again
    under its name by `revive`, as the kubelet restarts a container; any other exit of a
    process the test did not kill fails the test."""

    def __init__(self, env: dict[str, str], launch: components.Launch, kubectl: Any) -> None:
        self.env, self.launch, self.kubectl = env, launch, kubectl
        self.parts: dict[str, components.Component] = {}
        self.down: set[str] = set()
        self.restarts: list[str] = []

    def start(self, key: str) -> None:
        """Start operator ``key`` (identity ``soak-op-<key>``; a health port of its own)."""
        self.down.discard(key)
        env = {
            **self.env,
            "AGENTRUN_HEALTH_PORT": str(probes.free_port()),
            "AGENTRUN_IDENTITY": f"soak-op-{key}",
        }
        self.parts[key] = stack.start_operator(env, launch=self.launch, name=f"soak-op-{key}")

    def kill(self, key: str) -> None:
        """SIGKILL operator ``key``; `revive` leaves it down until `start`."""
        self.down.add(key)
        components.kill_component(self.parts[key])

    def revive(self) -> None:
        """Start again every process that exited for a lost Lease (AssertionError, with its
        log's tail, for any other exit of a process the test did not kill)."""
        for key, part in self.parts.items():
            if key in self.down or part.is_alive():
                continue
            assert lost_lease(part), (
                f"soak-op-{key} exited ({procs.exit_code(part.record)}):\n"
                + procs.read_log_tail(part.record.log_path)
            )
            self.restarts.append(f"soak-op-{key} lost a Lease at {time.strftime('%T')}")
            self.start(key)

    def holders(self) -> dict[int, str]:
        """Shard → the holder its Lease names, as ``kubectl get leases`` shows it."""
        out = self.kubectl("get", "leases", "-n", "default", "-o", "json").stdout
        names = {lease_name(LEASE_BASE, s, SHARDS): s for s in range(SHARDS)}
        return {
            names[item["metadata"]["name"]]: item["spec"].get("holderIdentity") or ""
            for item in json.loads(out)["items"]
            if item["metadata"]["name"] in names
        }

    def wait_held_by(self, keys: set[str], *, timeout: float) -> None:
        """Wait until every shard is held, by the processes ``keys`` only, each holding its
        fair share (the Leases; AssertionError naming the holders after `timeout` s)."""
        wanted = {f"soak-op-{k}" for k in keys}
        share = -(-SHARDS // len(keys))
        end = time.monotonic() + timeout
        while True:
            self.revive()
            counts = collections.Counter((holders := self.holders()).values())
            if len(holders) == SHARDS and set(counts) == wanted and max(counts.values()) <= share:
                return
            assert time.monotonic() < end, f"shards held {holders}; restarts {self.restarts}"
            time.sleep(0.5)

    def stop_all(self) -> None:
        """Stop every process and delete this module's shard and membership Leases."""
        for part in self.parts.values():
            if part.is_alive():
                components.stop_component(part)
        names = [lease_name(LEASE_BASE, s, SHARDS) for s in range(SHARDS)]
        names += [member_lease_name(LEASE_BASE, s) for s in range(SHARDS)]
        self.kubectl("delete", "leases", "-n", "default", "--ignore-not-found", *names)


class Soak:
    """This module's stack: the NATS cluster, the scripted model, the operators, the workers."""

    def __init__(
        self, handle: E2EStack, operators: Operators, cluster: natscluster.NatsCluster
    ) -> None:
        self.stack, self.operators, self.cluster = handle, operators, cluster


@pytest.fixture(scope="module")
def soak(
    control_plane: Any,
    crds: Any,
    kubectl: Any,
    nats_cluster: natscluster.NatsCluster,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Soak]:
    """The scripted model, two operators over ``SHARDS`` shards (Leases ``LEASE_BASE``-*) and
    three workers on this module's NATS cluster, the shards shared before it yields; stopped
    after the module, its Leases deleted."""
    launch, mock, env = model_on_cluster(
        tmp_path_factory.mktemp("soak-logs"),
        [_scenario(n) for n in LENGTHS],
        control_plane,
        nats_cluster,
    )
    # the product's status interval (5 s: at 0.5 s, 100 busy runs wrote 200 status patches a
    # second, and the bench measured the API server's queue, a turn's overhead p50 0.9 s)
    env.update(
        AGENTRUN_LEASE_NAME=LEASE_BASE,
        AGENTRUN_OPERATOR_SHARDS=str(SHARDS),
        AGENTRUN_TURN_ACK_WAIT=str(int(ACK_WAIT)),
    )
    operators = Operators(env, launch, kubectl)
    workers: list[components.Component] = []
    try:
        for key in ("a", "b"):
            operators.start(key)
        workers.extend(stack.start_worker(i, env=env, launch=launch) for i in (1, 2, 3))
        handle = E2EStack(kubectl, launch, env, mock, operators.parts["a"], workers)
        for worker in workers:
            wait_consuming(worker, timeout=60)
        operators.wait_held_by({"a", "b"}, timeout=60)
        kubectl("apply", "-f", "-", input=yaml.safe_dump(mock_model(stack.mockllm_url(mock))))
        yield Soak(handle, operators, nats_cluster)
    finally:
        for component in [*workers, mock]:
            components.stop_component(component)
        operators.stop_all()


@pytest.fixture
def tenants(soak: Soak) -> Iterator[dict[str, str]]:
    """``TENANTS`` AgentTenants, each binding a fresh namespace, every shard holding one at
    least (so whichever operator is killed owned some): tenant → namespace."""
    made: dict[str, str] = {}
    try:
        while len(made) < TENANTS:
            namespace = f"agentrun-test-{uuid.uuid4().hex[:8]}"
            taken = {shard_of(t, SHARDS) for t in made}
            if len(taken) < SHARDS and shard_of(f"soak-{namespace}", SHARDS) in taken:
                continue
            soak.stack.kubectl("create", "namespace", namespace)
            made[f"soak-{namespace}"] = namespace
        for name, namespace in made.items():
            tenant = tenant_manifest(name, namespace, tokens=100_000_000, concurrent=CONCURRENCY)
            soak.stack.kubectl("apply", "-f", "-", input=yaml.safe_dump(tenant))
        for name in made:
            soak.stack.wait_tenant_observed(name, timeout=60)
        yield made
    finally:
        for name, namespace in made.items():  # 2,000 runs take longer than a minute to delete
            kubectl = soak.stack.kubectl
            kubectl("delete", "agentruns", "--all", "-n", namespace, "--wait=false", timeout=300)
            kubectl("delete", "agenttenant", name, "--ignore-not-found", "--wait=false")
            delete_namespace(kubectl, namespace)


class Chaos:
    """The faults, each recorded as a window ``(kind, start, end)`` of wall-clock seconds
    (the time JetStream stamps and the scripted model record are on the same clock)."""

    def __init__(self, soak_: Soak, admin_: Admin) -> None:
        self.soak, self.admin = soak_, admin_
        self.windows: list[tuple[str, float, float]] = []
        self.worker_kills: list[float] = []
        self.rounds = 0

    def nats_server(self) -> None:
        """SIGKILL the server leading the run events' stream, 3 s down, start it again on its
        store and wait until it is a current replica of every stream and consumer."""
        start = time.time()
        victim = self.admin.leader(protocol.STREAM_EVENTS)
        server = server_named(self.soak.cluster, victim)
        components.kill_component(server.component)
        time.sleep(3.0)  # the load goes on two servers a while
        server.restart()  # its ports and store
        natscluster.wait_caught_up(self.soak.cluster, victim, timeout=120)
        self.windows.append(("nats-server", start, time.time()))

    def operator(self) -> None:
        """Kill the holder of the most shards; the other takes them all; the victim comes
        back under its name and the shards are shared again."""
        ops = self.soak.operators
        start = time.time()
        counts = collections.Counter(ops.holders().values())
        victim = counts.most_common(1)[0][0].removeprefix("soak-op-")
        other = next(k for k in ops.parts if k != victim)
        ops.kill(victim)
        ops.wait_held_by({other}, timeout=TAKEOVER)
        ops.start(victim)
        ops.wait_held_by({victim, other}, timeout=TAKEOVER)
        self.windows.append(("operator", start, time.time()))

    def worker(self) -> None:
        """Kill the worker whose turn is next in line (round robin), start it again at once;
        its turns wait the ack wait, which the window covers."""
        workers = self.soak.stack.workers
        index = self.rounds % len(workers)
        start = time.time()
        components.kill_component(workers[index])
        self.worker_kills.append(start)
        time.sleep(1.0)
        workers[index] = stack.start_worker(
            index + 1, env=self.soak.stack.env, launch=self.soak.stack.launch
        )
        wait_consuming(workers[index], timeout=60)
        self.windows.append(("worker", start, start + ACK_WAIT + 5.0))

    def round(self) -> None:
        """One of each fault, in turn, 2 s apart."""
        for fault in (self.nats_server, self.operator, self.worker):
            fault()
            time.sleep(2.0)
        self.rounds += 1

    def quiet_for(self) -> float:
        """Seconds since the last fault's window ended."""
        return time.time() - max((e for _, _, e in self.windows), default=0.0)

    def during(self, start: float, end: float) -> bool:
        """Whether ``[start, end]`` overlaps a fault's window."""
        return any(s <= end and start <= e for _, s, e in self.windows)


def _statuses(soak_: Soak, tenants: dict[str, str]) -> dict[str, list[dict[str, Any]]]:
    """Tenant → its runs' status (``name`` and ``uid`` added); revives operators that gave a
    Lease up."""
    soak_.operators.revive()
    found: dict[str, list[dict[str, Any]]] = {}
    for tenant, namespace in tenants.items():
        out = soak_.stack.kubectl("get", "agentruns", "-n", namespace, "-o", "json").stdout
        found[tenant] = [
            {**(i.get("status") or {}), "name": i["metadata"]["name"], "uid": i["metadata"]["uid"]}
            for i in json.loads(out)["items"]
        ]
    return found


def _ended(statuses: dict[str, list[dict[str, Any]]]) -> int:
    """How many of the runs in ``statuses`` (`_statuses`) have a terminal reason."""
    return sum(1 for runs in statuses.values() for s in runs if s.get("terminalReason"))


def _wait_all_ended(
    soak_: Soak,
    tenants: dict[str, str],
    chaos: Chaos,
    admin_: Admin,
    created: concurrent.futures.Future[None],
) -> dict[str, list[dict[str, Any]]]:
    """Go round the faults while runs are being created or queued, then every run's status
    once all ended (raising what the creation raised, if it failed). Progress is judged per
    tenant, since a queued run waits for its tenant's others: a tenant with runs left whose
    runs show no change (steps, phase, end) for ``STALL`` s fails the test, naming its first
    unfinished run."""
    total = RUNS_PER_TENANT * len(tenants)
    seen: dict[str, tuple[Any, ...]] = {}
    moved: dict[str, float] = {}
    while True:
        if created.done():
            created.result()
        statuses = _statuses(soak_, tenants)
        if _ended(statuses) == total:
            return statuses
        queued = not created.done() or _ended(statuses) < total - CONCURRENCY * len(tenants)
        if queued and chaos.rounds < ROUNDS and chaos.quiet_for() >= QUIET:
            chaos.round()  # another round while the load lasts
            seen.clear()  # progress is judged from the end of the round
            continue
        now = time.monotonic()
        for tenant, runs in statuses.items():
            left = [s for s in runs if not s.get("terminalReason")]
            mark = tuple(
                sorted(
                    (s["name"], (s.get("usage") or {}).get("steps"), s.get("phase")) for s in left
                )
            )
            if seen.get(tenant) != mark:
                seen[tenant], moved[tenant] = mark, now
            if left and now - moved[tenant] > STALL:
                first = left[0]
                raise AssertionError(
                    f"{tenant}: no run moved for {STALL} s; {first['name']}: "
                    f"{admin_.diagnose(tenants[tenant], first['name'], first['uid'])}; "
                    f"operator restarts: {soak_.operators.restarts or 'none'}"
                )
        time.sleep(1.0)


GoalKey = tuple[str, str]
"""(namespace, run name)."""
GOAL = re.compile(r"SOAK-\d+ ([a-z0-9-]+)/(r\d+)")


def _asked(soak_: Soak, tenants: dict[str, str]) -> dict[GoalKey, dict[int, list[float]]]:
    """(namespace, run) → turn → the times the scripted model was asked for it."""
    namespaces = set(tenants.values())
    asked: dict[GoalKey, dict[int, list[float]]] = collections.defaultdict(
        lambda: collections.defaultdict(list)
    )
    for request in soak_.stack.mock_requests():
        found = GOAL.search(json.dumps(request["body"]))
        if found is not None and found.group(1) in namespaces:
            key = (found.group(1), found.group(2))
            asked[key][int(request["turn"])].append(float(request["time"]))
    return asked


class FromEvents:
    """What the run event streams say: each committed turn (``commits``: (namespace, run) →
    turn → how many ``turn`` events), and a turn's overhead in milliseconds from turn n's
    committed event (JetStream's stamp) to the model's last request of turn n+1, outside
    every fault's window (``outside``) and within one (``during``)."""

    def __init__(
        self, admin_: Admin, asked: dict[GoalKey, dict[int, list[float]]], chaos: Chaos
    ) -> None:
        self.commits: dict[GoalKey, collections.Counter[int]] = {}
        self.outside: list[float] = []
        self.during: list[float] = []
        for key, turns in asked.items():
            counted = self.commits.setdefault(key, collections.Counter())
            for event, stored in admin_.events(*key):
                record = event.record if event.kind == "turn" else None
                if record is None:
                    continue
                counted[record.turn] += 1
                if record.turn + 1 in turns:
                    arrival = max(turns[record.turn + 1])
                    gap = (arrival - stored) * 1000
                    (self.during if chaos.during(stored, arrival) else self.outside).append(gap)

    def lost_and_twice(self, runs: list[GoalKey]) -> tuple[int, int]:
        """(turns of ``runs`` never committed, turns committed more than once or past the
        script's end): each run's ``turn`` events against its script's length."""
        lost = twice = 0
        for key in runs:
            counted = self.commits.get(key, collections.Counter())
            length = _length(int(key[1][1:]))
            lost += sum(1 for turn in range(length) if counted[turn] == 0)
            twice += sum(n - 1 for n in counted.values() if n > 1)
            twice += sum(n for turn, n in counted.items() if turn >= length)
        return lost, twice


def _spread(values: list[float]) -> dict[str, Any]:
    """``{"n", "p50", "p99"}`` of ``values`` (rounded to 0.1; None when there are none)."""
    if not values:
        return {"n": 0, "p50": None, "p99": None}
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    return {"n": len(values), "p50": round(statistics.median(ordered), 1), "p99": round(p99, 1)}


def _books(
    admin_: Admin,
    tenants: dict[str, str],
    statuses: dict[str, list[dict[str, Any]]],
    allowance: collections.Counter[str],
) -> dict[str, dict[str, Any]]:
    """Differences by tenant: runs whose status shows other steps than their script's
    length; the settled book against the sum of the runs' usage (plus the calls it charged as
    abandoned, which are in no run's usage) and their scripts' tokens;
    the abandoned tokens against what the requests in no run's usage allow in the tenant's
    namespace (``allowance``: namespace → tokens, ``E2EStack.abandoned_allowance``: a call
    asked again is charged its usage, or its prompt's bound if its hold was dropped before
    its first record or its call cut)."""
    differences: dict[str, dict[str, Any]] = {}
    for tenant, runs in statuses.items():
        steps = {
            s["name"]: (s.get("usage") or {}).get("steps")
            for s in runs
            if (s.get("usage") or {}).get("steps") != _length(int(s["name"][1:]))
        }
        if steps:
            differences.setdefault(tenant, {}).update(status_steps=steps)
        book = settled(admin_, tenant)
        tokens = sum(int(s["usage"]["totalTokens"]) for s in runs)
        cost = sum((Decimal(s["usage"]["costUSD"]) for s in runs), Decimal(0))
        expected = sum(_length(int(s["name"][1:])) for s in runs) * CALL_TOKENS
        spent = (tokens + book.abandoned_tokens, cost + book.abandoned_cost, expected)
        if (book.used_tokens, book.used_cost, tokens) != spent:
            differences.setdefault(tenant, {}).update(
                ledger=[book.used_tokens, str(book.used_cost)],
                runs=[tokens, str(cost)],
                scripts=expected,
            )
        allowed = allowance[tenants[tenant]]
        if book.abandoned_tokens > allowed:
            differences.setdefault(tenant, {}).update(
                abandoned=book.abandoned_tokens, allowed=allowed
            )
    return differences


def _create(soak_: Soak, items: list[dict[str, Any]]) -> None:
    """Create ``items`` (AgentRuns), ``CHUNK`` to a ``kubectl apply``: one apply of thousands
    outlasts kubectl's timeout."""
    for at in range(0, len(items), CHUNK):
        body = {"apiVersion": "v1", "kind": "List", "items": items[at : at + CHUNK]}
        soak_.stack.kubectl("apply", "-f", "-", input=yaml.safe_dump(body))


def test_load_held_while_a_nats_server_an_operator_and_a_worker_die_in_turn(
    soak: Soak, tenants: dict[str, str], admin: Admin
) -> None:
    assert set(admin.replicas().values()) == {3}, admin.replicas()
    total = RUNS_PER_TENANT * len(tenants)
    items = []
    for i in range(RUNS_PER_TENANT):  # the tenants' runs interleaved: all loaded from the start
        for namespace in tenants.values():
            goal = f"SOAK-{_length(i)} {namespace}/r{i:03d}"
            item = run_manifest(f"r{i:03d}", goal, tools=["calculate"])
            item["metadata"]["namespace"] = namespace
            items.append(item)
    began = time.time()
    chaos = Chaos(soak, admin)
    with concurrent.futures.ThreadPoolExecutor(1) as creator:
        # created while the faults go: 2,000 runs take minutes through one API server
        created = creator.submit(_create, soak, items)
        end = time.monotonic() + 120
        while len(soak.stack.mock_requests()) < 20:
            assert time.monotonic() < end, "the load did not start"
            if created.done():
                created.result()  # raises what the creation raised
            time.sleep(0.5)
        chaos.round()
        assert _ended(_statuses(soak, tenants)) < total, "the load was over before its round"
        statuses = _wait_all_ended(soak, tenants, chaos, admin, created)
    finished = time.time()

    reasons = collections.Counter(s.get("terminalReason") for r in statuses.values() for s in r)
    asked = _asked(soak, tenants)
    again = {
        (key, turn): times
        for key, turns in asked.items()
        for turn, times in turns.items()
        if len(times) > 1
    }
    used = {
        f"{tenants[t]}/{s['name']}": int(s["usage"]["totalTokens"])
        for t, runs_ in statuses.items()
        for s in runs_
    }
    kills = [*chaos.worker_kills, *(s for kind, s, _ in chaos.windows if kind == "nats-server")]
    allowance = soak.stack.abandoned_allowance(
        "SOAK-", lambda run: used.get(run, 0) // CALL_TOKENS, call_tokens=CALL_TOKENS, kills=kills
    )
    differences = _books(admin, tenants, statuses, allowance)
    events = FromEvents(admin, asked, chaos)
    runs = [(tenants[t], s["name"]) for t, runs_ in statuses.items() for s in runs_]
    lost, committed_twice = events.lost_and_twice(runs)
    report = {
        "runs": total,
        "tenants": len(tenants),
        "rounds": chaos.rounds,
        "faults": [
            (kind, round(s - began, 1), round(e - began, 1)) for kind, s, e in chaos.windows
        ],
        "completed": reasons.get("completed", 0),
        "turns_lost": lost,
        "turns_committed_twice": committed_twice,
        "calls_asked_again": len(again),
        "ledger_differences": differences,
        "overhead_ms_outside_faults": _spread(events.outside),
        "overhead_ms_during_faults": _spread(events.during),
        "longest_wait_s": round(max([*events.outside, *events.during]) / 1000, 1),
        "seconds": round(finished - began, 1),
        "operator_restarts": soak.operators.restarts,
    }
    print(json.dumps(report, indent=2))
    if os.environ.get("AGENTRUN_SOAK_REPORT"):
        Path(os.environ["AGENTRUN_SOAK_REPORT"]).write_text(json.dumps(report, indent=2))

    assert reasons == {"completed": total}, reasons
    assert (lost, committed_twice, differences) == (0, 0, {}), report
    assert len(asked) == total, f"{len(asked)} runs asked the model"
    for (key, turn), times in again.items():
        assert len(times) == 2, (key, turn, times)
        assert any(
            kill - IN_FLIGHT <= times[0] <= kill <= times[1] for kill in chaos.worker_kills
        ), f"{key} turn {turn} asked again at {times}, not across a worker's kill"
    for turns in asked.values():
        assert set(turns) == set(range(len(turns))), turns
    end = time.monotonic() + 30
    while (queued := admin.turns_queued()) != 0:
        assert time.monotonic() < end, f"{queued} TurnRequests left after every run ended"
        time.sleep(0.5)
