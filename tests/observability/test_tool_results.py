"""``agentrun_tool_calls_total`` tells infrastructure failures from errors the model caused.

A dashboard reading ``result="error"`` sees what the model got wrong (bad arguments, a domain
error, a 4xx); ``result="fault"`` is what the platform must fix (timeouts, connections, 5xx,
MCP transport, tool crashes, an effect left unknown). One row per fault class, so a new class
cannot land without its label.
"""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import REGISTRY

from agentrun import kernel, metrics
from agentrun.kernel import ToolFault
from agentrun.protocol import ModelConfig, RemoteTool, RunConfig

LABEL_OF_FAULT = {
    ToolFault.ARGUMENTS: "error",
    ToolFault.DOMAIN: "error",
    ToolFault.REJECTED: "error",
    ToolFault.TIMEOUT: "fault",
    ToolFault.CONNECTION: "fault",
    ToolFault.SERVER: "fault",
    ToolFault.TRANSPORT: "fault",
    ToolFault.CRASHED: "fault",
    ToolFault.EFFECT_UNKNOWN: "fault",
}


def run_config(tenant: str, model: str, *, tools: tuple[str, ...] = (), **extra: Any) -> RunConfig:
    """A run of ``tenant`` on AgentModel ``model`` with ``tools``."""
    return RunConfig(
        uid="u",
        namespace="ns",
        name="r",
        goal="g",
        instructions="",
        tools=tools,
        limits=kernel.Limits(),
        model=ModelConfig(model, "http://unused.invalid/v1", "m", kernel.Pricing(), 1, 1),
        deadline=0.0,
        tenant=tenant,
        **extra,
    )


def test_every_fault_class_has_its_row() -> None:
    assert set(LABEL_OF_FAULT) == set(ToolFault)


@pytest.mark.parametrize(
    ("fault", "label"),
    sorted(LABEL_OF_FAULT.items()),
    ids=[f.value for f in sorted(LABEL_OF_FAULT)],
)
def test_a_failed_call_is_labelled_by_who_caused_it(fault: ToolFault, label: str) -> None:
    result = kernel.ToolResult("c1", "t", "failed", True, fault)
    assert metrics.tool_result(result, denied=False, not_run=False) == label
    assert label in metrics.TOOL_RESULTS


@pytest.mark.parametrize(
    ("result", "denied", "not_run", "label"),
    [
        (kernel.ToolResult("c1", "t", "42"), False, False, "ok"),
        (kernel.ToolResult("c1", "t", "old error", True), False, False, "error"),
        (kernel.ToolResult("c1", "t", kernel.DENIED, True), True, False, "denied"),
        (kernel.ToolResult("c1", "t", "not run", True, ToolFault.TIMEOUT), False, True, "not_run"),
    ],
    ids=["ok", "unclassified-error", "denied", "not-run"],
)
def test_the_other_results_keep_their_labels(
    result: kernel.ToolResult, denied: bool, not_run: bool, label: str
) -> None:
    assert metrics.tool_result(result, denied=denied, not_run=not_run) == label


def test_a_committed_turn_counts_each_call_under_its_label() -> None:
    config = run_config("labels-tenant", "labels-model", tools=("calculate",))
    metrics.know_run(config, catalog=("calculate",))
    calls = tuple(kernel.CheckedCall(f"c{i}", "calculate", {}) for i in range(3))
    results = (
        kernel.ToolResult("c0", "calculate", "2"),
        kernel.ToolResult("c1", "calculate", "division by zero", True, ToolFault.DOMAIN),
        kernel.ToolResult("c2", "calculate", "timed out", True, ToolFault.TIMEOUT),
    )
    state = kernel.initial_state(goal="g")
    record = kernel.Answered(0, kernel.ToolCalls((), None), calls=calls, results=results)
    after = kernel.advance(state, record, config.limits)
    metrics.record_turn(record, before=state, after=after, config=config, catalog=("calculate",))

    def value(result: str) -> float | None:
        labels = {"tenant": "labels-tenant", "tool": "calculate", "result": result}
        return REGISTRY.get_sample_value("agentrun_tool_calls_total", labels)

    assert [value(r) for r in metrics.TOOL_RESULTS] == [1, 1, 1, 0, 0]


def test_mcp_tool_names_are_labels_up_to_a_bound_per_tenant_then_other() -> None:
    """Whoever writes an AgentToolServer names its tools: a tenant cannot make the series
    grow without bound by declaring ever new names."""
    remote = [
        RemoteTool(f"srv__t{i}", "srv", f"t{i}", "", {}, "read", "http://h/mcp", "SSE", 1.0)
        for i in range(metrics.MAX_REMOTE_TOOL_LABELS + 5)
    ]
    tools = tuple(t.name for t in remote)
    config = run_config("bounded-tenant", "bound-model", tools=tools, remote_tools=tuple(remote))
    calls = tuple(kernel.CheckedCall(f"c{i}", t.name, {}) for i, t in enumerate(remote))
    invented = kernel.InvalidCall("x", "made_up_by_the_model", "unknown tool")
    results = tuple(kernel.ToolResult(c.id, c.name, "ok") for c in calls)
    results += (kernel.ToolResult("x", invented.name, "ERROR", True, ToolFault.ARGUMENTS),)
    state = kernel.initial_state(goal="g")
    record = kernel.Answered(
        0, kernel.ToolCalls((), None), calls=(*calls, invented), results=results
    )
    after = kernel.advance(state, record, config.limits)
    metrics.record_turn(record, before=state, after=after, config=config, catalog=("calculate",))

    tools = {
        s.labels["tool"]
        for family in REGISTRY.collect()
        if family.name == "agentrun_tool_calls"
        for s in family.samples
        if s.labels.get("tenant") == "bounded-tenant" and s.name.endswith("_total")
    }
    assert len(tools - {"other", "unknown"}) == metrics.MAX_REMOTE_TOOL_LABELS
    assert {"other", "unknown"} <= tools

    def value(tool: str) -> float | None:
        labels = {"tenant": "bounded-tenant", "tool": tool, "result": "ok"}
        return REGISTRY.get_sample_value("agentrun_tool_calls_total", labels)

    assert value("other") == 5  # the calls past the bound are still counted
    assert value("srv__t0") == 1  # a name already labelled keeps its label
    assert (
        metrics.tool_label("srv__t0", tenant="bounded-tenant", catalog=(), remote={"srv__t0"})
        == "srv__t0"
    )


@pytest.mark.parametrize("estimated", [True, False], ids=["estimated", "reported"])
def test_a_turn_whose_usage_was_estimated_is_counted_as_such(estimated: bool) -> None:
    """``agentrun_usage_estimated_total`` counts the calls whose provider reported no usable
    usage (C17): what an operator alerts on before trusting the spend figures."""
    config = run_config("estimated-tenant", "estimated-model")
    metrics.know_run(config, catalog=())
    labels = {"tenant": "estimated-tenant", "model": "estimated-model"}
    before = REGISTRY.get_sample_value("agentrun_usage_estimated_total", labels) or 0.0
    state = kernel.initial_state(goal="g")
    usage = kernel.Usage(
        10,
        5,
        0,
        kernel.Pricing().cost(input_tokens=10, cached_input_tokens=0, output_tokens=5),
        estimated,
    )
    record = kernel.Answered(0, kernel.Final("done"), usage=usage)
    after = kernel.advance(state, record, config.limits)
    metrics.record_turn(record, before=state, after=after, config=config, catalog=())
    now = REGISTRY.get_sample_value("agentrun_usage_estimated_total", labels)
    assert now == before + (1 if estimated else 0)
