"""Two operator processes: at most one acts (the leader Lease), the standby takes over within a
bound when the leader is SIGKILLed, no run is stuck or committed twice, status never moves
backwards and every end is counted once."""

from __future__ import annotations

import datetime
import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from agentrun_dev import components, probes, stack
from agentrun_dev.natsserver import NatsServer

from .conftest import EXAMPLES, E2EStack, http_get, run_manifest
from .events import read_events, turn_numbers
from .test_telemetry import metric
from .test_tenants import TenantFactory, tenants  # noqa: F401

pytestmark = pytest.mark.e2e

LEASE_DURATION = 8.0
"""``AGENTRUN_LEASE_DURATION`` of the e2e stack (``stack.service_env``)."""
LEASE_RETRY = 1.0
"""``AGENTRUN_LEASE_RETRY`` of the e2e stack."""
TAKEOVER_BOUND = LEASE_DURATION + 2 * LEASE_RETRY + 3.0
"""Seconds from the leader's SIGKILL to the standby holding the Lease (its ``acquireTime``):
the Lease duration from the standby's last sight of a renewal (up to a retry before the
kill), its next attempt (a retry), and a Lease read and write on a busy machine."""
START_BOUND = 30.0
"""Seconds from the Lease taken to the new leader ready: kopf's start (listing runs,
connecting to NATS), which docs/operations.md leaves unbounded ("plus its start"), on a
loaded 2-core machine."""
LEASE = "agentrun-operator"
"""``AGENTRUN_LEASE_NAME`` of the e2e stack (one shard: the Lease itself), in ``default``."""


def readiness(port: int) -> tuple[int, str]:
    """GET /readyz: (status, body); (0, "") when nothing answers."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as answer:
            return int(answer.status), answer.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()
    except OSError:
        return 0, ""


def kill_leader(pair: Pair) -> float:
    """SIGKILL ``a``, wait until ``b`` holds the Lease and is ready as the leader; returns the
    seconds from the kill to the Lease's ``acquireTime`` (``b``'s clock, this machine's)."""
    killed = time.time()
    components.kill_component(pair.parts["a"])
    wait_role(pair.ports["b"], "leader", timeout=TAKEOVER_BOUND + START_BOUND)
    lease = json.loads(
        pair.stack.kubectl("get", "lease", LEASE, "-n", "default", "-o", "json").stdout
    )
    assert lease["spec"]["holderIdentity"] == "operator-b", lease["spec"]
    acquired = datetime.datetime.fromisoformat(lease["spec"]["acquireTime"].replace("Z", "+00:00"))
    return acquired.timestamp() - killed


def wait_role(port: int, role: str, *, timeout: float) -> float:
    """Wait until /readyz says ``ready <role>``; returns the seconds it took."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if readiness(port) == (200, f"ready {role}\n"):
            return time.monotonic() - started
        time.sleep(0.1)
    raise AssertionError(f"not 'ready {role}' within {timeout}s: {readiness(port)}")


class Pair:
    """Two operators with their own metrics and health ports; ``a`` leads, ``b`` stands by."""

    def __init__(self, stack_: E2EStack) -> None:
        self.stack = stack_
        self.ports = {"a": probes.free_port(), "b": probes.free_port()}
        self.parts: dict[str, components.Component] = {}

    def start(self, key: str) -> components.Component:
        env = {
            **self.stack.env,
            "AGENTRUN_HEALTH_PORT": str(self.ports[key]),
            "AGENTRUN_IDENTITY": f"operator-{key}",
        }
        started = stack.start_operator(env, launch=self.stack.launch, name=f"operator-{key}")
        self.parts[key] = started
        return started

    def ended(self, key: str, tenant: str) -> float:
        """Runs of ``tenant`` operator ``key`` counted as ended (earlier tests' runs, still
        going in other namespaces, end meanwhile too: they are counted under their tenant)."""
        text = http_get(f"http://127.0.0.1:{self.parts[key].ports['metrics']}/metrics")
        return metric(text, "agentrun_runs_total", tenant=tenant)


@pytest.fixture
def pair(stack_: E2EStack) -> Iterator[Pair]:
    """Stops the stack's operator (a graceful stop releases the Lease), starts ``a`` (leader)
    then ``b`` (standby); afterwards the stack keeps a live one of them."""
    components.stop_component(stack_.operator)
    both = Pair(stack_)
    both.start("a")
    wait_role(both.ports["a"], "leader", timeout=30)
    both.start("b")
    wait_role(both.ports["b"], "standby", timeout=30)
    yield both
    alive = [c for c in both.parts.values() if c.is_alive()]
    for extra in alive[1:]:
        components.stop_component(extra)
    if alive:
        stack_.operator = alive[0]


def rectangles(stack_: E2EStack, namespace: str, count: int) -> list[str]:
    """Apply ``count`` copies of examples/rectangle.yaml; their names."""
    manifest: dict[str, Any] = yaml.safe_load((EXAMPLES / "rectangle.yaml").read_text())
    names = [f"rectangle-{i:02d}" for i in range(count)]
    documents = []
    for name in names:
        copy = {**manifest, "metadata": {"name": name}}
        documents.append(copy)
    stack_.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump_all(documents))
    return names


def finished(status: dict[str, Any]) -> bool:
    conditions = {c["type"]: c["status"] for c in status.get("conditions") or []}
    return bool(status.get("terminalReason")) and conditions.get("Finished") == "True"


def assert_completed_once(
    stack_: E2EStack, namespace: str, name: str, *, turns: int, nats_url: NatsServer
) -> dict[str, Any]:
    status = stack_.wait_for(namespace, name, finished, timeout=90)
    assert (status["phase"], status["terminalReason"]) == ("Succeeded", "completed"), status
    assert status["usage"]["steps"] == turns
    assert turn_numbers(read_events(nats_url, namespace, name)) == list(range(turns))
    obj = stack_.get(namespace, name)
    assert obj is not None and not obj["metadata"].get("finalizers")  # runs hold none
    return status


def test_d01_twenty_rectangles_with_two_operators_only_the_leader_acts(
    pair: Pair,
    test_namespace: str,
    nats_server: Any,
    tenants: TenantFactory,  # noqa: F811
) -> None:
    """A second operator beside the first and 20 copies of rectangle.yaml, in a tenant of
    their own. Every run ends Succeeded with Finished=True, each turn committed once; the
    leader counts 20 ends, the standby none — also after it takes over and sees all 20
    again."""
    tenant = tenants(f"t-{test_namespace}", [test_namespace], maxConcurrentRuns=20)
    before_a, before_b = pair.ended("a", tenant), pair.ended("b", tenant)
    names = rectangles(pair.stack, test_namespace, 20)
    for name in names:
        assert_completed_once(pair.stack, test_namespace, name, turns=2, nats_url=nats_server)
    # the leader counts an end once its status patch is written, so the count may trail the
    # status read above: poll for it
    deadline = time.monotonic() + 15
    while pair.ended("a", tenant) - before_a < 20 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert pair.ended("a", tenant) - before_a == 20
    assert pair.ended("b", tenant) - before_b == 0
    settled = {n: pair.stack.get(test_namespace, n) for n in names}

    took = kill_leader(pair)
    # a negative check: the new leader lists every run and re-reads its events (well under a
    # second for 20 runs); a double count or a status write would show within these 3 s
    time.sleep(3.0)
    assert pair.ended("b", tenant) - before_b == 0, "an end was counted twice across the failover"
    for name in names:
        obj = pair.stack.get(test_namespace, name)
        assert obj is not None
        before = settled[name]
        assert before is not None
        assert obj["status"] == before["status"], f"{name}'s status moved after the failover"
    assert took < TAKEOVER_BOUND


def test_the_standby_takes_over_a_leader_killed_mid_flight(
    pair: Pair, test_namespace: str, nats_server: Any
) -> None:
    """SIGKILL of the leader while 20 runs are in flight: the standby leads within the bound,
    and every run ends completed with each turn committed exactly once."""
    names = rectangles(pair.stack, test_namespace, 10)
    long_runs = [f"long-{i}" for i in range(10)]
    for name in long_runs:
        pair.stack.apply(test_namespace, run_manifest(name, "E2E-LONG job"))
    pair.stack.wait_for(
        test_namespace, long_runs[0], lambda s: (s.get("usage") or {}).get("steps", 0) >= 1
    )
    took = kill_leader(pair)
    assert took < TAKEOVER_BOUND
    for name in names:
        assert_completed_once(pair.stack, test_namespace, name, turns=2, nats_url=nats_server)
    for name in long_runs:
        status = assert_completed_once(
            pair.stack, test_namespace, name, turns=5, nats_url=nats_server
        )
        assert status["answer"] == "Finished the long job."


def test_a_gracefully_stopped_leader_hands_over_at_once(pair: Pair, test_namespace: str) -> None:
    """SIGTERM: the leader releases the Lease, the standby leads well before the Lease
    duration, and runs applied afterwards finish."""
    components.stop_component(pair.parts["a"])
    took = wait_role(pair.ports["b"], "leader", timeout=LEASE_DURATION)
    assert took < LEASE_DURATION
    pair.stack.apply(test_namespace, run_manifest("after-handover", "E2E-PARALLEL-ORDER: x"))
    assert pair.stack.wait_terminal(test_namespace, "after-handover")["terminalReason"] == (
        "completed"
    )
