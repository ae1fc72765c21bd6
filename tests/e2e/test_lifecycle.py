"""Lifecycle hygiene: no run holds a finalizer (one an earlier version added is taken off);
runs delete (alone or with their namespace) with no operator running, and the next operator
frees the hold and slot of one that was still going; running runs deleted with their
namespace end and free their tenant's hold and slot; ttlSecondsAfterFinished deletes finished
runs with their events; an operator facing older CRDs stays not ready, says so once, and
proceeds once they are fixed."""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from agentrun_dev import binaries, components, probes, stack

from .conftest import E2EStack, run_manifest
from .events import read_book, read_events, turn_numbers, wait_answered_hold
from .test_failover import readiness
from .test_tenants import wait_tenant

pytestmark = [pytest.mark.e2e, pytest.mark.nodebinaries]  # kube-controller-manager

CRD_DIR = Path(__file__).resolve().parents[2] / "charts" / "agentrun" / "crds"
FINALIZER = "agentrun.dev/finalizer"


@pytest.fixture(scope="module")
def namespace_controller(control_plane: Any, e2e: E2EStack) -> Iterator[components.Component]:
    """kube-controller-manager running only its namespace controller: what deletes a
    namespace's objects (and waits for their finalizers) in a real cluster."""
    _, node = binaries.ensure_node_binaries()
    argv = (
        str(node.kube_controller_manager),
        f"--kubeconfig={control_plane.kubeconfig}",
        "--controllers=namespace",
        "--leader-elect=false",
        "--bind-address=127.0.0.1",
        f"--secure-port={probes.free_port()}",
        "--concurrent-namespace-syncs=4",
    )
    spec = e2e.launch.spec("namespace-controller", argv)
    started = e2e.launch.start(spec, probe=None, ports={})
    yield started
    components.stop_component(started)


def finalizers(stack_: E2EStack, namespace: str, name: str) -> list[str]:
    obj = stack_.get(namespace, name)
    assert obj is not None
    return list(obj["metadata"].get("finalizers") or [])


def wait_until(check: Any, *, timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if check():
            return
        time.sleep(0.25)
    raise AssertionError(f"{what} not within {timeout}s")


def namespace_gone(stack_: E2EStack, namespace: str) -> bool:
    found = stack_.kubectl("get", "namespace", namespace, check=False)
    return found.returncode != 0 and "NotFound" in found.stderr


def holds_of(nats_server: Any, tenant: str, uid: str) -> list[str]:
    """What the tenant's ledger still holds of run ``uid``: its active entry, its holds."""
    book = read_book(nats_server, tenant)
    assert book is not None
    held = [key for key, hold in book.holds.items() if hold.run_uid == uid]
    return (["active"] if uid in book.active else []) + held


def test_d02_runs_hold_no_finalizer_and_delete_with_no_operator_running(
    stack_: E2EStack,
    namespace_controller: components.Component,
    test_namespace: str,
    nats_server: Any,
) -> None:
    """No run holds a finalizer, running or finished, and kopf takes off the one an earlier
    version added. With the operator stopped a finished run deletes, so does one still going,
    and so does a namespace holding runs; the next leader purges the events of the runs deleted
    meanwhile and frees the hold and slot of the one that was still going."""
    for name in ("alone", "with-namespace"):
        stack_.apply(test_namespace, run_manifest(name, f"E2E-PARALLEL-ORDER: {name}"))
        status = stack_.wait_terminal(test_namespace, name)
        assert status["terminalReason"] == "completed"
        assert finalizers(stack_, test_namespace, name) == []
    assert read_events(nats_server, test_namespace, "alone") != []
    legacy = run_manifest("legacy", "E2E-PARALLEL-ORDER: legacy")
    legacy["metadata"]["finalizers"] = [FINALIZER]  # as an earlier version left a run
    stack_.apply(test_namespace, legacy)
    wait_until(
        lambda: not finalizers(stack_, test_namespace, "legacy"),
        timeout=15,
        what="the earlier version's finalizer taken off",
    )
    stack_.apply(test_namespace, run_manifest("midway", "E2E-LONG job"))  # 5 turns of ~1 s
    running = stack_.wait_for(
        test_namespace, "midway", lambda s: (s.get("usage") or {}).get("steps", 0) >= 1
    )
    assert finalizers(stack_, test_namespace, "midway") == []
    midway = stack_.get(test_namespace, "midway")
    assert midway is not None
    uid, tenant = midway["metadata"]["uid"], running["tenant"]

    components.stop_component(stack_.operator)
    time.sleep(1.5)  # the turn in flight ends; no operator dispatches the next
    assert not stack_.get(test_namespace, "midway")["status"].get("terminalReason")  # type: ignore[index]
    assert holds_of(nats_server, tenant, uid) != []
    for name in ("alone", "midway"):
        stack_.kubectl("delete", "agentrun", name, "-n", test_namespace, "--timeout=15s")
    stack_.kubectl("delete", "namespace", test_namespace, "--wait=false")
    wait_until(lambda: namespace_gone(stack_, test_namespace), timeout=60, what="namespace gone")

    stack_.restart_dead()  # the new leader purges the events of the runs deleted meanwhile
    for name in ("alone", "with-namespace", "midway"):
        wait_until(
            lambda n=name: read_events(nats_server, test_namespace, n) == [],
            timeout=30,
            what=f"events of {name} purged",
        )
    wait_until(  # the ledger sweep: an active entry nothing follows, its object gone (30 s)
        lambda: holds_of(nats_server, tenant, uid) == [],
        timeout=75,
        what="the hold and slot of the run deleted mid-way freed",
    )


def test_d02_running_and_queued_runs_deleted_with_their_namespace_free_slot_hold_and_queue(
    stack_: E2EStack,
    namespace_controller: components.Component,
    test_namespace: str,
    nats_server: Any,
) -> None:
    """A tenant with one slot: one run mid-turn, one queued behind it. Deleting the namespace
    ends the first (its hold and slot freed, events purged) and takes the second out of the
    queue: the tenant is left with nothing active, held or queued."""
    tenant = f"one-slot-{test_namespace}"
    stack_.kubectl(
        "apply",
        "-f",
        "-",
        input=yaml.safe_dump(
            {
                "apiVersion": "agentrun.dev/v1alpha1",
                "kind": "AgentTenant",
                "metadata": {"name": tenant},
                "spec": {
                    "namespaces": [test_namespace],
                    "budget": {"tokens": 1_000_000, "costUSD": "10"},
                    "maxConcurrentRuns": 1,
                },
            }
        ),
    )
    try:  # the operator has read the tenant (it writes its status) before the first run
        wait_tenant(stack_, tenant, lambda s: "observedGeneration" in s, timeout=30)
        stack_.apply(test_namespace, run_manifest("midway", "E2E-LONG job"))
        stack_.wait_for(
            test_namespace, "midway", lambda s: (s.get("usage") or {}).get("steps", 0) >= 1
        )
        stack_.apply(test_namespace, run_manifest("waiting", "E2E-LONG job"))
        stack_.wait_for(test_namespace, "waiting", lambda s: s.get("phase") == "Queued")
        obj = stack_.get(test_namespace, "midway")
        assert obj is not None
        assert not obj["metadata"].get("finalizers")
        uid = obj["metadata"]["uid"]
        assert obj["status"]["tenant"] == tenant
        book = read_book(nats_server, tenant)
        assert book is not None and uid in book.active

        stack_.kubectl("delete", "namespace", test_namespace, "--wait=false")
        wait_until(
            lambda: namespace_gone(stack_, test_namespace), timeout=60, what="namespace gone"
        )

        def nothing_held() -> bool:  # the operator saw the deletion (no finalizer waited)
            book = read_book(nats_server, tenant)
            assert book is not None
            return list(book.active) == [] and dict(book.holds) == {}

        wait_until(nothing_held, timeout=15, what="the tenant's hold and slot freed")
        wait_until(
            lambda: read_events(nats_server, test_namespace, "midway") == [],
            timeout=15,
            what="the events of the run deleted mid-turn purged",
        )

        def queue_empty() -> bool:
            found = stack_.kubectl("get", "agenttenant", tenant, "-o", "json")
            shown = json.loads(found.stdout).get("status") or {}
            return shown.get("queuedRuns") == 0 and shown.get("activeRuns") == 0

        wait_until(queue_empty, timeout=20, what="the tenant's queue and slots empty")
    finally:
        stack_.kubectl("delete", "agenttenant", tenant, "--wait=false")


def own_tenant(stack_: E2EStack, namespace: str, prefix: str, **spec: Any) -> str:
    """An AgentTenant of ``namespace`` alone (its ledger counts only this test's runs), read by
    the operator before it returns."""
    tenant = f"{prefix}-{namespace}"
    body = {"namespaces": [namespace], "budget": {"tokens": 1_000_000, "costUSD": "10"}, **spec}
    manifest = {
        "apiVersion": "agentrun.dev/v1alpha1",
        "kind": "AgentTenant",
        "metadata": {"name": tenant},
        "spec": body,
    }
    stack_.kubectl("apply", "-f", "-", input=yaml.safe_dump(manifest))
    wait_tenant(stack_, tenant, lambda s: "observedGeneration" in s, timeout=30)
    return tenant


def test_a_run_deleted_while_no_operator_ran_and_applied_again_is_not_run_on(
    stack_: E2EStack, test_namespace: str, nats_server: Any
) -> None:
    """Deleted while the operator is down, in its tool call, and applied again under the same
    name before the operator returns: the new run runs (its own events only), and the deleted
    one gets no further turn — its committed turn 0 is all it is charged (50 tokens), its slot
    is freed. (Before: the returning operator followed the deleted run from its events, which
    the start-up purge by name had kept, and asked the model for its turn 1.)"""
    tenant = own_tenant(stack_, test_namespace, "again", maxConcurrentRuns=5)
    try:
        stack_.apply(test_namespace, run_manifest("again", "E2E-SLOW-TOOL job"))
        wait_answered_hold(nats_server, tenant, test_namespace, "again")  # in its 4 s tool
        old = stack_.get(test_namespace, "again")
        assert old is not None
        old_uid = old["metadata"]["uid"]
        components.kill_component(stack_.operator)
        stack_.kubectl("delete", "agentrun", "again", "-n", test_namespace, "--timeout=15s")
        stack_.apply(test_namespace, run_manifest("again", "E2E-SLOW-TOOL job"))
        wait_until(  # the worker commits the deleted run's turn 0 with no operator running
            lambda: turn_numbers(read_events(nats_server, test_namespace, "again")) == [0],
            timeout=15,
            what="the deleted run's turn 0 committed",
        )
        stack_.restart_dead()
        status = stack_.wait_terminal(test_namespace, "again", timeout=60)
        assert (status["terminalReason"], status["answer"]) == (
            "completed",
            "Done after the slow tool.",
        )
        new = stack_.get(test_namespace, "again")
        assert new is not None and new["metadata"]["uid"] != old_uid
        events = read_events(nats_server, test_namespace, "again")
        assert {e.run_uid for e in events} == {new["metadata"]["uid"]}
        assert turn_numbers(events) == [0, 1]

        def settled() -> bool:  # the old run stopped as deleted (its slot freed)
            book = read_book(nats_server, tenant)
            assert book is not None
            return old_uid not in book.active and not book.holds

        wait_until(settled, timeout=60, what="the deleted run's slot freed")
        book = read_book(nats_server, tenant)
        assert book is not None
        assert book.used_tokens == 150, book  # the old run's turn 0, the new run's two turns
    finally:
        stack_.kubectl("delete", "agenttenant", tenant, "--wait=false")


def test_ttl_seconds_after_finished_deletes_the_run_and_its_events(
    stack_: E2EStack, test_namespace: str, nats_server: Any
) -> None:
    stack_.apply(
        test_namespace,
        run_manifest("short-lived", "E2E-PARALLEL-ORDER: ttl", ttlSecondsAfterFinished=6),
    )
    stack_.apply(test_namespace, run_manifest("kept", "E2E-PARALLEL-ORDER: kept"))
    status = stack_.wait_terminal(test_namespace, "short-lived")
    assert status["terminalReason"] == "completed"
    assert read_events(nats_server, test_namespace, "short-lived") != []
    finished = datetime.fromisoformat(status["completionTime"]).timestamp()
    # completionTime has 1 s steps: until 5 s after it, the run is certainly inside its TTL.
    while time.time() < finished + 4.5:
        assert stack_.get(test_namespace, "short-lived") is not None, "deleted before its TTL"
        time.sleep(0.5)
    wait_until(
        lambda: stack_.get(test_namespace, "short-lived") is None,
        timeout=20,
        what="the run deleted after its TTL",
    )
    wait_until(
        lambda: read_events(nats_server, test_namespace, "short-lived") == [],
        timeout=10,
        what="its events purged",
    )
    stack_.wait_terminal(test_namespace, "kept")
    # no TTL: kept. A negative check: "kept" ended with "short-lived", whose 6 s TTL has run
    # out by now; 3 s more is the time the operator had to act on a TTL wrongly applied
    time.sleep(3)
    assert stack_.get(test_namespace, "kept") is not None


def test_the_tenant_ttl_default_deletes_its_runs_that_set_none(
    stack_: E2EStack, test_namespace: str
) -> None:
    tenant = {
        "apiVersion": "agentrun.dev/v1alpha1",
        "kind": "AgentTenant",
        "metadata": {"name": f"ttl-{test_namespace}"},
        "spec": {
            "namespaces": [test_namespace],
            "budget": {"tokens": 1_000_000, "costUSD": "10"},
            "ttlSecondsAfterFinished": 4,
        },
    }
    stack_.kubectl("apply", "-f", "-", input=yaml.safe_dump(tenant))
    try:  # the operator has read the tenant (it writes its status) before the run
        wait_tenant(
            stack_, tenant["metadata"]["name"], lambda s: "observedGeneration" in s, timeout=30
        )
        stack_.apply(test_namespace, run_manifest("tenant-ttl", "E2E-PARALLEL-ORDER: t"))
        status = stack_.wait_terminal(test_namespace, "tenant-ttl")
        assert status["tenant"] == tenant["metadata"]["name"]
        wait_until(
            lambda: stack_.get(test_namespace, "tenant-ttl") is None,
            timeout=15,
            what="the run deleted after its tenant's default TTL",
        )
    finally:
        stack_.kubectl("delete", "agenttenant", tenant["metadata"]["name"], "--wait=false")


def older_agentrun_crd() -> dict[str, Any]:
    """The AgentRun CRD as an older chart shipped it: no status.lastEventSequence, no
    spec.ttlSecondsAfterFinished."""
    crd: dict[str, Any] = copy.deepcopy(
        yaml.safe_load((CRD_DIR / "agentrun.dev_agentruns.yaml").read_text())
    )
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]
    del schema["status"]["properties"]["lastEventSequence"]
    del schema["spec"]["properties"]["ttlSecondsAfterFinished"]
    return crd


def mismatch_events(stack_: E2EStack) -> list[dict[str, Any]]:
    listed = stack_.kubectl(
        "get", "events", "-n", "default", "--field-selector", "reason=CRDMismatch", "-o", "json"
    )
    return list(json.loads(listed.stdout)["items"])


def test_d07_an_operator_facing_an_older_crd_is_not_ready_says_so_once_and_proceeds(
    stack_: E2EStack,
) -> None:
    """The AgentRun CRD is older than the operator. The new operator touches nothing,
    /readyz answers 503, one log line and one Event name the missing fields; once the chart's
    CRDs are applied as documented (server-side), it becomes ready without a restart."""
    events_before = len(mismatch_events(stack_))
    stack_.kubectl(
        "apply",
        "--server-side",
        "--force-conflicts",
        "-f",
        "-",
        input=yaml.safe_dump(older_agentrun_crd()),
    )
    port = probes.free_port()
    env = {**stack_.env, "AGENTRUN_HEALTH_PORT": str(port), "AGENTRUN_CRD_CHECK_INTERVAL": "0.5"}
    checker = stack.start_operator(env, launch=stack_.launch, name="operator-crd-check")
    try:
        wait_until(lambda: readiness(port)[0] == 503, timeout=20, what="/readyz 503")
        time.sleep(2.0)  # several checks: still one message
        log = checker.spec.log_path.read_text()
        said = [line for line in log.splitlines() if "not ready:" in line]
        assert len(said) == 1, said
        assert "lastEventSequence" in said[0] and "ttlSecondsAfterFinished" in said[0]
        assert "kubectl apply --server-side" in said[0]
        assert "leading" not in log and "standby" not in log  # it took no part yet
        wait_until(
            lambda: len(mismatch_events(stack_)) == events_before + 1,
            timeout=10,
            what="one CRDMismatch Event",
        )
        event = mismatch_events(stack_)[-1]
        assert event["involvedObject"]["name"] == "agentruns.agentrun.dev"
        assert "lastEventSequence" in event["message"]

        stack_.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD_DIR))
        wait_until(lambda: readiness(port)[0] == 200, timeout=20, what="/readyz 200")
        assert readiness(port) == (200, "ready standby\n")  # the stack's operator leads
        assert len(mismatch_events(stack_)) == events_before + 1
        assert checker.is_alive()
    finally:
        components.stop_component(checker)
        stack_.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD_DIR))
