"""Prometheus metric objects (names are public API) and what records them.

One module for every ``agentrun_`` metric so names, help texts, units and labels are written
once. Labels are bounded: tenant, model, tool, reason, outcome, phase, kind, type, result, and
an AgentEval's namespace and name (one series set per AgentEval object) — never run or case
names or ids. Tool names outside the worker's catalog are recorded as ``unknown``
(a model can invent any name). Processes do not fork, so the default registry is safe.

Counters exist at 0 before their first event: ``increase()`` over a series that appears with
its first increment sees nothing (Prometheus has no earlier sample), so an alert on the first
burst after a start would never fire. Each process creates the series it increments as soon as
it knows the tenant: the operator ``agentrun_runs_total`` for every reason × outcome when an
AgentTenant is known (``know_tenant``), a worker its per-turn counters when it gets a tenant's
first turn (``know_run``). Creating a series adds 0: nothing is counted twice.
"""

from __future__ import annotations

import contextlib
from collections.abc import Collection

from prometheus_client import Counter, Gauge, Histogram

from agentrun import kernel
from agentrun.ledger import Book
from agentrun.protocol import RunConfig

TURN_PHASE_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    120.0, 300.0,
)  # fmt: skip
"""Seconds, 1 ms to 5 min: a turn phase ranges from a cache hit to a slow model or tool."""

RUNS = Counter(
    "agentrun_runs",
    "Runs that ended, by terminal reason and outcome (counted once per run).",
    ["tenant", "reason", "outcome"],
)
TURNS = Counter("agentrun_turns", "Turns committed.", ["tenant"])
TURN_DURATION = Histogram(
    "agentrun_turn_duration_seconds",
    "Time of one turn by phase: model call(s), tool batch, and everything else (overhead).",
    ["phase"],
    buckets=TURN_PHASE_BUCKETS,
)
TOOL_CALLS = Counter(
    "agentrun_tool_calls",
    "Tool calls by result: ok, error, denied (by a reviewer) or not_run (stopped by a gate).",
    ["tenant", "tool", "result"],
)
CORRECTIONS = Counter(
    "agentrun_corrections",
    "Corrective turns by kind: malformed, invalid_tool_call, output_schema, no_progress_nudge.",
    ["tenant", "kind"],
)
TOKENS = Counter(
    "agentrun_tokens",
    "Model tokens by type: input (all prompt tokens), cached_input (their cached part), output "
    "(all completion tokens, reasoning included), reasoning (the reasoning part of output).",
    ["tenant", "model", "type"],
)
COST = Counter("agentrun_cost_usd", "Model spend in US dollars.", ["tenant", "model"])
USAGE_ESTIMATED = Counter(
    "agentrun_usage_estimated",
    "Model calls whose response carried no usable usage, so tokens were estimated.",
    ["tenant", "model"],
)
RUNS_BY_PHASE = Gauge(
    "agentrun_runs_in_phase",
    "Runs not yet ended, by phase (Pending, Queued, Running, AwaitingApproval).",
    ["tenant", "phase"],
)
"""Not ``agentrun_runs``: a gauge of that name collides with the family of the counter
``agentrun_runs_total`` (OpenMetrics; prometheus-client refuses both): hence ``_in_phase``."""
DISPATCH_LATENCY = Histogram(
    "agentrun_dispatch_latency_seconds",
    "From a committed turn event to the next TurnRequest published by the operator.",
    buckets=TURN_PHASE_BUCKETS,
)
TENANT_BUDGET_LIMIT = Gauge(
    "agentrun_tenant_budget_limit",
    "An AgentTenant's budget per window by resource: tokens, cost_usd (US dollars), "
    "wall_clock_seconds. Absent for unlimited resources.",
    ["tenant", "resource"],
)
TENANT_BUDGET_USED = Gauge(
    "agentrun_tenant_budget_used",
    "What an AgentTenant used of its budget in the current window, by resource (same units "
    "as agentrun_tenant_budget_limit); reservations of calls in flight not included.",
    ["tenant", "resource"],
)
TENANT_BUDGET_RESERVED = Gauge(
    "agentrun_tenant_budget_reserved",
    "Worst case held by an AgentTenant's model calls in flight, by resource.",
    ["tenant", "resource"],
)
TURNS_PENDING = Gauge(
    "agentrun_turns_pending", "TurnRequests waiting in the work queue for a worker (queue lag)."
)
IN_FLIGHT = Gauge("agentrun_worker_turns_in_flight", "Turns this worker is running now.")
CONCURRENCY = Gauge("agentrun_worker_concurrency", "Most turns this worker runs at once.")
EVAL_CASES = Counter(
    "agentrun_eval_cases",
    "AgentEval cases graded, by result (passed, failed); counted once per case and round.",
    ["namespace", "eval", "result"],
)
"""Labelled by the AgentEval's namespace and name (bounded by the AgentEval objects, never
case or run names); the operator creates both results at 0 when it first sees an eval."""
EVAL_PASS_RATIO = Gauge(
    "agentrun_eval_pass_ratio",
    "Share of the cases that passed in an AgentEval's last complete round (0 to 1).",
    ["namespace", "eval"],
)
EVAL_RESULTS = ("passed", "failed")
"""Every ``result`` of ``agentrun_eval_cases_total``."""


GEN_AI_TOKEN_BUCKETS = (
    1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864,
)  # fmt: skip
"""Explicit bucket boundaries of ``gen_ai.client.token.usage`` (OTel GenAI metrics)."""
GEN_AI_DURATION_BUCKETS = (
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
)  # fmt: skip
"""Explicit bucket boundaries of ``gen_ai.client.operation.duration`` (OTel GenAI metrics)."""

GEN_AI_TOKEN_USAGE = Histogram(
    "gen_ai_client_token_usage",
    "Number of input and output tokens used per model call (OTel gen_ai.client.token.usage).",
    ["gen_ai_operation_name", "gen_ai_provider_name", "gen_ai_request_model", "gen_ai_token_type"],
    buckets=GEN_AI_TOKEN_BUCKETS,
)
GEN_AI_DURATION = Histogram(
    "gen_ai_client_operation_duration_seconds",
    "Duration of model calls (OTel gen_ai.client.operation.duration), seconds.",
    ["gen_ai_operation_name", "gen_ai_provider_name", "gen_ai_request_model", "error_type"],
    buckets=GEN_AI_DURATION_BUCKETS,
)


CORRECTION_KINDS = ("malformed", "invalid_tool_call", "output_schema", "no_progress_nudge")
"""Every ``kind`` of ``agentrun_corrections_total`` (``correction_kinds``)."""
TOOL_RESULTS = ("ok", "error", "denied", "not_run")
"""Every ``result`` of ``agentrun_tool_calls_total``."""
TOKEN_TYPES = ("input", "cached_input", "output", "reasoning")
"""Every ``type`` of ``agentrun_tokens_total``."""
_known: set[tuple[str, ...]] = set()
"""What this process has created series for already (each set of series is made once)."""


def run_ends() -> frozenset[tuple[str, str]]:
    """Every ``(reason, outcome)`` pair a run can end with (``kernel.conclude``)."""
    pairs = set()
    for phase in kernel.Phase:
        for steps in (0, 1):
            terminal = kernel.conclude(phase, steps=steps)
            if terminal is not None:
                pairs.add((terminal.reason.value, terminal.outcome.value))
    return frozenset(pairs)


RUN_ENDS = run_ends()


def know_tenant(tenant: str) -> None:
    """Create ``agentrun_runs_total`` at 0 for ``tenant`` × every reason and outcome a run can
    end with (the operator, which counts run ends, calls it when it learns of a tenant)."""
    if ("runs", tenant) in _known:
        return
    for reason, outcome in RUN_ENDS:
        RUNS.labels(tenant=tenant, reason=reason, outcome=outcome)
    _known.add(("runs", tenant))


def know_run(config: RunConfig, *, catalog: Collection[str]) -> None:
    """Create at 0 the per-turn counters a worker increments for ``config``'s tenant (turns,
    corrections by kind, tool calls by catalog tool and result, tokens by type, cost, estimated
    usage, for its model); called before the run's turn is executed."""
    tenant, model = config.tenant, config.model.name
    if ("turns", tenant, model) in _known:
        return
    TURNS.labels(tenant=tenant)
    for kind in CORRECTION_KINDS:
        CORRECTIONS.labels(tenant=tenant, kind=kind)
    for tool in (*catalog, "unknown"):
        for result in TOOL_RESULTS:
            TOOL_CALLS.labels(tenant=tenant, tool=tool, result=result)
    for kind in TOKEN_TYPES:
        TOKENS.labels(tenant=tenant, model=model, type=kind)
    COST.labels(tenant=tenant, model=model)
    USAGE_ESTIMATED.labels(tenant=tenant, model=model)
    _known.add(("turns", tenant, model))


def record_model_call(
    *, model: str, seconds: float, usage: kernel.Usage | None, error_type: str | None
) -> None:
    """The GenAI client metrics of one chat call (``model`` is the provider's model name)."""
    labels = {"gen_ai_operation_name": "chat", "gen_ai_provider_name": "openai"}
    GEN_AI_DURATION.labels(
        **labels, gen_ai_request_model=model, error_type=error_type or ""
    ).observe(seconds)
    if usage is not None and not usage.estimated:
        for kind, count in (("input", usage.input_tokens), ("output", usage.output_tokens)):
            GEN_AI_TOKEN_USAGE.labels(
                **labels, gen_ai_request_model=model, gen_ai_token_type=kind
            ).observe(count)


def record_turn(
    record: kernel.TurnRecord,
    *,
    before: kernel.RunState,
    after: kernel.RunState,
    config: RunConfig,
    catalog: Collection[str],
) -> None:
    """Count a committed turn: the turn, its tool calls, corrections, tokens and cost.

    ``model`` labels carry the AgentModel's name (a cluster-scoped object: a bounded set).
    """
    tenant, model = config.tenant, config.model.name
    TURNS.labels(tenant=tenant).inc()
    _count_tools(record, tenant=tenant, catalog=catalog)
    window = config.limits.no_progress_window
    for kind in correction_kinds(record, before=before, after=after, window=window):
        CORRECTIONS.labels(tenant=tenant, kind=kind).inc()
    usage = kernel.record_usage(record)
    if usage.input_tokens or usage.output_tokens:
        TOKENS.labels(tenant=tenant, model=model, type="input").inc(usage.input_tokens)
        TOKENS.labels(tenant=tenant, model=model, type="cached_input").inc(
            usage.cached_input_tokens
        )
        TOKENS.labels(tenant=tenant, model=model, type="output").inc(usage.output_tokens)
        TOKENS.labels(tenant=tenant, model=model, type="reasoning").inc(usage.reasoning_tokens)
        COST.labels(tenant=tenant, model=model).inc(float(usage.cost_usd))
    if usage.estimated:
        USAGE_ESTIMATED.labels(tenant=tenant, model=model).inc()


def _count_tools(record: kernel.TurnRecord, *, tenant: str, catalog: Collection[str]) -> None:
    if not isinstance(record, kernel.Answered | kernel.Resumed):
        return
    resumed = isinstance(record, kernel.Resumed)
    for result in record.results:
        if result.content == kernel.DENIED and resumed:
            outcome = "denied"
        elif record.stopped is not None:
            outcome = "not_run"
        else:
            outcome = "error" if result.is_error else "ok"
        tool = result.name if result.name in catalog else "unknown"
        TOOL_CALLS.labels(tenant=tenant, tool=tool, result=outcome).inc()


def correction_kinds(
    record: kernel.TurnRecord, *, before: kernel.RunState, after: kernel.RunState, window: int
) -> list[str]:
    """Which corrections a turn earned (empty for a clean turn)."""
    kinds: list[str] = []
    if isinstance(record, kernel.Answered):
        if isinstance(record.decision, kernel.Malformed):
            kinds.append("malformed")
        if any(isinstance(c, kernel.InvalidCall) for c in record.calls):
            kinds.append("invalid_tool_call")
    if after.output_failures > before.output_failures:
        kinds.append("output_schema")
    if after.stale_streak == window and after.stale_streak > before.stale_streak:
        kinds.append("no_progress_nudge")  # the kernel nudges exactly then
    return kinds


def record_end(state: kernel.RunState, *, tenant: str) -> None:
    """Count a run that ended (call once per run)."""
    terminal = kernel.conclude(state.phase, steps=state.steps)
    if terminal is not None:
        RUNS.labels(
            tenant=tenant, reason=terminal.reason.value, outcome=terminal.outcome.value
        ).inc()


def record_tenant_budget(tenant: str, book: Book, *, now: float) -> None:
    """Set the tenant budget gauges from the tenant's ledger entry (epoch ``now``)."""
    limits = book.limits
    values = {
        "tokens": (limits.tokens, book.used_tokens, book.reserved_tokens),
        "cost_usd": (
            None if limits.cost_usd is None else float(limits.cost_usd),
            float(book.used_cost),
            float(book.reserved_cost),
        ),
        "wall_clock_seconds": (limits.wall_seconds, book.wall_used(now), 0.0),
    }
    for resource, (limit, used, reserved) in values.items():
        TENANT_BUDGET_USED.labels(tenant=tenant, resource=resource).set(used)
        TENANT_BUDGET_RESERVED.labels(tenant=tenant, resource=resource).set(reserved)
        if limit is None:
            with contextlib.suppress(KeyError):
                TENANT_BUDGET_LIMIT.remove(tenant, resource)
        else:
            TENANT_BUDGET_LIMIT.labels(tenant=tenant, resource=resource).set(limit)


def know_eval(namespace: str, name: str) -> None:
    """Create an AgentEval's case counters at 0 (once per process)."""
    if ("eval", namespace, name) in _known:
        return
    _known.add(("eval", namespace, name))
    for result in EVAL_RESULTS:
        EVAL_CASES.labels(namespace=namespace, eval=name, result=result)


def forget_eval(namespace: str, name: str) -> None:
    """Drop a deleted AgentEval's series."""
    _known.discard(("eval", namespace, name))
    for result in EVAL_RESULTS:
        with contextlib.suppress(KeyError):
            EVAL_CASES.remove(namespace, name, result)
    with contextlib.suppress(KeyError):
        EVAL_PASS_RATIO.remove(namespace, name)
