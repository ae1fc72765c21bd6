"""Operators active-active by shard (``AGENTRUN_OPERATOR_SHARDS``): tenants divided among
operator processes, each shard owned through a Lease of its own.

Three operator processes, six shards, six tenants, ~200 runs of three model calls each
(``E2E-SHARD``: known usage per call, 0.7 s each). One operator is SIGKILLed while its
tenants' runs go: its shards are taken over within the Lease duration plus a retry and kopf's
restart, every run completes, the scripted model is asked once per (run, turn) — no turn
dispatched by two processes — and each tenant's ledger holds exactly the sum of its runs'
usage. An operator added while runs go takes its fair share (the others give shards up), no
run dropped or doubled. A process restarted under its name takes its Leases back at once, and
a stop signal releases every Lease a process holds.

The module is marked ``alone``: its takeover bounds are Lease times, and beside another load
test on two cores (the NATS server faults' 100 runs) the API server answered a ``kubectl
apply`` in over 60 s and the Leases were renewed late enough to be taken over.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import datetime
import functools
import json
import re
import time
import uuid
from collections.abc import Iterator
from typing import Any

import nats
import nats.js.api
import nats.js.errors
import pytest
import yaml

from agentrun import protocol
from agentrun.operator.platform.shards import lease_name, member_lease_name, shard_of
from agentrun_dev import components, probes, procs, stack
from agentrun_dev.kubectl import delete_namespace

from .conftest import E2EStack, http_get, lost_lease, run_manifest
from .test_failover import LEASE_DURATION
from .test_ledger_invariants import Ledger

pytestmark = [pytest.mark.e2e, pytest.mark.alone]

SHARDS = 6
TENANTS = 6
RUNS_PER_TENANT = 33
"""198 runs in all (three model calls each)."""
FIRST = 3
"""Runs of each of the victim's tenants created before it is killed (one ``kubectl apply`` of
many takes longer than those runs do); the rest are created while it is dead."""
TAKEOVER_BOUND = LEASE_DURATION + 1.0 + 10.0
"""Seconds from an operator's SIGKILL to every one of its shards held by another: the Lease
duration, a retry, and margin for a busy 2-core machine (the survivors' Lease reads)."""
BASE = "agentrun-operator"
"""``AGENTRUN_LEASE_NAME`` of the e2e stack: the shard Leases are ``<BASE>-<shard>``."""
MARKER = re.compile(r"E2E-SHARD (\S+)")


class Operators:
    """Operator processes of one sharded install, each with its health port and identity.

    Like the Deployment's pods they stand for, a process that exits by itself because it lost
    a Lease (status ``LOST_LEADERSHIP_EXIT`` after "no renewal of the Lease": the API server
    slow for the renew deadline on a busy machine) is started again under its name by
    `revive`, which the waits call; `restarts` lists each such restart, and any other exit
    (a Lease "taken over by" another process included) fails the test. Takeover times are
    read from the ``ShardTakenOver`` Events (`_taken_at`), which a later restart does not
    change.
    """

    def __init__(self, stack_: E2EStack) -> None:
        self.stack = stack_
        self.parts: dict[str, components.Component] = {}
        self.down: set[str] = set()
        """Keys the test stopped or killed itself: not restarted."""
        self.restarts: list[str] = []

    def start(self, key: str) -> None:
        self.down.discard(key)
        env = {
            **self.stack.env,
            "AGENTRUN_OPERATOR_SHARDS": str(SHARDS),
            "AGENTRUN_HEALTH_PORT": str(probes.free_port()),
            "AGENTRUN_IDENTITY": f"shard-op-{key}",
        }
        self.parts[key] = stack.start_operator(env, launch=self.stack.launch, name=f"op-{key}")

    def kill(self, key: str) -> None:
        """SIGKILL operator ``key`` (not restarted by `revive`)."""
        self.down.add(key)
        components.kill_component(self.parts[key])

    def revive(self) -> None:
        """Start again, under its name, every process that exited by itself for a lost Lease,
        as the kubelet restarts a pod's container; fail on any other exit."""
        for key, part in self.parts.items():
            if key in self.down or part.is_alive():
                continue
            assert lost_lease(part), (  # e.g. "taken over by"
                f"op-{key} exited ({procs.exit_code(part.record)}):\n"
                + procs.read_log_tail(part.record.log_path)
            )
            self.restarts.append(f"op-{key} lost a Lease at {time.strftime('%H:%M:%S')}")
            self.start(key)

    def holders(self) -> dict[int, str]:
        """Shard → holderIdentity of its Lease, as ``kubectl get leases`` shows it."""
        out = self.stack.kubectl("get", "leases", "-n", "default", "-o", "json").stdout
        found: dict[int, str] = {}
        for lease in json.loads(out)["items"]:
            match = re.fullmatch(r"agentrun-operator-(\d+)", lease["metadata"]["name"])
            if match:
                found[int(match.group(1))] = lease["spec"].get("holderIdentity") or ""
        return found

    def wait_shared(self, keys: list[str], *, timeout: float) -> dict[int, str]:
        """Wait until every shard is held, by the operators ``keys`` only, fairly, and each of
        them counts as its own exactly the shards its Leases name (a Lease naming a process
        that does not renew it would leave its shard unserved)."""
        wanted = {f"shard-op-{k}" for k in keys}
        share = -(-SHARDS // len(keys))
        end = time.monotonic() + timeout
        while True:
            self.revive()
            holders = self.holders()
            counts = collections.Counter(holders.values())
            if len(holders) == SHARDS and set(counts) == wanted and max(counts.values()) <= share:
                served = {k: self.owned_gauge(k) for k in keys}
                if all(
                    served[k] == {s for s, h in holders.items() if h == f"shard-op-{k}"}
                    for k in keys
                ):
                    return holders
            assert time.monotonic() < end, (
                f"shards not shared by {keys}: {holders}; restarts: {self.restarts}"
            )
            time.sleep(0.5)

    def consumer_gauges(self, key: str) -> set[str]:
        """The event consumers operator ``key`` exports the lag of (its shards' only)."""
        text = http_get(f"http://127.0.0.1:{self.parts[key].ports['metrics']}/metrics")
        found = re.findall(
            r'^agentrun_jetstream_consumer_pending\{consumer="([^"]+)"\}', text, re.M
        )
        return {c for c in found if c.startswith(BASE)}

    def stop(self, key: str) -> None:
        """SIGTERM operator ``key``: it stops within the stop timeout (10 s), SIGKILL not
        needed, and gives its shards up."""
        self.down.add(key)
        outcome = components.stop_component(self.parts[key])
        assert outcome is procs.StopOutcome.STOPPED, f"op-{key}: {outcome}"
        left = {s for s, h in self.holders().items() if h == f"shard-op-{key}"}
        assert not left, f"op-{key} stopped still named by the Leases of shards {left}"

    def owned_gauge(self, key: str) -> set[int]:
        text = http_get(f"http://127.0.0.1:{self.parts[key].ports['metrics']}/metrics")
        found = re.findall(r'^agentrun_operator_shard_owned\{shard="(\d+)"\} 1\.0$', text, re.M)
        return {int(s) for s in found}


@pytest.fixture
def operators(stack_: E2EStack, nats_server: Any) -> Iterator[Operators]:
    """Stops the stack's operator; afterwards stops the sharded ones, deletes their shard
    consumers and their Leases (a process killed in one test would count as live for a Lease
    duration in the next one's new processes), and starts the stack's one (one shard) again."""
    components.stop_component(stack_.operator)
    ops = Operators(stack_)
    yield ops
    for part in ops.parts.values():
        if part.is_alive():
            components.stop_component(part)
    asyncio.run(_delete_shard_consumers(nats_server))
    names = [lease_name(BASE, s, SHARDS) for s in range(SHARDS)]
    names += [member_lease_name(BASE, s) for s in range(SHARDS)]
    stack_.kubectl("delete", "leases", "-n", "default", "--ignore-not-found", *names)
    stack_.operator = stack.start_operator(stack_.env, launch=stack_.launch)


async def _delete_shard_consumers(server: Any) -> None:
    """Delete the shard consumers, and seat ``agentrun-operator`` after the furthest of their
    ack floors: the stack's operator (one shard) does not handle this test's events again."""
    client = await nats.connect(**server.client_options())
    jsm = client.jetstream()._jsm
    events = protocol.STREAM_EVENTS
    try:
        floor = 0
        for shard in range(SHARDS):
            name = protocol.operator_consumer(shard, SHARDS)
            with contextlib.suppress(nats.js.errors.NotFoundError):
                info = await jsm.consumer_info(events, name)
                floor = max(floor, int(info.ack_floor.stream_seq or 0) if info.ack_floor else 0)
                await jsm.delete_consumer(events, name)
        if floor:
            config = (await jsm.consumer_info(events, protocol.OPERATOR_CONSUMER)).config
            await jsm.delete_consumer(events, protocol.OPERATOR_CONSUMER)
            config.deliver_policy = nats.js.api.DeliverPolicy.BY_START_SEQUENCE
            config.opt_start_seq = floor + 1
            await jsm.add_consumer(events, config=config)
    finally:
        await client.close()


@pytest.fixture
def tenants(stack_: E2EStack) -> Iterator[dict[str, str]]:
    """Six AgentTenants, each binding a fresh namespace, one tenant on each of the six shards
    (so a killed operator's fair share is a proper subset of them): tenant → namespace.

    Names are drawn until their shards differ: six random names fell on the two shards of one
    operator in CI, leaving no other tenant's runs to create."""
    made: dict[str, str] = {}
    while len(made) < TENANTS:
        namespace = f"agentrun-test-{uuid.uuid4().hex[:8]}"
        if shard_of(f"shard-{namespace}", SHARDS) in {shard_of(t, SHARDS) for t in made}:
            continue
        stack_.kubectl("create", "namespace", namespace)
        made[f"shard-{namespace}"] = namespace
    for name, namespace in made.items():
        tenant = {
            "apiVersion": "agentrun.dev/v1alpha1",
            "kind": "AgentTenant",
            "metadata": {"name": name},
            "spec": {"namespaces": [namespace], "budget": {"tokens": 10_000_000}},
        }
        stack_.kubectl("apply", "-f", "-", input=yaml.safe_dump(tenant))
    yield made
    for name, namespace in made.items():
        stack_.kubectl("delete", "agentruns", "--all", "-n", namespace, "--wait=false")
        stack_.kubectl("delete", "agenttenant", name, "--ignore-not-found", "--wait=false")
        delete_namespace(stack_.kubectl, namespace)


def _apply_runs(stack_: E2EStack, tenants: dict[str, str], runs: range | None = None) -> None:
    """Create runs ``runs`` (default: all ``RUNS_PER_TENANT``) in every tenant's namespace,
    in one ``kubectl apply``."""
    items = []
    for namespace in tenants.values():
        for i in runs or range(RUNS_PER_TENANT):
            item = run_manifest(f"r{i:02d}", f"E2E-SHARD {namespace}/r{i:02d}", tools=["calculate"])
            item["metadata"]["namespace"] = namespace
            items.append(item)
    body = {"apiVersion": "v1", "kind": "List", "items": items}
    stack_.kubectl("apply", "-f", "-", input=yaml.safe_dump(body))


def _runs(stack_: E2EStack, tenants: dict[str, str]) -> dict[str, list[dict[str, Any]]]:
    """Tenant → its AgentRuns as the API server holds them."""
    found = {}
    for name, namespace in tenants.items():
        out = stack_.kubectl("get", "agentruns", "-n", namespace, "-o", "json").stdout
        found[name] = json.loads(out)["items"]
    return found


def _statuses(stack_: E2EStack, tenants: dict[str, str]) -> dict[str, list[dict[str, Any]]]:
    return {
        name: [item.get("status") or {} for item in items]
        for name, items in _runs(stack_, tenants).items()
    }


def _unended(runs: dict[str, list[dict[str, Any]]], holders: dict[int, str]) -> str:
    """The runs not ended, with their tenant's shard and its holder, phase, reason for
    waiting and last event: what a stall looks like."""
    lines = []
    for tenant, items in runs.items():
        shard = shard_of(tenant, SHARDS)
        for item in items:
            status = item.get("status") or {}
            if status.get("terminalReason"):
                continue
            meta = item["metadata"]
            annotations = {
                k: v for k, v in (meta.get("annotations") or {}).items() if "last-handled" not in k
            }
            lines.append(
                f"{meta['namespace']}/{meta['name']} shard {shard} ({holders.get(shard)!r}): "
                f"phase={status.get('phase')!r} steps={status.get('steps')!r} "
                f"seq={status.get('lastEventSequence')!r} finalizers={meta.get('finalizers')} "
                f"annotations={annotations} conditions={status.get('conditions')}"
            )
    return "\n".join(lines[:40]) + (f"\n… {len(lines) - 40} more" if len(lines) > 40 else "")


def _wait_ended(
    stack_: E2EStack,
    tenants: dict[str, str],
    operators: Operators,
    *,
    timeout: float = 240,
) -> dict[str, list[dict[str, Any]]]:
    """Wait until every run ended; fail naming the runs that did not (``_unended``)."""
    end = time.monotonic() + timeout
    while True:
        operators.revive()
        runs = _runs(stack_, tenants)
        statuses = {
            name: [item.get("status") or {} for item in items] for name, items in runs.items()
        }
        ended = sum(1 for runs_ in statuses.values() for s in runs_ if s.get("terminalReason"))
        if ended == RUNS_PER_TENANT * len(tenants):
            return statuses
        if time.monotonic() >= end:
            raise AssertionError(
                f"only {ended} runs ended in {timeout}s (operator restarts:"
                f" {operators.restarts or 'none'}); not ended:\n"
                + _unended(runs, operators.holders())
            )
        time.sleep(1.0)


def _asked(stack_: E2EStack, namespaces: set[str]) -> bool:
    """Whether the scripted model was asked for a run of one of ``namespaces`` (its first
    turn: a run so far along has two turns to go, about 2 s)."""
    found = (MARKER.search(json.dumps(r["body"])) for r in stack_.mock_requests())
    return any(m is not None and m.group(1).split("/")[0] in namespaces for m in found)


def _check_once_each(stack_: E2EStack, tenants: dict[str, str]) -> None:
    """The scripted model was asked exactly once for each turn of each run."""
    asked: collections.Counter[tuple[str, int]] = collections.Counter()
    for request in stack_.mock_requests():
        match = MARKER.search(json.dumps(request["body"]))
        if match and match.group(1).split("/")[0] in tenants.values():
            asked[(match.group(1), int(request["turn"]))] += 1
    twice = {key: n for key, n in asked.items() if n != 1}
    assert not twice, f"turns asked of the model more than once: {twice}"
    assert len(asked) == 3 * RUNS_PER_TENANT * len(tenants)


def _check_ledgers(ledger: Ledger, statuses: dict[str, list[dict[str, Any]]]) -> None:
    for name, runs in statuses.items():
        assert {s["terminalReason"] for s in runs} == {"completed"}, name
        tokens = sum(int((s.get("usage") or {}).get("totalTokens", 0)) for s in runs)
        assert tokens == RUNS_PER_TENANT * 3 * 120
        book = ledger.settled(name, timeout=20)
        assert book.used_tokens == tokens, (name, book.used_tokens, tokens)


def test_three_operators_share_six_shards_and_a_killed_ones_move_within_the_lease(
    operators: Operators, tenants: dict[str, str], stack_: E2EStack, nats_server: Any
) -> None:
    """SIGKILL one of three operators while its tenants' runs go: its shards are held and
    served by the two others within ``TAKEOVER_BOUND`` (a ``ShardTakenOver`` Event each),
    every run completes once, ledgers exact; the survivors then stop on SIGTERM, giving their
    shards up."""
    assert len({shard_of(t, SHARDS) for t in tenants}) == TENANTS
    for key in "abc":
        operators.start(key)
    before = operators.wait_shared(["a", "b", "c"], timeout=60)
    victim = before[shard_of(next(iter(tenants)), SHARDS)].removeprefix("shard-op-")
    victims_tenants = [t for t in tenants if before[shard_of(t, SHARDS)] == f"shard-op-{victim}"]
    assert 0 < len(victims_tenants) < len(tenants), (before, victims_tenants)
    ledger = Ledger(nats_server)
    try:  # a few of the victim's runs first; it is killed once it served one, then the rest
        mine = {t: tenants[t] for t in victims_tenants}
        _apply_runs(stack_, mine, range(FIRST))
        while not _asked(stack_, set(mine.values())):  # the scripted model sees it at once
            time.sleep(0.1)
        operators.kill(victim)
        killed = time.time()  # wall clock: compared with the Leases' acquireTime
        going = [s for runs in _statuses(stack_, mine).values() for s in runs]
        assert sum(1 for s in going if not s.get("terminalReason")) >= len(going) // 2
        _apply_runs(stack_, mine, range(FIRST, RUNS_PER_TENANT))
        _apply_runs(stack_, {t: n for t, n in tenants.items() if t not in victims_tenants})
        statuses = _wait_ended(stack_, tenants, operators)
        survivors = [k for k in "abc" if k != victim]
        after = operators.wait_shared(survivors, timeout=TAKEOVER_BOUND)
        _check_once_each(stack_, tenants)
        _check_ledgers(ledger, statuses)
    finally:
        ledger.close()
    moved = sorted(s for s, h in before.items() if h == f"shard-op-{victim}")
    assert all(after[s] != before[s] for s in moved)
    taken = [_taken_at(stack_, s, was=f"shard-op-{victim}", since=killed) for s in moved]
    assert all(t is not None for t in taken), (moved, taken)  # a ShardTakenOver Event each
    assert max(t for t in taken if t is not None) - killed < TAKEOVER_BOUND, (taken, killed)
    for key in survivors:  # each exports the lag of its own shards' event consumers
        consumers = {
            protocol.operator_consumer(s, SHARDS)
            for s, h in after.items()
            if h == f"shard-op-{key}"
        }
        assert _eventually(functools.partial(operators.consumer_gauges, key), consumers), key
    for key in survivors:  # the second stops while it takes the first's shards over
        operators.stop(key)


def test_the_takeover_is_within_the_bound_and_a_restarted_process_takes_its_share_back(
    operators: Operators, stack_: E2EStack
) -> None:
    """Timing alone, without load: SIGKILL one of two; the other holds every shard within
    ``TAKEOVER_BOUND``. Then the killed one starts again under its name (a restarted
    container keeps its pod's name) and gets its share back; killed and started again at
    once, before its Leases expired, it serves its shards again at once rather than leaving
    the Leases that name it unserved."""
    for key in "ab":
        operators.start(key)
    operators.wait_shared(["a", "b"], timeout=60)
    operators.kill("b")
    started = time.monotonic()
    operators.wait_shared(["a"], timeout=TAKEOVER_BOUND)
    assert time.monotonic() - started < TAKEOVER_BOUND
    operators.start("b")
    held = operators.wait_shared(["a", "b"], timeout=TAKEOVER_BOUND)
    mine = [s for s, h in held.items() if h == "shard-op-b"]
    acquired = _acquired(stack_, mine)
    operators.kill("b")
    operators.start("b")
    again = operators.wait_shared(["a", "b"], timeout=TAKEOVER_BOUND)
    assert [s for s, h in again.items() if h == "shard-op-b"] == mine
    assert _acquired(stack_, mine) == acquired  # taken back as its own, never by "a"
    for key in "ab":
        operators.stop(key)


def test_an_operator_added_while_runs_go_takes_its_share_and_no_run_is_dropped_or_doubled(
    operators: Operators, tenants: dict[str, str], stack_: E2EStack, nats_server: Any
) -> None:
    """Two operators (three shards each) with half the runs going; a third starts, the rest of
    the runs are created (paced until it holds its share), and the two give shards up (one
    each) to the third while runs go: every run completes once, ledgers exact, and the
    third's shard Leases were acquired before the last run ended (a shard moved under load)."""
    began = time.time()
    for key in "ab":
        operators.start(key)
    operators.wait_shared(["a", "b"], timeout=60)
    ledger = Ledger(nats_server)
    half = RUNS_PER_TENANT // 2
    try:
        _apply_runs(stack_, tenants, range(half))
        operators.start("c")
        # the rest one run a tenant at a time, 2 s apart, until the third holds its share
        # (then at once): runs still go after the move however long it takes on a loaded
        # machine, up to the last one created
        share = -(-SHARDS // 3)
        for i in range(half, RUNS_PER_TENANT):
            if list(operators.holders().values()).count("shard-op-c") >= share:
                _apply_runs(stack_, tenants, range(i, RUNS_PER_TENANT))
                break
            _apply_runs(stack_, tenants, range(i, i + 1))
            time.sleep(2)
        statuses = _wait_ended(stack_, tenants, operators)
        last_end = max(
            _epoch(status["completionTime"]) for runs in statuses.values() for status in runs
        )
        holders = operators.wait_shared(["a", "b", "c"], timeout=60)
        mine = [s for s, h in holders.items() if h == "shard-op-c"]
        taken = [_taken_at(stack_, s, by="shard-op-c", since=began) for s in mine]
        # both are whole seconds (an Event's firstTimestamp, a run's completionTime): a shard
        # taken in the second the last run ended was taken under load too
        assert mine and all(t is not None and t <= last_end for t in taken), (taken, last_end)
        _check_once_each(stack_, tenants)
        _check_ledgers(ledger, statuses)
    finally:
        ledger.close()


def _on_two_holders(holders: dict[int, str]) -> tuple[str, str]:
    """Two AgentTenant names whose shards two different processes hold."""
    while True:
        first, second = (f"{role}-{uuid.uuid4().hex[:8]}" for role in ("was", "now"))
        if holders[shard_of(first, SHARDS)] != holders[shard_of(second, SHARDS)]:
            return first, second


def _apply_tenant(stack_: E2EStack, name: str, **spec: Any) -> None:
    tenant = {"apiVersion": "agentrun.dev/v1alpha1", "kind": "AgentTenant"}
    body = {**tenant, "metadata": {"name": name}, "spec": spec}
    stack_.kubectl("apply", "-f", "-", input=yaml.safe_dump(body))


def test_a_queued_run_whose_namespace_binds_another_shards_tenant_now_is_admitted_there(
    stack_: E2EStack, operators: Operators, test_namespace: str
) -> None:
    """A queued run's AgentTenant deleted, its namespace selected by a tenant of a shard another
    process holds: that process admits and charges it (before, it stayed queued,
    ``TenantMissing``, for ever: the first process kept it for its status, the second never
    looked at the first tenant's queue)."""
    operators.start("a")
    operators.start("b")
    was, now = _on_two_holders(operators.wait_shared(["a", "b"], timeout=60))
    ns = test_namespace
    try:
        _apply_tenant(stack_, was, namespaces=[ns], maxConcurrentRuns=1)
        stack_.kubectl("label", "namespace", ns, f"agentrun-e2e-team={ns}")
        _apply_tenant(stack_, now, namespaceSelector={"matchLabels": {"agentrun-e2e-team": ns}})
        stack_.apply(ns, run_manifest("head", f"E2E-SLOW-MODEL head {ns}"))  # a 30 s call
        stack_.wait_for(ns, "head", lambda s: s.get("phase") == "Running", timeout=30)
        stack_.apply(ns, run_manifest("waiting", f"E2E-TENANT-SLOW waiting {ns}"))
        stack_.wait_for(ns, "waiting", lambda s: s.get("phase") == "Queued", timeout=30)
        stack_.kubectl("delete", "agenttenant", was, "--wait=false")
        moved = stack_.wait_terminal(ns, "waiting", timeout=45)
        assert (moved["terminalReason"], moved["tenant"]) == ("completed", now), moved
        stack_.kubectl("annotate", "agentrun", "head", "-n", ns, "agentrun.dev/cancel=true")
        assert stack_.wait_terminal(ns, "head", timeout=30)["tenant"] == was  # admitted there
    finally:
        stack_.kubectl("delete", "agenttenant", was, now, "--ignore-not-found", "--wait=false")


def _eventually(read: Any, wanted: object, *, timeout: float = 15.0) -> bool:
    """Whether ``read()`` equals ``wanted`` within ``timeout`` seconds (the gauges refresh
    every 5 s)."""
    end = time.monotonic() + timeout
    while read() != wanted:
        if time.monotonic() > end:
            return False
        time.sleep(0.5)
    return True


def _epoch(stamp: str) -> float:
    """Epoch seconds of an RFC 3339 time (``…Z`` or with microseconds)."""
    return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def _taken_at(
    stack_: E2EStack, shard: int, *, since: float, by: str = "", was: str = ""
) -> float | None:
    """Epoch seconds (whole, as ``firstTimestamp``) of the first ``ShardTakenOver`` or
    ``ShardAcquired`` Event of ``shard``'s Lease since ``since`` whose message names owner
    ``by`` and previous owner ``was`` (empty: any); None when there is none."""
    out = stack_.kubectl("get", "events", "-n", "default", "-o", "json").stdout
    times = [
        _epoch(event["firstTimestamp"])
        for event in json.loads(out)["items"]
        if event["reason"] in ("ShardTakenOver", "ShardAcquired")
        and event["involvedObject"]["name"] == f"{BASE}-{shard}"
        and f"owned by {by}" in event["message"]
        and (not was or f"(was {was})" in event["message"])
        and _epoch(event["firstTimestamp"]) >= int(since)
    ]
    return min(times, default=None)


def _acquired(stack_: E2EStack, shards: list[int]) -> list[float]:
    """Epoch seconds each of ``shards``' Leases was last acquired (``spec.acquireTime``)."""
    out = stack_.kubectl("get", "leases", "-n", "default", "-o", "json").stdout
    by_name = {lease["metadata"]["name"]: lease["spec"] for lease in json.loads(out)["items"]}
    return [_epoch(by_name[f"agentrun-operator-{s}"]["acquireTime"]) for s in shards]
