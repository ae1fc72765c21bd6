"""Graceful drain: a worker told to stop (SIGTERM, as Kubernetes does on a rollout, a scale-in
or a node drain) fetches no new turn, finishes the turns it holds within its grace period less
the drain margin — heartbeats go on, so JetStream does not hand a long turn to another worker
meanwhile —, and only then hands back what is left. A write call in flight is never cut: it
completes and records its outcome, so the turn run again replays it.

The stopped worker is the only one holding the run's turn; the stack's other workers consume
while it drains, so a turn handed back or redelivered too early would show as a second model
request for the same turn (the scripted model counts them).
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentrun_dev import components, stack
from agentrun_dev.procs import StopOutcome

from .conftest import E2EStack, prompt_bound_of, run_manifest
from .events import read_events, settled_book, turn_numbers
from .test_effects_chaos import model_asked, start_run, until
from .test_tenants import TenantFactory, tenants  # noqa: F401

pytestmark = pytest.mark.e2e

GRACE = 30.0
"""Seconds the test gives a stopped worker before SIGKILL (its termination grace period): a
busy machine slows a stopping process too."""
DRAIN = {"AGENTRUN_TERMINATION_GRACE": str(GRACE), "AGENTRUN_DRAIN_MARGIN": "10"}
"""A worker whose turns get 20 s to finish once stopped."""
SHORT_DRAIN = {"AGENTRUN_DRAIN_MARGIN": str(GRACE - 1)}
"""A worker whose turns get 1 s to finish once stopped."""
LOCAL_TOOLS = {"allow": [{"host": "127.0.0.1", "privateNetwork": True}]}
"""The tenant's ``spec.toolServers``: the test's tool server listens on loopback."""


@pytest.fixture
def lone(stack_: E2EStack) -> Iterator[list[components.Component]]:
    """Start the only worker with extra environment (``lone[0]`` after ``start(env)``); the
    stack's workers are stopped first and come back when the test restarts them."""
    started: list[components.Component] = []
    for worker in stack_.workers:
        components.stop_component(worker)
    yield started
    for worker in started:
        if worker.is_alive():
            components.kill_component(worker)
    stack_.restart_dead()


def start_lone(stack_: E2EStack, started: list[components.Component], **env: str) -> None:
    worker = stack.start_worker(9, env={**stack_.env, **DRAIN, **env}, launch=stack_.launch)
    started.append(worker)


def stop_while_others_consume(
    stack_: E2EStack, worker: components.Component
) -> tuple[StopOutcome, float]:
    """SIGTERM ``worker`` and, while it drains, bring the stack's workers back; returns how
    its stop ended and the seconds it took."""
    began = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        stopping = pool.submit(components.stop_component, worker, timeout=GRACE)
        stack_.restart_dead()
        outcome = stopping.result()
    return outcome, time.monotonic() - began


def test_a_stopped_worker_finishes_the_model_call_it_holds_and_commits_the_turn(
    stack_: E2EStack,
    test_namespace: str,
    tenants: TenantFactory,  # noqa: F811
    lone: list[components.Component],
    nats_server: object,
) -> None:
    """SIGTERM while the model takes 6 s to answer (longer than the 4 s ack wait): the worker
    waits for the answer, commits turn 0 and exits; nobody asks the model for that turn
    again, and nothing is charged as abandoned."""
    tenant = tenants(f"t-{test_namespace}", [test_namespace], budget={"tokens": 100_000})
    start_lone(stack_, lone)
    stack_.apply(test_namespace, run_manifest("slow-model", "E2E-DRAIN-SLOW-MODEL"))
    until(lambda: model_asked(stack_, "drain-slow-model", 0) == 1, "the model was asked")
    outcome, seconds = stop_while_others_consume(stack_, lone[0])
    assert outcome is StopOutcome.STOPPED, f"needed SIGKILL after {seconds:.1f}s"
    status = stack_.wait_terminal(test_namespace, "slow-model", timeout=60)
    assert (status["terminalReason"], status.get("answer")) == ("completed", "drained")
    # the stopping worker committed the turn it held: the workers consuming meanwhile never
    # got it (the model was asked once for it), and each turn committed once
    asked = [model_asked(stack_, "drain-slow-model", turn) for turn in (0, 1)]
    assert asked == [1, 1]
    assert turn_numbers(read_events(nats_server, test_namespace, "slow-model")) == [0, 1]  # type: ignore[arg-type]
    assert "cancelled while stopping" not in lone[0].spec.log_path.read_text(errors="replace")
    book = settled_book(nats_server, tenant)  # type: ignore[arg-type]
    assert (book.used_tokens, book.abandoned_tokens) == (100, 0)


def test_a_stopped_worker_lets_a_write_in_flight_complete_and_commits_it(
    stack_: E2EStack,
    test_namespace: str,
    tmp_path: Path,
    tenants: TenantFactory,  # noqa: F811
    lone: list[components.Component],
    nats_server: object,
) -> None:
    """SIGTERM while a write call is on the tool server (it answers after 3 s): the call
    completes, its turn commits, and the run completes with the write done once — not
    ``effect_unknown``."""
    tenants(
        f"t-{test_namespace}", [test_namespace], budget={"tokens": 100_000}, toolServers=LOCAL_TOOLS
    )
    start_lone(stack_, lone)
    server = start_run(
        stack_, test_namespace, tmp_path, "write", "E2E-DRAIN-WRITE", ["ledger/count_slow"]
    )
    try:
        until(lambda: server.counts().get("drain", 0) == 1, "the write was sent")
        outcome, seconds = stop_while_others_consume(stack_, lone[0])
        assert outcome is StopOutcome.STOPPED, f"needed SIGKILL after {seconds:.1f}s"
        status = stack_.wait_terminal(test_namespace, "write", timeout=60)
        assert (status["terminalReason"], status.get("answer")) == ("completed", "written once")
        assert server.counts() == {"drain": 1}
        assert [model_asked(stack_, "drain-write", turn) for turn in (0, 1)] == [1, 1]
    finally:
        server.stop()


def test_a_turn_longer_than_the_drain_is_handed_back_and_runs_elsewhere(
    stack_: E2EStack,
    test_namespace: str,
    tenants: TenantFactory,  # noqa: F811
    lone: list[components.Component],
    nats_server: object,
) -> None:
    """A worker with 1 s of drain, stopped during an 8 s model call, cancels the turn when the
    drain time is up and hands it back at once (no wait for the ack deadline): another
    worker asks the model again and the run completes. The cut call never answered, but the
    provider read its prompt (and bills it): it is charged its prompt's bound as abandoned,
    once, besides the second call's usage. (The call is long enough that the SIGTERM and the
    drain's second end before it answers on a loaded machine too: an answer before the cut
    would be charged what it delivered, or the turn committed without a second ask.)"""
    tenant = tenants(f"t-{test_namespace}", [test_namespace], budget={"tokens": 100_000})
    start_lone(stack_, lone, **SHORT_DRAIN)
    stack_.apply(test_namespace, run_manifest("too-long", "E2E-DRAIN-TOO-LONG"))
    until(lambda: model_asked(stack_, "drain-too-long", 0) == 1, "the model was asked")
    outcome, seconds = stop_while_others_consume(stack_, lone[0])
    assert outcome is StopOutcome.STOPPED, f"needed SIGKILL after {seconds:.1f}s"
    status = stack_.wait_terminal(test_namespace, "too-long", timeout=60)
    assert (status["terminalReason"], status.get("answer")) == ("completed", "asked twice")
    assert model_asked(stack_, "drain-too-long", 0) == 2
    asks = [
        r for r in stack_.mock_requests() if (r["scenario"], r["turn"]) == ("drain-too-long", 0)
    ]
    bound = prompt_bound_of(asks[0])  # the first of the two asks: the cut one
    assert bound == prompt_bound_of(asks[1]) > 0  # the same prompt, asked twice
    book = settled_book(nats_server, tenant)  # type: ignore[arg-type]
    assert (book.used_tokens, book.abandoned_tokens) == (100 + bound, bound)


def test_a_write_in_flight_at_the_end_of_the_drain_completes_and_is_replayed(
    stack_: E2EStack,
    test_namespace: str,
    tmp_path: Path,
    tenants: TenantFactory,  # noqa: F811
    lone: list[components.Component],
) -> None:
    """A worker with 1 s of drain, stopped while a 4 s write call runs: its turn is cancelled
    when the drain time is up, but the write is not cut — it completes and is recorded in the
    effect ledger before the turn is handed back, so the worker that takes the turn replays
    the recorded result and the run completes with the write done once."""
    tenants(
        f"t-{test_namespace}", [test_namespace], budget={"tokens": 100_000}, toolServers=LOCAL_TOOLS
    )
    start_lone(stack_, lone, **SHORT_DRAIN)
    server = start_run(
        stack_,
        test_namespace,
        tmp_path,
        "late-write",
        "E2E-LATE-WRITE-IN-DRAIN",
        ["ledger/count_slow"],
    )
    try:
        until(lambda: server.counts().get("late", 0) == 1, "the write was sent")
        outcome, seconds = stop_while_others_consume(stack_, lone[0])
        assert outcome is StopOutcome.STOPPED, f"needed SIGKILL after {seconds:.1f}s"
        log = lone[0].spec.log_path.read_text(errors="replace")
        assert "a write call in flight completes and records its outcome" in log
        assert "cancelled while stopping; another worker takes it" in log
        status = stack_.wait_terminal(test_namespace, "late-write", timeout=60)
        assert (status["terminalReason"], status.get("answer")) == ("completed", "written once")
        assert server.counts() == {"late": 1}
    finally:
        server.stop()
