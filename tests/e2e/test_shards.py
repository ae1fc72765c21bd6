"""Operators active-active by shard (``AGENTRUN_OPERATOR_SHARDS``): tenants divided among
operator processes, each shard owned through a Lease of its own.

Three operator processes, six shards, six tenants, ~200 runs of three model calls each
(``E2E-LEDGER``: known usage per call). One operator is SIGKILLed mid-load: its shards are
taken over within the Lease duration plus a retry and kopf's restart, every run completes, the
scripted model is asked once per (run, turn) — no turn dispatched by two processes — and each
tenant's ledger holds exactly the sum of its runs' usage. And: an operator added while runs go
takes its fair share (the others give shards up), no run dropped or doubled.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import re
import time
from collections.abc import Iterator
from typing import Any

import nats
import nats.js.api
import nats.js.errors
import pytest
import yaml

from agentrun import protocol
from agentrun.operator.platform.shards import shard_of
from agentrun_dev import components, probes, stack
from agentrun_dev.kubectl import create_namespace, delete_namespace

from .conftest import E2EStack, http_get, run_manifest
from .test_failover import LEASE_DURATION
from .test_ledger_invariants import Ledger

pytestmark = pytest.mark.e2e

SHARDS = 6
TENANTS = 6
RUNS_PER_TENANT = 33
"""198 runs in all (three model calls each)."""
TAKEOVER_BOUND = LEASE_DURATION + 1.0 + 10.0
"""Seconds from an operator's SIGKILL to every one of its shards held by another: the Lease
duration, a retry, and margin for a busy 2-core machine (the survivors' Lease reads)."""
MARKER = re.compile(r"E2E-LEDGER shard (\S+)")


class Operators:
    """Operator processes of one sharded install, each with its health port and identity."""

    def __init__(self, stack_: E2EStack) -> None:
        self.stack = stack_
        self.parts: dict[str, components.Component] = {}

    def start(self, key: str) -> None:
        env = {
            **self.stack.env,
            "AGENTRUN_OPERATOR_SHARDS": str(SHARDS),
            "AGENTRUN_HEALTH_PORT": str(probes.free_port()),
            "AGENTRUN_IDENTITY": f"shard-op-{key}",
        }
        self.parts[key] = stack.start_operator(env, launch=self.stack.launch, name=f"op-{key}")

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
        """Wait until every shard is held, by the operators ``keys`` only, fairly."""
        wanted = {f"shard-op-{k}" for k in keys}
        share = -(-SHARDS // len(keys))
        end = time.monotonic() + timeout
        while True:
            holders = self.holders()
            counts = collections.Counter(holders.values())
            if len(holders) == SHARDS and set(counts) == wanted and max(counts.values()) <= share:
                return holders
            assert time.monotonic() < end, f"shards not shared by {keys}: {holders}"
            time.sleep(0.5)

    def owned_gauge(self, key: str) -> set[int]:
        text = http_get(f"http://127.0.0.1:{self.parts[key].ports['metrics']}/metrics")
        found = re.findall(r'^agentrun_operator_shard_owned\{shard="(\d+)"\} 1\.0$', text, re.M)
        return {int(s) for s in found}


@pytest.fixture
def operators(stack_: E2EStack, nats_server: Any) -> Iterator[Operators]:
    """Stops the stack's operator; afterwards stops the sharded ones, deletes their shard
    consumers, and starts the stack's one (one shard) again."""
    components.stop_component(stack_.operator)
    ops = Operators(stack_)
    yield ops
    for part in ops.parts.values():
        if part.is_alive():
            components.stop_component(part)
    asyncio.run(_delete_shard_consumers(nats_server))
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
    """Six AgentTenants, each binding a fresh namespace, spread over at least four shards:
    tenant → namespace."""
    made: dict[str, str] = {}
    for _ in range(TENANTS):
        namespace = create_namespace(stack_.kubectl)
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


def _apply_runs(stack_: E2EStack, tenants: dict[str, str]) -> None:
    for namespace in tenants.values():
        runs = [
            run_manifest(f"r{i:02d}", f"E2E-LEDGER shard {namespace}/r{i:02d}", tools=["calculate"])
            for i in range(RUNS_PER_TENANT)
        ]
        body = {"apiVersion": "v1", "kind": "List", "items": runs}
        stack_.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(body))


def _statuses(stack_: E2EStack, tenants: dict[str, str]) -> dict[str, list[dict[str, Any]]]:
    found = {}
    for name, namespace in tenants.items():
        out = stack_.kubectl("get", "agentruns", "-n", namespace, "-o", "json").stdout
        found[name] = [item.get("status") or {} for item in json.loads(out)["items"]]
    return found


def _wait_ended(
    stack_: E2EStack, tenants: dict[str, str], *, during: Any = None, timeout: float = 240
) -> dict[str, list[dict[str, Any]]]:
    end = time.monotonic() + timeout
    while True:
        statuses = _statuses(stack_, tenants)
        ended = sum(1 for runs in statuses.values() for s in runs if s.get("terminalReason"))
        if during is not None:
            during(ended)
        if ended == RUNS_PER_TENANT * len(tenants):
            return statuses
        assert time.monotonic() < end, f"only {ended} runs ended in {timeout}s"
        time.sleep(1.0)


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
        deadline = time.monotonic() + 20  # the last closes land right after the last status
        while True:
            book = ledger.book(name)
            assert book is not None
            if not book.active and not book.holds:
                break
            assert time.monotonic() < deadline, f"{name}: left {book.active} {book.holds}"
            time.sleep(0.5)
        assert book.used_tokens == tokens, (name, book.used_tokens, tokens)


def test_three_operators_share_six_shards_and_a_killed_ones_move_within_the_lease(
    operators: Operators, tenants: dict[str, str], stack_: E2EStack, nats_server: Any
) -> None:
    """SIGKILL one of three operators mid-load: its shards are held by the two others within
    ``TAKEOVER_BOUND`` (a ``ShardTakenOver`` Event each), every run completes once, ledgers
    exact."""
    assert len({shard_of(t, SHARDS) for t in tenants}) >= 2
    for key in "abc":
        operators.start(key)
    before = operators.wait_shared(["a", "b", "c"], timeout=60)
    for key in "abc":  # the gauge agrees with the Leases
        mine = {s for s, h in before.items() if h == f"shard-op-{key}"}
        assert operators.owned_gauge(key) == mine
    victim = before[shard_of(next(iter(tenants)), SHARDS)].removeprefix("shard-op-")
    ledger = Ledger(nats_server)
    killed: list[float] = []

    def kill_once(ended: int) -> None:
        if not killed and ended >= RUNS_PER_TENANT * len(tenants) // 4:
            components.kill_component(operators.parts[victim])
            killed.append(time.monotonic())

    try:
        _apply_runs(stack_, tenants)
        statuses = _wait_ended(stack_, tenants, during=kill_once)
        assert killed, "the runs ended before the kill"
        survivors = [k for k in "abc" if k != victim]
        after = operators.wait_shared(survivors, timeout=1.0)  # long since moved
        _check_once_each(stack_, tenants)
        _check_ledgers(ledger, statuses)
    finally:
        ledger.close()
    moved = sorted(s for s, h in before.items() if h == f"shard-op-{victim}")
    assert all(after[s] != before[s] for s in moved)
    events = stack_.kubectl(
        "get", "events", "-n", "default", "--field-selector", "reason=ShardTakenOver", "-o", "json"
    ).stdout
    messages = [e["message"] for e in json.loads(events)["items"]]
    for shard in moved:
        assert any(f"shard {shard} is now owned" in m and victim in m for m in messages)


def test_the_takeover_is_within_the_bound(operators: Operators, stack_: E2EStack) -> None:
    """Timing alone, without load: SIGKILL one of two; the other holds every shard within
    ``TAKEOVER_BOUND``."""
    for key in "ab":
        operators.start(key)
    operators.wait_shared(["a", "b"], timeout=60)
    components.kill_component(operators.parts["b"])
    started = time.monotonic()
    operators.wait_shared(["a"], timeout=TAKEOVER_BOUND)
    assert time.monotonic() - started < TAKEOVER_BOUND


def test_an_operator_added_while_runs_go_takes_its_share_and_no_run_is_dropped_or_doubled(
    operators: Operators, tenants: dict[str, str], stack_: E2EStack, nats_server: Any
) -> None:
    """Two operators (three shards each); a third starts mid-load: the two give shards up
    (two each) and the third takes them; every run completes once, ledgers exact."""
    for key in "ab":
        operators.start(key)
    operators.wait_shared(["a", "b"], timeout=60)
    ledger = Ledger(nats_server)
    added: list[bool] = []

    def add_once(ended: int) -> None:
        if not added and ended >= RUNS_PER_TENANT * len(tenants) // 4:
            operators.start("c")
            added.append(True)

    try:
        _apply_runs(stack_, tenants)
        statuses = _wait_ended(stack_, tenants, during=add_once)
        assert added, "the runs ended before the third operator started"
        operators.wait_shared(["a", "b", "c"], timeout=60)
        _check_once_each(stack_, tenants)
        _check_ledgers(ledger, statuses)
    finally:
        ledger.close()
