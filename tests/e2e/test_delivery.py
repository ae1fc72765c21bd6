"""Turn delivery that cannot drop: a TurnRequest lost from the work queue is found and sent
again, a transient fault makes a turn wait however long it lasts, connections come back."""

from __future__ import annotations

import time

import pytest

from agentrun_dev import components, stack

from .conftest import ACK_WAIT, ORPHAN_AFTER, E2EStack, run_manifest
from .events import delete_queued_turns, read_events, turn_numbers

pytestmark = pytest.mark.e2e


def test_a_turn_request_deleted_from_the_stream_is_dispatched_again_and_the_run_completes(
    stack_: E2EStack, test_namespace: str, nats_server: object
) -> None:
    """The lone worker running turn 0 dies and the TurnRequest it held is deleted from the
    stream: nothing would ever deliver it again. The operator finds the run Running with no
    turn queued or in flight within seconds and dispatches turn 0 again; the run completes
    with each turn committed once."""
    for worker in stack_.workers:
        components.stop_component(worker)
    lone = stack.start_worker(3, env=stack_.env, launch=stack_.launch)
    try:
        stack_.apply(test_namespace, run_manifest("lost", "E2E-SLOW-TOOL job"))
        status = stack_.wait_for(
            test_namespace, "lost", lambda s: s.get("phase") == "Running", timeout=30
        )
        deadline = time.monotonic() + 20
        while not any("E2E-SLOW-TOOL" in str(r) for r in stack_.mock_requests()):
            assert time.monotonic() < deadline, "the lone worker never called the model"
            time.sleep(0.1)
        assert delete_queued_turns(nats_server.url, status["tenant"]) == 1  # type: ignore[attr-defined]
        components.kill_component(lone)
    finally:
        if lone.is_alive():
            components.kill_component(lone)
    lost_at = time.monotonic()
    stack_.restart_dead()
    status = stack_.wait_terminal(test_namespace, "lost", timeout=30 + ACK_WAIT)
    assert (status["terminalReason"], status["answer"]) == (
        "completed",
        "Done after the slow tool.",
    )
    # found within seconds: the orphan bound, a sweep interval, the 4 s tool and the answer
    assert time.monotonic() - lost_at < 2 * ORPHAN_AFTER + 4 + 6
    turns = turn_numbers(read_events(nats_server.url, test_namespace, "lost"))  # type: ignore[attr-defined]
    assert turns == [0, 1]
