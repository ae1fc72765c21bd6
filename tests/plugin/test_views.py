"""What ``kubectl agentrun`` prints, from values (no cluster): trajectory lines, table rows,
ages, rerun manifests."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from agentrun import kernel, protocol
from agentrun.cli import describe, kubectl, trajectory
from agentrun.kernel import decision as dec
from agentrun.protocol import Approval, RunEvent


def summary(phase: kernel.Phase = kernel.Phase.RUNNING, **fields: Any) -> kernel.RunSummary:
    return kernel.RunSummary(phase=phase, **fields)


def test_long_text_is_cut_on_one_line_with_its_length() -> None:
    assert trajectory.truncate("a\nb   c", 10) == "a b c"
    assert trajectory.truncate("x" * 30, 10) == "xxxxxxxxx… (30 chars)"


def test_a_turn_shows_text_calls_results_rejections_and_usage() -> None:
    record = kernel.Answered(
        turn=2,
        decision=dec.ToolCalls((), "Let me check."),
        usage=kernel.Usage(100, 20, 40, Decimal("0.00045")),
        calls=(
            kernel.CheckedCall("c1", "calculate", {"expression": "6*7"}),
            kernel.InvalidCall("c2", "nope", "unknown tool 'nope'"),
            kernel.CheckedCall("c3", "deploy", {"x": "y" * 200}),
        ),
        results=(
            kernel.ToolResult("c1", "calculate", "42"),
            kernel.ToolResult("c2", "nope", "ERROR: unknown tool 'nope'", is_error=True),
        ),
        held=("c3",),
    )
    event = RunEvent("turn", "u", summary(), record=record, time=3600.0)
    lines = trajectory.event_lines(event)
    assert lines[0] == "01:00:00 turn 2: model"
    body = [line.strip() for line in lines[1:]]
    assert body[:4] == [
        "says: Let me check.",
        '→ calculate({"expression":"6*7"}) [c1]',
        "← calculate [c1]: 42",
        "✗ nope [c2] rejected: unknown tool 'nope'",
    ]
    # a held call is shown in full for review, with the digest that approves exactly it
    assert body[4:10] == [
        "⏸ deploy [c3] held for approval",
        f"digest {kernel.digest_of('deploy', {'x': 'y' * 200})}",
        "deploy arguments (in full):",
        "{",
        f'"x": "{"y" * 200}"',
        "}",
    ]
    assert body[10] == "usage 100 in (40 cached) + 20 out tokens, 0.000450 USD"


def test_a_committed_decision_shows_its_calls_pending_then_their_results() -> None:
    decided = kernel.Answered(
        turn=0,
        decision=dec.ToolCalls((), None),
        usage=kernel.Usage(10, 2),
        calls=(kernel.CheckedCall("w1", "ledger__count", {"key": "a"}),),
        deferred=("w1",),
    )
    lines = trajectory.event_lines(RunEvent("turn", "u", summary(), record=decided, time=0.0))
    body = [line.strip() for line in lines[1:]]
    assert body[:2] == [
        '→ ledger__count({"key":"a"}) [w1]',
        "⏸ ledger__count [w1] committed; runs next turn",
    ]
    resumed = kernel.Resumed(1, (kernel.ToolResult("w1", "ledger__count", "a=1"),))
    lines = trajectory.event_lines(RunEvent("turn", "u", summary(), record=resumed, time=0.0))
    assert lines[0].endswith("turn 1: pending calls settled (after review, or committed first)")
    assert lines[1].strip() == "← ledger__count [w1]: a=1"


def test_a_correction_and_the_end_are_shown() -> None:
    record = kernel.Answered(
        turn=0,
        decision=dec.Malformed(dec.MalformedCause.EMPTY, "empty reply"),
        usage=kernel.Usage(),
    )
    ended = summary(
        kernel.Phase.COMPLETED, steps=2, tool_calls=1, answer="42", usage=kernel.Usage(10, 5)
    )
    lines = trajectory.event_lines(RunEvent("turn", "u", ended, record=record, time=0.0))
    assert lines[1].strip() == "correction (empty): empty reply"
    assert lines[-1] == (
        "--:--:-- end   Succeeded completed (ok): 2 steps, 1 tool call, 15 tokens, "
        "0.000000 USD; answer: 42"
    )


def test_reviews_and_stops_are_one_line_each() -> None:
    review = RunEvent("approval", "u", summary(), approval=Approval("sha256:ab", False), time=0)
    assert trajectory.event_lines(review) == ["--:--:-- review denied held call sha256:ab"]
    stopped = summary(kernel.Phase.CANCELLED, message="cancelled by the annotation")
    lines = trajectory.event_lines(RunEvent("stop", "u", stopped, time=0))
    assert lines[0] == "--:--:-- stop  cancelled by the annotation"
    assert lines[1].startswith("--:--:-- end   Cancelled cancelled (none)")


AGES: list[Any] = [
    pytest.param(5, "5s", id="seconds"),
    pytest.param(90, "1m", id="minutes"),
    pytest.param(3 * 3600, "3h", id="hours"),
    pytest.param(3 * 86400, "3d", id="days"),
]


@pytest.mark.parametrize(("seconds", "shown"), AGES)
def test_age_reads_like_kubectls(seconds: int, shown: str) -> None:
    assert kubectl.age("1970-01-01T00:00:00Z", now=float(seconds)) == shown


def test_a_table_row_shows_tenant_queue_position_and_cost() -> None:
    obj = {
        "metadata": {"name": "r", "namespace": "ns", "creationTimestamp": "1970-01-01T00:00:00Z"},
        "status": {
            "tenant": "team",
            "phase": "Queued",
            "queuePosition": 2,
            "usage": {"steps": 0, "totalTokens": 0, "costUSD": "0.012345"},
        },
    }
    row = kubectl.run_row(obj, now=10.0)
    assert [row[c] for c in ("TENANT", "PHASE", "REASON", "QUEUE", "COST", "AGE")] == [
        "team",
        "Queued",
        "-",
        "2",
        "$0.0123",
        "10s",
    ]
    text = kubectl.table([row], ["NAME", "PHASE"])
    assert text.splitlines() == ["NAME   PHASE", "r      Queued"]


COSTS: list[Any] = [
    pytest.param("0.012345", "$0.0123", id="four-places"),
    pytest.param("0.00003585", "$0.00003585", id="below-a-hundredth-cent-exact"),
    pytest.param("0.000000", "$0.0000", id="free"),
    pytest.param(None, "-", id="none-yet"),
]


@pytest.mark.parametrize(("cost", "shown"), COSTS)
def test_a_cost_that_is_not_zero_never_shows_as_zero(cost: str | None, shown: str) -> None:
    """A cheap model's run (131 tokens at $0.15/M) once showed ``$0.0000`` in ``get``."""
    assert kubectl.money(cost) == shown


def test_a_rerun_copies_the_spec_and_labels_and_says_where_from() -> None:
    obj = {
        "apiVersion": "agentrun.dev/v1alpha1",
        "metadata": {"name": "nightly", "labels": {"team": "a"}, "uid": "x", "generation": 1},
        "spec": {"goal": "g", "agentRef": {"name": "helper"}},
        "status": {"phase": "Succeeded"},
    }
    manifest = kubectl.rerun_manifest(obj, name=None)
    assert manifest == {
        "apiVersion": "agentrun.dev/v1alpha1",
        "kind": "AgentRun",
        "metadata": {
            "labels": {"team": "a", "agentrun.dev/rerun-of": "nightly"},
            "generateName": "nightly-",
        },
        "spec": {"goal": "g", "agentRef": {"name": "helper"}},
    }
    assert kubectl.rerun_manifest(obj, name="again")["metadata"]["name"] == "again"


def test_describe_lists_every_held_call_of_a_batch_with_its_decision() -> None:
    """One approval per call, in turn: describe shows which is next and what is decided."""
    waiting = kernel.HeldCall("d2", "deploy", {"version": "2"}, "sha256:b")
    batch = (
        kernel.HeldCall("d1", "deploy", {"version": "1"}, "sha256:a", True),
        waiting,
    )
    summary_ = summary(
        kernel.Phase.AWAITING_APPROVAL, pending_approval=waiting, held_for_approval=batch
    )
    status = {
        "phase": "AwaitingApproval",
        "pendingApproval": protocol.pending_approval_as_dict(summary_),
    }
    obj = {"metadata": {"name": "ship", "namespace": "team-a"}, "spec": {}, "status": status}
    lines = describe.describe_lines(obj, [])
    start = lines.index(  # the command names the namespace: it works from any context
        "Pending:       call 2 of 2 held for approval, decided in turn: "
        "kubectl agentrun approve|deny ship -n team-a --digest sha256:b"
    )
    assert lines[start + 1 : start + 8] == [
        '    1. deploy call d1: approved ({"version":"1"})',
        "  → 2. deploy call d2: pending",
        "       digest sha256:b",
        "       deploy arguments (in full):",
        "         {",
        '           "version": "2"',
        "         }",
    ]


def test_describe_counts_calls_not_run_apart_from_failed_ones() -> None:
    """The demo's inventory run: 3 calls returned values, a budget cut the next 3."""
    limits = kernel.Limits(max_tool_calls=4)
    calls = tuple(kernel.CheckedCall(i, "calculate", {}) for i in "abc")
    ran = kernel.Answered(
        0,
        kernel.ToolCalls(tuple(kernel.ToolCall(c.id, c.name, "{}") for c in calls), None),
        calls=calls,
        results=tuple(kernel.ToolResult(c.id, c.name, "40") for c in calls),
    )
    state = kernel.advance(kernel.initial_state(goal="g"), ran, limits)
    cut = tuple(kernel.CheckedCall(i, "calculate", {}) for i in "def")
    stopped = kernel.Answered(
        1,
        kernel.ToolCalls(tuple(kernel.ToolCall(c.id, c.name, "{}") for c in cut), None),
        calls=cut,
        results=kernel.not_run(cut, "over the tool budget"),
        stopped=kernel.Ending(kernel.Phase.TOOL_BUDGET_EXHAUSTED, "over the tool budget"),
    )
    summary_ = protocol.summary_from_dict(
        protocol.summary_as_dict(kernel.advance(state, stopped, limits).summary())
    )
    usage = {
        "toolCalls": summary_.tool_calls,
        "toolFailures": summary_.tool_failures,
        "toolCallsNotRun": summary_.tool_calls_not_run,
    }
    obj = {"metadata": {"name": "inventory"}, "spec": {}, "status": {"usage": usage}}
    (line,) = [x for x in describe.describe_lines(obj, []) if x.startswith("Usage:")]
    assert "3 tool calls (0 failed), 3 not run," in line


def test_describe_shows_the_limits_a_run_without_a_budget_gets() -> None:
    obj = {
        "metadata": {"name": "inventory", "namespace": "team-a"},
        "spec": {"budget": {"onExhausted": "summarize"}},
        "status": {"tenant": "team-a", "phase": "Succeeded"},
    }
    lines = describe.describe_lines(obj, [])
    start = next(i for i, line in enumerate(lines) if line.startswith("Budget:"))
    limits = kernel.Limits()
    assert lines[start : start + 4] == [
        f"Budget:        maxSteps {limits.max_steps} (default), maxToolCalls "
        f"{limits.max_tool_calls} (default), timeout 10m (default), onExhausted summarize",
        "               no maxTokens or maxCostUSD cap of the run's own",
        "               defaults apply unless AgentTenant team-a sets runBudget.default; "
        "its runBudget.max caps every run",
        "               the caps it was admitted with: kubectl agentrun logs inventory -n team-a "
        "(its first lines)",
    ]


def test_describe_of_a_run_above_its_tenants_cap_says_where_its_admitted_caps_show() -> None:
    """A tenant with ``overMax: Clamp`` lowers a cap the spec set above its ``runBudget.max``
    without an error: the spec still shows what was asked, so describe says the tenant caps
    it and where the caps it runs under show, though no default applies."""
    budget = {"maxSteps": 10, "maxToolCalls": 5, "timeout": "2m"}
    obj = {"metadata": {"name": "big", "namespace": "team-b"}, "spec": {"budget": budget}}
    obj["status"] = {"tenant": "team-b", "phase": "Running"}
    lines = describe.describe_lines(obj, [])
    start = next(i for i, line in enumerate(lines) if line.startswith("Budget:"))
    assert lines[start + 2 : start + 4] == [
        "               AgentTenant team-b's runBudget.max caps every run",
        "               the caps it was admitted with: kubectl agentrun logs big -n team-b "
        "(its first lines)",
    ]


@pytest.mark.parametrize("phase", [None, "Pending", "Queued"])
def test_describe_of_a_run_not_admitted_yet_says_its_caps_show_once_it_is(
    phase: str | None,
) -> None:
    obj = {"metadata": {"name": "big", "namespace": "team-b"}, "spec": {"budget": {}}}
    obj["status"] = {"tenant": "team-b", **({"phase": phase} if phase else {})}
    lines = describe.describe_lines(obj, [])
    assert "               the caps it is admitted with show here once it is admitted" in lines
    assert not any("kubectl agentrun logs" in line for line in lines)


def test_describe_shows_the_caps_a_run_was_admitted_with_marking_those_its_tenant_lowered() -> None:
    """``status.budget`` shown beside the spec: maxSteps 10 asked, 3 given by a tenant with
    ``overMax: Clamp``; maxToolCalls and the timeout as asked (the timeout as Kubernetes
    writes it); maxTokens, which the run left unset, from its tenant."""
    budget = {"maxSteps": 10, "maxToolCalls": 5, "timeout": "2m"}
    admitted = {"maxSteps": 3, "maxToolCalls": 5, "maxTokens": 1000, "timeout": "2m0s"}
    obj = {"metadata": {"name": "big", "namespace": "team-b"}, "spec": {"budget": budget}}
    obj["status"] = {"tenant": "team-b", "phase": "Running", "budget": admitted}
    lines = describe.describe_lines(obj, [])
    start = next(i for i, line in enumerate(lines) if line.startswith("Budget:"))
    assert lines[start + 2 : start + 4] == [
        "               AgentTenant team-b's runBudget.max caps every run",
        "Admitted with: maxSteps 3 (10 asked; the tenant's runBudget.max), maxToolCalls 5, "
        "maxTokens 1000, timeout 2m0s",
    ]
    assert not any("kubectl agentrun logs" in line for line in lines)


@pytest.mark.parametrize(
    ("name", "admitted", "asked", "lowered"),
    [
        ("maxCostUSD", "0.25", "0.5", True),
        ("maxCostUSD", "0.50", "0.5", False),
        ("timeout", "5m0s", "10m", True),
        ("timeout", "9m59.998s", "10m", False),  # admitted before the deadline's fix
        ("timeout", "1m30s", "90s", False),
        ("maxTokens", 1000, 1000, False),
        ("maxTokens", "lots", 1000, False),  # not a number: not marked, not an error
    ],
)
def test_describe_marks_a_cap_lowered_only_when_below_what_was_asked(
    name: str, admitted: Any, asked: Any, lowered: bool
) -> None:
    line = describe.admitted_line({name: asked}, {name: admitted})
    assert line.endswith("; the tenant's runBudget.max)") is lowered, line


def test_describe_shows_a_budget_set_in_full_without_defaults() -> None:
    budget = {
        "maxSteps": 5,
        "maxToolCalls": 9,
        "maxTokens": 1000,
        "maxCostUSD": "0.5",
        "timeout": "2m",
        "noProgress": {"window": 3},
    }
    lines = describe.budget_lines(budget, tenant=None)
    assert lines == [
        "Budget:        maxSteps 5, maxToolCalls 9, maxTokens 1000, maxCostUSD 0.5, timeout 2m"
    ]


def test_describe_says_how_many_times_a_run_was_started_again() -> None:
    obj = {"metadata": {"name": "again"}, "spec": {}, "status": {"reruns": 2}}
    assert "Reruns:        2 (started again from turn 0)" in describe.describe_lines(obj, [])
    first = {"metadata": {"name": "first"}, "spec": {}, "status": {}}
    assert not any(x.startswith("Reruns:") for x in describe.describe_lines(first, []))


def test_describe_counts_one_of_a_kind_in_the_singular() -> None:
    usage = {"steps": 1, "toolCalls": 1, "corrections": 1, "totalTokens": 1, "costUSD": "0"}
    obj = {"metadata": {"name": "one"}, "spec": {}, "status": {"usage": usage}}
    (line,) = [x for x in describe.describe_lines(obj, []) if x.startswith("Usage:")]
    assert "1 step, 1 tool call (0 failed), 0 not run, 1 correction, 1 token, 0 USD" in line


def test_describe_of_a_run_that_ended_before_admission_says_no_caps_applied() -> None:
    """A run refused before admission (``invalid_spec``) ran under no caps: describe neither
    points at its logs for the caps it was admitted with nor says they will show."""
    obj = {"metadata": {"name": "typo", "namespace": "team-b"}, "spec": {"budget": {}}}
    obj["status"] = {"tenant": "team-b", "phase": "Failed", "terminalReason": "invalid_spec"}
    lines = describe.describe_lines(obj, [])
    assert "               it ended before it was admitted: none of these applied" in lines
    assert not any("kubectl agentrun logs" in line or "once it is" in line for line in lines)


@pytest.mark.parametrize(
    ("status", "agent", "budget"),
    [
        pytest.param(
            {"tenant": "team-b", "phase": "Queued"},
            "not resolved yet",
            "its Agent's (with the run's own spec.budget on top)",
            id="queued",
        ),
        pytest.param(
            {"tenant": "team-b", "phase": "Failed", "terminalReason": "invalid_spec"},
            "never resolved",
            "none: it ended before its Agent was resolved (with the run's own spec.budget on top)",
            id="refused",
        ),
    ],
)
def test_describe_of_an_agent_run_not_resolved_shows_no_default_caps(
    status: dict[str, Any], agent: str, budget: str
) -> None:
    """An AgentRun of an Agent whose Agent was not resolved runs (or ran) under no caps of
    its spec alone: the Agent's budget applies once resolved; the built-in defaults (20
    steps, 50 tool calls) were shown as if they applied."""
    spec = {"agentRef": {"name": "geometry", "parameters": {"heigth": "3"}}, "goal": "g"}
    obj = {"metadata": {"name": "typo", "namespace": "team-b"}, "spec": spec, "status": status}
    lines = describe.describe_lines(obj, [])
    assert f"Agent:         geometry (generation ?, {agent})" in lines
    assert f"Budget:        {budget}" in lines
    assert not any("(default)" in line for line in lines)
