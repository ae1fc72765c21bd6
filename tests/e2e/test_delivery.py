"""Turn delivery that cannot drop: a TurnRequest lost from the work queue is found and sent
again, a transient fault makes a turn wait however long it lasts, connections come back."""

from __future__ import annotations

import time

import pytest

from agentrun_dev import components, stack

from .conftest import ACK_WAIT, E2EStack, run_manifest
from .events import (
    delete_queued_turns,
    put_book_bytes,
    read_events,
    settled_book,
    strand_queued_turn,
    turn_numbers,
    wait_answered_hold,
)
from .test_tenants import TenantFactory, append_scenario, tenants  # noqa: F401

pytestmark = [pytest.mark.e2e, pytest.mark.long]


def test_a_turn_request_deleted_from_the_stream_is_dispatched_again_and_the_run_completes(
    stack_: E2EStack,
    test_namespace: str,
    tenants: TenantFactory,  # noqa: F811
    nats_server: object,
) -> None:
    """The lone worker running turn 0 dies and the TurnRequest it held is deleted from the
    stream: nothing would ever deliver it again. The operator finds the run Running with no
    turn queued or in flight within seconds and dispatches turn 0 again; the run completes
    with each turn committed once."""
    # a tenant of its own: the deletion takes every queued turn of the run's tenant, and
    # earlier tests' runs still going in the default tenant must keep theirs
    tenants(f"t-{test_namespace}", [test_namespace], budget={"tokens": 100_000})
    for worker in stack_.workers:
        components.stop_component(worker)
    lone = stack.start_worker(3, env=stack_.env, launch=stack_.launch)
    try:
        # the goal names this test's namespace: other tests' runs of the same scenario are in
        # the model's request log too, and must not count as this run's call
        stack_.apply(test_namespace, run_manifest("lost", f"E2E-SLOW-TOOL {test_namespace}"))
        status = stack_.wait_for(
            test_namespace, "lost", lambda s: s.get("phase") == "Running", timeout=30
        )
        deadline = time.monotonic() + 20
        while not any(test_namespace in str(r) for r in stack_.mock_requests()):
            assert time.monotonic() < deadline, "the lone worker never called the model"
            time.sleep(0.1)
        assert delete_queued_turns(nats_server, status["tenant"]) == 1  # type: ignore[attr-defined]
        components.kill_component(lone)
    finally:
        if lone.is_alive():
            components.kill_component(lone)
    stack_.restart_dead()
    # nothing but the operator's orphan check can bring the deleted request back (no message
    # is left to redeliver), so the run completing at all is the proof; the deadline is the
    # orphan bound, a sweep, the 4 s tool and the answer, with room for a loaded machine
    status = stack_.wait_terminal(test_namespace, "lost", timeout=30 + ACK_WAIT)
    assert (status["terminalReason"], status["answer"]) == (
        "completed",
        "Done after the slow tool.",
    )
    turns = turn_numbers(read_events(nats_server, test_namespace, "lost"))  # type: ignore[attr-defined]
    assert turns == [0, 1]


def test_a_turn_request_the_workers_consumer_counts_acknowledged_is_sent_again_and_runs(
    stack_: E2EStack,
    test_namespace: str,
    tenants: TenantFactory,  # noqa: F811
    nats_server: object,
) -> None:
    """The workers are stopped, the run is admitted, and the workers' consumer is moved past
    its TurnRequest, which the stream keeps (its ack floor there, nothing pending: what
    nats-server #4736 shows after a restart); the workers come back and ask, and nothing
    would ever deliver it. The operator judges it below the ack floor at three looks in a row,
    deletes it and publishes it again, with one warning naming the consumer's figures; the
    run completes with its turn committed once."""
    tenants(f"t-{test_namespace}", [test_namespace], budget={"tokens": 100_000})
    for worker in stack_.workers:
        components.stop_component(worker)
    try:
        stack_.apply(
            test_namespace, run_manifest("stuck", f"agentrun install check {test_namespace}")
        )
        status = stack_.wait_for(
            test_namespace, "stuck", lambda s: s.get("phase") == "Running", timeout=30
        )
        stuck = strand_queued_turn(nats_server, status["tenant"])  # type: ignore[arg-type]
    finally:
        stack_.restart_dead()
    # three looks AGENTRUN_ORPHAN_AFTER apart, then the turn: well within the bound
    status = stack_.wait_terminal(test_namespace, "stuck", timeout=60)
    assert (status["terminalReason"], status["answer"]) == ("completed", "ok")
    turns = turn_numbers(read_events(nats_server, test_namespace, "stuck"))  # type: ignore[attr-defined]
    assert turns == [0]
    log = stack_.operator.spec.log_path.read_text(errors="replace")
    said = [line for line in log.splitlines() if f"{test_namespace}/stuck: turn 0 stayed" in line]
    assert len(said) == 1 and f"below_ack_floor; TurnRequest {stuck}," in said[0]


def test_a_worker_killed_right_after_the_model_answered_has_that_call_charged_once(
    stack_: E2EStack,
    test_namespace: str,
    tenants: TenantFactory,  # noqa: F811
    nats_server: object,
) -> None:
    """The lone worker is SIGKILLed while turn 0's tool runs, after its model call answered
    (50 tokens): that call never commits, but the provider billed it. The usage recorded on
    its hold is charged once as abandoned, whether the redelivered turn replaces the hold or
    the sweep drops it expired; the run's own two calls are charged once each."""
    tenant = tenants(f"t-{test_namespace}", [test_namespace], budget={"tokens": 100_000})
    for worker in stack_.workers:
        components.stop_component(worker)
    lone = stack.start_worker(3, env=stack_.env, launch=stack_.launch)
    try:
        stack_.apply(test_namespace, run_manifest("billed", f"E2E-SLOW-TOOL {test_namespace}"))
        # the answer is in (its usage is on the hold) and the 4 s tool runs
        wait_answered_hold(nats_server, tenant, test_namespace, "billed")  # type: ignore[attr-defined]
        components.kill_component(lone)
    finally:
        if lone.is_alive():
            components.kill_component(lone)
    stack_.restart_dead()
    status = stack_.wait_terminal(test_namespace, "billed", timeout=30 + ACK_WAIT)
    assert status["terminalReason"] == "completed"
    assert status["usage"]["inputTokens"] + status["usage"]["outputTokens"] == 100
    book = settled_book(nats_server, tenant)  # type: ignore[arg-type]
    assert (book.used_tokens, book.abandoned_tokens) == (150, 50)


LEDGER_OUTAGE_SCENARIO = {
    "name": "ledger-outage",
    "match": {"goal": "E2E-ledger-outage"},
    "turns": [
        {"tool_calls": [{"name": "sleep", "arguments": {"seconds": 8}}]},
        {"content": "resumed after the outage"},
    ],
}


def test_a_ledger_entry_unreadable_for_longer_than_any_delivery_limit_makes_the_turn_wait(
    stack_: E2EStack,
    test_namespace: str,
    tenants: TenantFactory,  # noqa: F811
    nats_server: object,
) -> None:
    """The run's turn 0 sleeps 8 s; meanwhile its tenant's ledger entry is made unreadable,
    then restored. Turn 1 cannot reserve while it is damaged, so its TurnRequest is
    redelivered 5 s apart and runs once the entry is back: the run completes within its 2 m
    timeout. The outage is the reported 25 s stretched to 40 s, so that turn 1 alone waits
    through more than five deliveries (the old delivery limit, which dropped it)."""
    append_scenario(stack_, LEDGER_OUTAGE_SCENARIO)
    tenant = tenants(f"t-{test_namespace}", [test_namespace], budget={"tokens": 1_000_000})
    manifest = run_manifest(
        "outage", f"E2E-ledger-outage {test_namespace}", budget={"timeout": "2m"}
    )
    stack_.apply(test_namespace, manifest)
    deadline = time.monotonic() + 20
    while not any(test_namespace in str(r) for r in stack_.mock_requests()):
        assert time.monotonic() < deadline, "no worker called the model"
        time.sleep(0.1)
    saved = put_book_bytes(nats_server, tenant, b"{not a ledger entry")  # type: ignore[attr-defined]
    time.sleep(40)
    status = stack_.get(test_namespace, "outage")
    assert status is not None and not status["status"].get("terminalReason")
    put_book_bytes(nats_server, tenant, saved)  # type: ignore[attr-defined]
    status = stack_.wait_terminal(test_namespace, "outage", timeout=60)
    assert (status["terminalReason"], status["answer"]) == ("completed", "resumed after the outage")
    turns = turn_numbers(read_events(nats_server, test_namespace, "outage"))  # type: ignore[attr-defined]
    assert turns == [0, 1]
