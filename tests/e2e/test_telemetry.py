"""One run is one trace across processes; metrics count what the runs did."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from .conftest import E2EStack, http_get, run_manifest, tenants_of

pytestmark = pytest.mark.e2e

RUNS = "agentrun_runs_total"
TURNS = "agentrun_turns_total"
TOOLS = "agentrun_tool_calls_total"
TOKENS = "agentrun_tokens_total"
DURATION = "agentrun_turn_duration_seconds_count"
"""Turn durations by phase: one sample per committed turn, of any tenant (no tenant label)."""


def spans_in(log_dir: Path) -> list[dict[str, Any]]:
    """Every span the processes of the stack exported to their logs (console exporter)."""
    spans = []
    for log in log_dir.glob("*.log"):
        for line in log.read_text(errors="replace").splitlines():
            if line.startswith('{"name"'):
                spans.append(json.loads(line))
    return spans


def test_a_run_is_one_trace_from_operator_to_workers(stack_: E2EStack, test_namespace: str) -> None:
    stack_.apply(test_namespace, run_manifest("traced", "E2E-PARALLEL-ORDER: traced"))
    status = stack_.wait_terminal(test_namespace, "traced")
    uid = stack_.get(test_namespace, "traced")["metadata"]["uid"]
    deadline = time.monotonic() + 15
    while True:  # each process exports in batches (every 0.5 s): wait for all of them
        spans = spans_in(stack_.launch.log_dir)
        runs = [s for s in spans if s["attributes"].get("gen_ai.agent.id") == uid]
        trace_id = runs[0]["context"]["trace_id"] if runs else None
        children = [s for s in spans if s["context"]["trace_id"] == trace_id and s not in runs]
        chats = [s for s in children if s["name"] == "chat scripted"]
        tools = [s for s in children if s["name"].startswith("execute_tool ")]
        if (runs and len(chats) >= 2 and len(tools) >= 2) or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    (run,) = runs
    assert run["name"] == "invoke_agent traced" and run["parent_id"] is None
    assert run["attributes"]["agentrun.terminal_reason"] == status["terminalReason"] == "completed"
    assert run["attributes"]["gen_ai.usage.input_tokens"] == 260
    run_span = run["context"]["span_id"]
    assert len(chats) == 2 and len(tools) == 2
    assert {s["parent_id"] for s in chats + tools} == {run_span}
    assert {s["attributes"]["gen_ai.tool.call.id"] for s in tools} == {"call_slow", "call_fast"}
    assert all(s["attributes"]["gen_ai.operation.name"] == "chat" for s in chats)
    assert sum(s["attributes"]["gen_ai.usage.input_tokens"] for s in chats) == 260
    operator_pid = run["resource"]["attributes"]["process.pid"]
    assert all(s["resource"]["attributes"]["process.pid"] != operator_pid for s in chats)
    assert not any("gen_ai.tool.call.arguments" in s["attributes"] for s in tools)  # no content


def metric(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def scrape(stack_: E2EStack) -> tuple[str, str]:
    """The operator's metrics text and the workers' (concatenated)."""
    workers = "".join(
        http_get(f"http://127.0.0.1:{w.ports['metrics']}/metrics") for w in stack_.workers
    )
    return http_get(f"http://127.0.0.1:{stack_.operator.ports['metrics']}/metrics"), workers


def test_metrics_count_runs_turns_tools_and_tokens(stack_: E2EStack) -> None:
    """One run of two turns in a tenant of its own: earlier tests' runs, still going in other
    namespaces, count on the same processes meanwhile. Its tenant's counters are exact; the
    metrics without a tenant label are checked against every tenant's (one turn duration per
    committed turn; one token-usage sample per model call that reported usage)."""
    with tenants_of(stack_, {"counted": {}}) as made:
        tenant, namespace = made["counted"]
        op_before, w_before = scrape(stack_)
        stack_.apply(namespace, run_manifest("counted", "E2E-PARALLEL-ORDER: counted"))
        stack_.wait_terminal(namespace, "counted")

        def delta(before: str, after: str, name: str, **labels: str) -> float:
            return metric(after, name, **labels) - metric(before, name, **labels)

        # a worker counts a turn after its commit and hold settlement, and the operator its
        # end around the status patch: the counts may trail the status seen, so poll for the
        # run's end and its turns' durations (observed last, with every tenant's turns)
        deadline = time.monotonic() + 15
        while True:
            op_after, w_after = scrape(stack_)
            ended = delta(
                op_before, op_after, RUNS, tenant=tenant, reason="completed", outcome="ok"
            )
            turns = delta(w_before, w_after, TURNS)
            timed = delta(w_before, w_after, DURATION, phase="overhead")
            mine = delta(w_before, w_after, TURNS, tenant=tenant)
            if (ended >= 1 and mine >= 2 and timed >= turns) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
    assert ended == 1
    assert delta(op_before, op_after, RUNS) >= 1
    assert mine == 2
    assert delta(w_before, w_after, TOOLS, tenant=tenant, tool="sleep", result="ok") == 1
    assert delta(w_before, w_after, TOKENS, tenant=tenant, type="input") == 260
    assert delta(w_before, w_after, TOKENS, tenant=tenant, type="output") == 30
    assert delta(w_before, w_after, DURATION, phase="model") == turns >= 2
    calls = delta(w_before, w_after, "agentrun_model_calls_total")
    assert delta(w_before, w_after, "agentrun_model_calls_total", tenant=tenant) == 2
    samples = delta(w_before, w_after, "gen_ai_client_token_usage_count", gen_ai_token_type="input")
    assert 2 <= samples <= calls, (samples, calls)
    assert "agentrun_dispatch_latency_seconds_bucket" in op_after
    assert "agentrun_worker_concurrency" in w_after
