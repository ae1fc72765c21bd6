"""Processes die and objects vanish mid-run; no committed turn is lost or committed twice."""

from __future__ import annotations

import json
import time
import urllib.request
from typing import Any

import pytest
import yaml

from agentrun import kernel
from agentrun_dev import components, stack

from .conftest import ACK_WAIT, E2EStack, http_get, mock_model, run_manifest, tenants_of
from .events import read_book, read_events, turn_numbers, wait_answered_hold
from .test_telemetry import metric

HUGE_EXPRESSION = "1+" * 40_000 + "1"
"""~80 KB: tool-call arguments over the 65536-byte cap a checkpointed turn keeps."""

pytestmark = pytest.mark.e2e

TURNS = "agentrun_turns_total"
"""Turns a worker committed, by tenant."""

WIDE_MODEL = "mock-wide"
"""The scripted model allowed 50,000 output tokens a call: output past the checkpoint's caps
(131072 bytes of answer, 65536 of arguments) is within what it may write, so it reaches those
caps instead of being cut mid-stream at the allowance (a 1000-token call's overrun)."""


@pytest.fixture(scope="module")
def wide_model(e2e: E2EStack) -> str:
    """The name of an AgentModel allowing 50,000 output tokens a call (``WIDE_MODEL``)."""
    manifest = mock_model(
        stack.mockllm_url(e2e.mock),
        name=WIDE_MODEL,
        max_output_tokens=50_000,
        context_window=100_000,
    )
    e2e.kubectl("apply", "-f", "-", input=yaml.safe_dump(manifest))
    return WIDE_MODEL


def wait_steps(stack_: E2EStack, namespace: str, name: str, steps: int) -> None:
    stack_.wait_for(
        namespace, name, lambda s: (s.get("usage") or {}).get("steps", 0) >= steps, timeout=30
    )


def test_deleting_a_run_mid_turn_stops_it_and_frees_its_hold_and_slot(
    stack_: E2EStack, test_namespace: str, nats_server: object
) -> None:
    """Deleted mid-turn: the object goes at once (no finalizer), the run stops, its
    reservation and slot in the tenant ledger are released and its events purged within a
    bound, and a late status patch (the turn in flight commits) does not re-create it."""
    stack_.apply(test_namespace, run_manifest("doomed", "E2E-LONG job"))
    wait_steps(stack_, test_namespace, "doomed", 1)
    obj = stack_.get(test_namespace, "doomed")
    assert obj is not None
    uid, tenant = obj["metadata"]["uid"], obj["status"]["tenant"]
    book = read_book(nats_server, tenant)  # type: ignore[attr-defined]
    assert book is not None and uid in book.active
    started = time.monotonic()
    stack_.kubectl("delete", "agentrun", "doomed", "-n", test_namespace, "--timeout=20s")
    assert time.monotonic() - started < 5  # nothing waits for the operator
    time.sleep(2 * 0.5 + 1.0)  # a late status patch would land now
    assert stack_.get(test_namespace, "doomed") is None, "a late status patch re-created the object"

    def freed() -> bool:
        if read_events(nats_server, test_namespace, "doomed") != []:  # type: ignore[attr-defined]
            return False
        book = read_book(nats_server, tenant)  # type: ignore[attr-defined]
        assert book is not None
        return uid not in book.active and not [
            key for key, hold in book.holds.items() if hold.run_uid == uid
        ]

    deadline = time.monotonic() + 15
    while not freed():
        assert time.monotonic() < deadline, "hold, slot or events of the deleted run kept"
        time.sleep(0.25)


def test_an_operator_killed_mid_run_resumes_and_finishes_with_the_same_result(
    stack_: E2EStack, test_namespace: str, nats_server: object
) -> None:
    stack_.apply(test_namespace, run_manifest("survivor", "E2E-LONG job"))
    wait_steps(stack_, test_namespace, "survivor", 2)
    components.kill_component(stack_.operator)
    time.sleep(1.5)
    stack_.operator = stack.start_operator(stack_.env, launch=stack_.launch)
    status = stack_.wait_terminal(test_namespace, "survivor", timeout=60)
    assert (status["terminalReason"], status["answer"]) == ("completed", "Finished the long job.")
    assert status["usage"]["steps"] == 5
    turns = turn_numbers(read_events(nats_server, test_namespace, "survivor"))  # type: ignore[attr-defined]
    assert turns == [0, 1, 2, 3, 4]


def test_a_worker_killed_mid_turn_hands_the_turn_to_another_committed_once(
    stack_: E2EStack, test_namespace: str, nats_server: object
) -> None:
    for worker in stack_.workers:
        components.stop_component(worker)
    lone = stack.start_worker(3, env=stack_.env, launch=stack_.launch)
    try:
        stack_.apply(test_namespace, run_manifest("handover", "E2E-SLOW-TOOL job"))
        status = stack_.wait_for(
            test_namespace, "handover", lambda s: s.get("phase") == "Running", timeout=30
        )
        # the model answered (its usage is on the hold): the worker is in the 4 s tool call
        wait_answered_hold(nats_server, status["tenant"], test_namespace, "handover")  # type: ignore[attr-defined]
        components.kill_component(lone)
    finally:
        if lone.is_alive():
            components.kill_component(lone)
    stack_.restart_dead()
    status = stack_.wait_terminal(test_namespace, "handover", timeout=30 + ACK_WAIT)
    assert (status["terminalReason"], status["answer"]) == (
        "completed",
        "Done after the slow tool.",
    )
    turns = turn_numbers(read_events(nats_server, test_namespace, "handover"))  # type: ignore[attr-defined]
    assert turns == [0, 1]


def turns_of(stack_: E2EStack, tenant: str) -> list[float]:
    """Each worker's ``agentrun_turns_total`` of ``tenant`` (turns it committed for it)."""
    return [
        metric(http_get(f"http://127.0.0.1:{w.ports['metrics']}/metrics"), TURNS, tenant=tenant)
        for w in stack_.workers
    ]


def test_two_workers_share_the_turns(stack_: E2EStack) -> None:
    """Eight runs of three turns in a tenant of their own (earlier tests' runs, still going
    in other namespaces, commit turns on the same workers meanwhile): both workers take some
    of its 24 turns, each counted once."""
    with tenants_of(stack_, {"shared": {"maxConcurrentRuns": 8}}) as made:
        tenant, namespace = made["shared"]
        for i in range(8):
            stack_.apply(namespace, run_manifest(f"shared-{i}", f"E2E-SHARED {i}"))
        for i in range(8):
            assert stack_.wait_terminal(namespace, f"shared-{i}")["terminalReason"] == "completed"
        # a worker counts a turn after committing it and settling its hold, so the last
        # turn's count may land after the operator has written the run's end: poll for it
        deadline = time.monotonic() + 15
        while sum(done := turns_of(stack_, tenant)) < 24 and time.monotonic() < deadline:
            time.sleep(0.2)
    assert sum(done) == 24
    assert all(d > 0 for d in done), f"turns per worker: {done}"


def test_a_run_recreated_under_the_same_name_starts_fresh(
    stack_: E2EStack, test_namespace: str
) -> None:
    stack_.apply(test_namespace, run_manifest("again", "E2E-LONG job"))
    wait_steps(stack_, test_namespace, "again", 1)
    stack_.kubectl("delete", "agentrun", "again", "-n", test_namespace, "--timeout=20s")
    stack_.apply(test_namespace, run_manifest("again", "E2E-PARALLEL-ORDER: second life"))
    status = stack_.wait_terminal(test_namespace, "again", timeout=60)
    assert (status["terminalReason"], status["answer"]) == ("completed", "Slept, and 6*7 is 42.")
    assert status["usage"]["steps"] == 2  # nothing of the first run leaked into the second
    time.sleep(1.5)  # a late write of the first run would land now
    assert stack_.get(test_namespace, "again")["status"]["usage"]["steps"] == 2


def append_scenarios(stack_: E2EStack, *scenarios: dict[str, Any]) -> None:
    """Add scenarios to the running scripted model (too big to keep in ``scenarios.yaml``)."""
    scenario = {"scenarios": list(scenarios)}
    base = stack_.mock_url.removesuffix("/v1")
    request = urllib.request.Request(
        f"{base}/_mock/scenarios?mode=append", data=json.dumps(scenario).encode(), method="POST"
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 200


def test_a_model_answer_too_large_to_checkpoint_is_corrected_not_fatal(
    stack_: E2EStack, test_namespace: str, wide_model: str
) -> None:
    """An answer over the 131072-byte cap a checkpointed turn keeps is the model's fault: it is
    cut before it is stored, the model is told to be shorter, and the run goes on."""
    giant = "x" * (128 * 1024 + 1)
    shorter = {"content": "Short now.", "usage": {"prompt_tokens": 120, "completion_tokens": 5}}
    append_scenarios(
        stack_,  # a malformed reply stores no assistant message: the fix is matched on the note
        {
            "name": "giant-fixed",
            "match": {"goal": "E2E-GIANT", "last": "shorter"},
            "turns": [shorter],
        },
        {
            "name": "giant",
            "match": {"goal": "E2E-GIANT"},
            "turns": [{"content": giant, "usage": {"prompt_tokens": 100, "completion_tokens": 10}}],
        },
    )
    stack_.apply(test_namespace, run_manifest("giant", "E2E-GIANT answer", model=wide_model))
    status = stack_.wait_terminal(test_namespace, "giant", timeout=60)
    assert (status["terminalReason"], status.get("answer")) == ("completed", "Short now.")
    usage = status["usage"]
    assert (usage["steps"], usage["corrections"], usage["inputTokens"]) == (2, 1, 220)
    [second] = [r for r in stack_.mock_requests() if r.get("scenario") == "giant-fixed"]
    note = str(second["body"]["messages"][-1]["content"])
    assert "over the 131072-byte cap" in note and "shorter" in note


def test_huge_tool_arguments_are_a_correction_and_the_call_is_charged(
    stack_: E2EStack, test_namespace: str, wide_model: str
) -> None:
    """A tool call with ~80 KB of arguments becomes an error result the model reads (a
    placeholder is stored, not the arguments); the turn commits and its usage counts."""
    turns = [
        {
            "tool_calls": [
                {"id": "huge", "name": "calculate", "arguments": {"expression": HUGE_EXPRESSION}}
            ],
            "usage": {"prompt_tokens": 100, "completion_tokens": 10},
        },
        {"content": "Corrected: 2.", "usage": {"prompt_tokens": 120, "completion_tokens": 5}},
    ]
    append_scenarios(
        stack_, {"name": "huge-args", "match": {"goal": "E2E-HUGE-ARGS"}, "turns": turns}
    )
    stack_.apply(test_namespace, run_manifest("huge", "E2E-HUGE-ARGS: add", model=wide_model))
    status = stack_.wait_terminal(test_namespace, "huge", timeout=60)
    assert (status["terminalReason"], status["answer"]) == ("completed", "Corrected: 2.")
    usage = status["usage"]
    assert (usage["steps"], usage["corrections"], usage["toolFailures"]) == (2, 1, 1)
    # the scripted model reports 10 output tokens for ~80 KB of arguments it streamed in
    # 20,000 chunks: charged at least what that text holds (``kernel.least_tokens``) and no
    # more than its chunks (one token each, four characters), plus the 5 of the correction
    text = ["calculate", json.dumps({"expression": HUGE_EXPRESSION})]
    assert usage["inputTokens"] == 220
    assert kernel.least_tokens(text) <= usage["outputTokens"] - 5 <= sum(map(len, text)) // 4 + 8
    [second] = [r for r in stack_.mock_requests() if r.get("scenario") == "huge-args" and r["turn"]]
    messages = second["body"]["messages"]
    [asked] = [m for m in messages if m["role"] == "assistant"]
    assert asked["tool_calls"][0]["function"]["arguments"] == "{}"
    [result] = [m["content"] for m in messages if m["role"] == "tool"]
    size = len(json.dumps({"expression": HUGE_EXPRESSION}, separators=(",", ":")))  # as sent
    assert result.startswith(f"ERROR: the arguments were {size} bytes, over the 65536-byte cap")
    assert len(json.dumps(second["body"])) < 10_000  # history holds no copy of the 80 KB


def test_a_run_with_a_long_non_ascii_goal_can_still_be_deleted(
    stack_: E2EStack, test_namespace: str
) -> None:
    stack_.apply(test_namespace, run_manifest("wide", "漢" * 50_000))  # ~300 KB once escaped
    stack_.wait_terminal(test_namespace, "wide", timeout=60)
    stack_.kubectl("delete", "agentrun", "wide", "-n", test_namespace, "--timeout=20s")
    assert stack_.get(test_namespace, "wide") is None
