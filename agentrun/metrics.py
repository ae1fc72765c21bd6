"""Prometheus metric objects (names are public API) and what records them.

One module for every ``agentrun_`` metric so names, help texts, units and labels are written
once. Labels are bounded: tenant, model, tool, reason, outcome, phase, kind, type, result,
error_type, and an AgentEval's namespace and name (one series set per AgentEval object) —
never run or case names or ids. Tool names outside the worker's catalog are recorded as
``unknown`` (a model can invent any name); an MCP tool's name (``SERVER__TOOL``, chosen by
whoever writes an AgentToolServer in a tenant's namespace) is its own label value for the
first ``MAX_REMOTE_TOOL_LABELS`` distinct names of a tenant in a process, and ``other`` after
that. Processes do not fork, so the default registry is safe.

Every process imports this module, so an unlabelled gauge registered at import would be
exported at 0 by processes that never set it. The operator-only gauges are registered by the
operator itself: ``agentrun_operator_leader`` by every operator process (`export_operator`),
``agentrun_turns_pending`` by the leader only (`lead`); the labelled operator gauges (phases,
tenants, budgets) have no series until the leader sets them.

Counters exist at 0 before their first event: ``increase()`` over a series that appears with
its first increment sees nothing (Prometheus has no earlier sample), so an alert on the first
burst after a start would never fire. Each process creates the series it increments as soon as
it knows the tenant: the operator ``agentrun_runs_total`` for every reason × outcome when an
AgentTenant is known (``know_tenant``), a worker its per-turn counters when it gets a tenant's
first turn (``know_run``). Creating a series adds 0: nothing is counted twice.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
from collections.abc import Collection, Mapping

from prometheus_client import REGISTRY, Counter, Gauge, Histogram

from agentrun import kernel
from agentrun.ledger import Book
from agentrun.protocol import RunConfig
from agentrun.trust import SealFault


@dataclasses.dataclass(frozen=True, slots=True)
class BusStats:
    """One look at agentrun's JetStream state (``Bus.stats``)."""

    turns_pending: int
    """TurnRequests not yet delivered to a worker."""
    streams: Mapping[str, tuple[int, int]]
    """Stream name → (bytes, messages) stored."""
    consumers: Mapping[str, tuple[int, int]]
    """Durable consumer name → (pending, acknowledgements pending)."""


TURN_PHASE_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    120.0, 300.0,
)  # fmt: skip
"""Seconds, 1 ms to 5 min: a turn phase ranges from a cache hit to a slow model or tool."""
WAIT_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0,
    3600.0, 14400.0, 86400.0,
)  # fmt: skip
"""Seconds, 5 ms to a day: a wait ranges from an idle worker picking a turn up at once to a
run queued until its tenant's budget window resets."""

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
    "Tool calls by result: ok; error (the model's: bad arguments, a domain error, a 4xx); "
    "fault (infrastructure: timeout, connection, 5xx, MCP transport, a crash, an effect left "
    "unknown); denied (by a reviewer); not_run (stopped by a gate).",
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
BUDGET_OVERRUN = Counter(
    "agentrun_budget_overrun_tokens",
    "Tokens model calls used beyond what was held for them (the prompt's bound plus the output "
    "allowance sent as max_tokens): a provider that ignored max_tokens or counted hidden "
    "prompt text. Each such call is also the end of its run when it took the run past a cap.",
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
TENANT_INFO = Gauge(
    "agentrun_tenant_info",
    "1 for every AgentTenant the leading operator knows (and the default tenant), whether or "
    "not it has a budget or has run anything: the list of tenants.",
    ["tenant"],
)
MODEL_CALLS = Counter(
    "agentrun_model_calls",
    "Model (chat) calls made by workers, failed ones included, by tenant and AgentModel.",
    ["tenant", "model"],
)
MODEL_CALL_ERRORS = Counter(
    "agentrun_model_call_errors",
    "Model calls that failed after the client's retries, by tenant, AgentModel and error_type "
    "(rate_limited, auth, client_error, server_error, timeout, connection, filtered, deadline, "
    "credentials, invalid_response).",
    ["tenant", "model", "error_type"],
)
TURN_QUEUE_WAIT = Histogram(
    "agentrun_turn_queue_wait_seconds",
    "From a TurnRequest's publication in the work queue to a worker starting it (every "
    "delivery; a redelivered request counts from its first publication).",
    buckets=WAIT_BUCKETS,
)
ADMISSION_WAIT = Histogram(
    "agentrun_run_admission_wait_seconds",
    "From an AgentRun's creation to its admission by the operator (time spent Queued included), "
    "by tenant.",
    ["tenant"],
    buckets=WAIT_BUCKETS,
)
TURNS_PENDING = Gauge(
    "agentrun_turns_pending",
    "TurnRequests waiting in the work queue for a worker (queue lag); exported by the leading "
    "operator only.",
    registry=None,
)
"""Not registered at import: only the leader exports it (`lead`), so a standby operator or a
worker never shows a 0 that would hide a dead leader."""
OPERATOR_LEADER = Gauge(
    "agentrun_operator_leader",
    "1 while this operator process holds the leader Lease, 0 while it stands by.",
    registry=None,
)
"""Registered by operator processes only (`export_operator`): its absence means no operator."""
OPERATOR_SHARD_OWNED = Gauge(
    "agentrun_operator_shard_owned",
    "1 for each operator shard this process owns (holds its Lease and runs its work), 0 for "
    "a shard it gave up; summed over the processes, 1 per shard while every shard is owned.",
    ["shard"],
    registry=None,
)
"""Registered by operator processes only (`export_operator`)."""
CRD_MISMATCH = Gauge(
    "agentrun_crd_mismatch",
    "1 while the installed CRDs do not serve every field this operator writes (it is not ready "
    "and touches nothing until they are applied), 0 once they do.",
    registry=None,
)
"""Registered by operator processes only (`export_operator`)."""
JETSTREAM_STORE_LIMIT = Gauge(
    "agentrun_jetstream_store_limit_bytes",
    "The JetStream file store's size the streams share (AGENTRUN_JETSTREAM_STORE_BYTES: the "
    "NATS server's max_file_store), in bytes.",
    registry=None,
)
"""Registered only when the store's size is configured (`export_store_limit`)."""
JETSTREAM_STREAM_BYTES = Gauge(
    "agentrun_jetstream_stream_bytes",
    "Bytes stored by each of agentrun's JetStream streams (the work queue, the run events, the "
    "ledger and effect buckets); exported by the leading operator.",
    ["stream"],
)
JETSTREAM_STREAM_MESSAGES = Gauge(
    "agentrun_jetstream_stream_messages",
    "Messages stored by each of agentrun's JetStream streams; exported by the leading operator.",
    ["stream"],
)
JETSTREAM_CONSUMER_PENDING = Gauge(
    "agentrun_jetstream_consumer_pending",
    "Messages a durable consumer has not been delivered yet (its lag): agentrun-workers on the "
    "work queue, agentrun-operator on the run events; exported by the leading operator.",
    ["consumer"],
)
JETSTREAM_CONSUMER_ACK_PENDING = Gauge(
    "agentrun_jetstream_consumer_ack_pending",
    "Messages a durable consumer was delivered and has not acknowledged yet (in flight); "
    "exported by the leading operator.",
    ["consumer"],
)
APPROVAL_OLDEST = Gauge(
    "agentrun_approval_oldest_request_timestamp_seconds",
    "When the oldest tool call still waiting for a person's decision was held, by tenant "
    "(Unix seconds; no series while none waits); exported by the leading operator.",
    ["tenant"],
)
MESSAGES_REFUSED = Counter(
    "agentrun_messages_refused",
    "Messages refused as not the operator's, by reason: a run config or approval without a "
    "valid seal for its run (unsigned, unknown_key, bad_signature, wrong_run, replayed, "
    "changed_config), "
    "a tenant ledger book rolled back below what the operator saw (ledger_rollback).",
    ["reason"],
)
"""Every reason exists at 0 from import (a refusal is rare: its first one must show in
``increase()``)."""
for _fault in SealFault:
    MESSAGES_REFUSED.labels(reason=_fault.value)
TURNS_UNDELIVERED = Counter(
    "agentrun_turns_undelivered",
    "TurnRequests the workers' consumer would never deliver (its state no longer matches the "
    "work queue), taken out and published again by the orphan watch, by reason: "
    "below_ack_floor, delivered_not_pending, not_counted, not_delivered.",
    ["reason"],
    registry=None,
)
"""Registered by operator processes only (`export_operator`), every reason at 0."""
UNDELIVERED_REASONS = ("below_ack_floor", "delivered_not_pending", "not_counted", "not_delivered")
"""Every ``reason`` of ``agentrun_turns_undelivered_total`` (the operator's
``runs.undelivered.Verdict`` that are stuck)."""
IN_FLIGHT = Gauge("agentrun_worker_turns_in_flight", "Turns this worker is running now.")
CONCURRENCY = Gauge("agentrun_worker_concurrency", "Most turns this worker runs at once.")
TURN_MEMORY = Gauge(
    "agentrun_worker_turn_memory_bytes",
    "Bytes of memory the turns this worker runs reserved (estimated from their runs' events).",
)
TURN_MEMORY_LIMIT = Gauge(
    "agentrun_worker_turn_memory_limit_bytes",
    "Most bytes of memory the turns this worker runs may reserve at once.",
)
TURNS_WAITING_MEMORY = Gauge(
    "agentrun_worker_turns_waiting_memory",
    "Turns this worker holds that wait for room in their tenant's share of its turn memory "
    "(counted in agentrun_worker_turns_in_flight too).",
)
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


class ModelErrorType(enum.StrEnum):
    """Every ``error_type`` of ``agentrun_model_call_errors_total``: why a model call failed."""

    RATE_LIMITED = "rate_limited"
    """HTTP 429 after the client's retries (``insufficient_quota`` included)."""
    AUTH = "auth"
    """HTTP 401 or 403: the API key is wrong, revoked or lacks access to the model."""
    CLIENT_ERROR = "client_error"
    """Another HTTP 4xx: the request was refused (unknown model, too long a prompt...)."""
    SERVER_ERROR = "server_error"
    """HTTP 5xx after the client's retries."""
    TIMEOUT = "timeout"
    """The HTTP client timed out."""
    CONNECTION = "connection"
    """No connection to the endpoint (DNS, refused, reset, TLS)."""
    FILTERED = "filtered"
    """The provider's content filter rejected the request."""
    DEADLINE = "deadline"
    """The run's deadline passed before or during the call, or the provider asked to retry
    after it."""
    CREDENTIALS = "credentials"
    """The API key's Secret could not be read."""
    INVALID_RESPONSE = "invalid_response"
    """The endpoint answered with something that is not a chat completion (not JSON...)."""


CORRECTION_KINDS = ("malformed", "invalid_tool_call", "output_schema", "no_progress_nudge")
"""Every ``kind`` of ``agentrun_corrections_total`` (``correction_kinds``)."""
TOOL_RESULTS = ("ok", "error", "fault", "denied", "not_run")
"""Every ``result`` of ``agentrun_tool_calls_total`` (``tool_result``)."""
TOKEN_TYPES = ("input", "cached_input", "output", "reasoning")
"""Every ``type`` of ``agentrun_tokens_total``."""
MAX_REMOTE_TOOL_LABELS = 32
"""Distinct MCP tool names one tenant's ``agentrun_tool_calls_total`` series carry in a
process; later names count as ``OTHER_TOOL``."""
OTHER_TOOL = "other"
_remote_labels: dict[str, set[str]] = {}
"""The MCP tool names given a label of their own, per tenant."""
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
    end with, and its ``agentrun_tenant_info`` (the operator, which counts run ends, calls it
    when it learns of a tenant)."""
    if ("runs", tenant) in _known:
        return
    TENANT_INFO.labels(tenant=tenant).set(1)
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
    MODEL_CALLS.labels(tenant=tenant, model=model)
    for error_type in ModelErrorType:
        MODEL_CALL_ERRORS.labels(tenant=tenant, model=model, error_type=error_type.value)
    USAGE_ESTIMATED.labels(tenant=tenant, model=model)
    BUDGET_OVERRUN.labels(tenant=tenant, model=model)
    _known.add(("turns", tenant, model))


def record_model_call(
    config: RunConfig,
    *,
    seconds: float,
    usage: kernel.Usage | None,
    error_type: ModelErrorType | None = None,
    error_class: str = "",
) -> None:
    """One chat call of ``config``'s run: the GenAI client metrics (by the provider's model
    name, ``error_class`` as their ``error_type``) and the agentrun model-call counters (by
    tenant and AgentModel name, a failure by its bounded ``error_type``)."""
    model = config.model.model
    labels = {"gen_ai_operation_name": "chat", "gen_ai_provider_name": "openai"}
    GEN_AI_DURATION.labels(**labels, gen_ai_request_model=model, error_type=error_class).observe(
        seconds
    )
    if usage is not None and not usage.estimated:
        for kind, count in (("input", usage.input_tokens), ("output", usage.output_tokens)):
            GEN_AI_TOKEN_USAGE.labels(
                **labels, gen_ai_request_model=model, gen_ai_token_type=kind
            ).observe(count)
    count_model_call(config.tenant, model=config.model.name, error_type=error_type)


def count_model_call(tenant: str, *, model: str, error_type: ModelErrorType | None) -> None:
    """Count one model call of ``tenant`` to the AgentModel ``model`` (its object name, a
    bounded set), and its failure when ``error_type`` is given."""
    MODEL_CALLS.labels(tenant=tenant, model=model).inc()
    if error_type is not None:
        MODEL_CALL_ERRORS.labels(tenant=tenant, model=model, error_type=error_type.value).inc()


def record_undelivered(reason: str) -> None:
    """One TurnRequest the workers' consumer would never deliver, published again, for
    ``reason`` (one of ``UNDELIVERED_REASONS``; ``agentrun_turns_undelivered_total``)."""
    TURNS_UNDELIVERED.labels(reason=reason).inc()


def record_refusal(fault: SealFault) -> None:
    """One message refused for ``fault`` (``agentrun_messages_refused_total``)."""
    MESSAGES_REFUSED.labels(reason=fault.value).inc()


def export_operator() -> None:
    """Export ``agentrun_operator_leader`` and ``agentrun_crd_mismatch`` (at 0), the shards'
    gauge and ``agentrun_turns_undelivered_total`` (every reason at 0) from this process: an
    operator calls it at start-up, before it waits for the Lease. Idempotent."""
    if ("operator",) not in _known:
        OPERATOR_LEADER.set(0)
        REGISTRY.register(OPERATOR_LEADER)
        CRD_MISMATCH.set(0)
        REGISTRY.register(CRD_MISMATCH)
        REGISTRY.register(OPERATOR_SHARD_OWNED)
        for reason in UNDELIVERED_REASONS:
            TURNS_UNDELIVERED.labels(reason=reason)
        REGISTRY.register(TURNS_UNDELIVERED)
        _known.add(("operator",))


def export_store_limit(limit_bytes: int) -> None:
    """Export ``agentrun_jetstream_store_limit_bytes`` (when ``limit_bytes`` > 0: the store's
    size is known). Idempotent."""
    if limit_bytes <= 0:
        return
    JETSTREAM_STORE_LIMIT.set(limit_bytes)
    if ("store",) not in _known:
        REGISTRY.register(JETSTREAM_STORE_LIMIT)
        _known.add(("store",))


_bus_consumers: set[str] = set()
"""The consumers ``record_bus`` last exported."""


def record_bus(stats: BusStats) -> None:
    """Set the work queue's backlog and the JetStream gauges from one look at the bus; the
    series of a consumer no longer looked at (a shard given up) are dropped."""
    TURNS_PENDING.set(stats.turns_pending)
    for stream, (size, messages) in stats.streams.items():
        JETSTREAM_STREAM_BYTES.labels(stream=stream).set(size)
        JETSTREAM_STREAM_MESSAGES.labels(stream=stream).set(messages)
    for consumer, (pending, ack_pending) in stats.consumers.items():
        JETSTREAM_CONSUMER_PENDING.labels(consumer=consumer).set(pending)
        JETSTREAM_CONSUMER_ACK_PENDING.labels(consumer=consumer).set(ack_pending)
    for gone in _bus_consumers - set(stats.consumers):
        for gauge in (JETSTREAM_CONSUMER_PENDING, JETSTREAM_CONSUMER_ACK_PENDING):
            with contextlib.suppress(KeyError):
                gauge.remove(gone)
    _bus_consumers.clear()
    _bus_consumers.update(stats.consumers)


def record_live_runs(
    phases: Mapping[tuple[str, str], int], oldest_approval: Mapping[str, float]
) -> None:
    """Set ``agentrun_runs_in_phase`` (runs per tenant and phase) and the oldest held call's
    time per tenant; series of tenants and phases that emptied are dropped."""
    RUNS_BY_PHASE.clear()
    for (tenant, phase_name), count in phases.items():
        RUNS_BY_PHASE.labels(tenant=tenant, phase=phase_name).set(count)
    APPROVAL_OLDEST.clear()
    for tenant, held_at in oldest_approval.items():
        APPROVAL_OLDEST.labels(tenant=tenant).set(held_at)


def lead() -> None:
    """This operator leads: ``agentrun_operator_leader`` goes to 1 and the leader-only gauges
    (``agentrun_turns_pending``) are exported from now on. A leader that loses its Lease exits,
    so nothing is unexported. Idempotent."""
    export_operator()
    OPERATOR_LEADER.set(1)
    if ("leader",) not in _known:
        REGISTRY.register(TURNS_PENDING)
        _known.add(("leader",))


def own_shards(owned: Collection[int], *, given_up: Collection[int] = ()) -> None:
    """``agentrun_operator_shard_owned``: 1 for each shard in ``owned``, 0 for each in
    ``given_up``."""
    export_operator()
    for shard in owned:
        OPERATOR_SHARD_OWNED.labels(shard=str(shard)).set(1)
    for shard in given_up:
        OPERATOR_SHARD_OWNED.labels(shard=str(shard)).set(0)


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
    _count_tools(record, config=config, catalog=catalog)
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


def record_overrun(config: RunConfig, *, tokens: int) -> None:
    """``tokens`` a model call of ``config``'s run used beyond what was held for it."""
    if tokens > 0:
        BUDGET_OVERRUN.labels(tenant=config.tenant, model=config.model.name).inc(tokens)


def tool_result(result: kernel.ToolResult, *, denied: bool, not_run: bool) -> str:
    """The ``result`` label of one call (one of ``TOOL_RESULTS``): ``fault`` for an
    infrastructure failure (``kernel.ToolFault.infrastructure``), ``error`` for an error the
    model caused (or one recorded before faults were classified)."""
    if denied:
        return "denied"
    if not_run:
        return "not_run"
    if result.infrastructure_failure:
        return "fault"
    return "error" if result.is_error else "ok"


def tool_label(name: str, *, tenant: str, catalog: Collection[str], remote: Collection[str]) -> str:
    """The ``tool`` label of a call of ``name``: a catalog tool's name; an MCP tool of the run
    (``remote``) by its name while the tenant has fewer than ``MAX_REMOTE_TOOL_LABELS`` such
    names, else ``other``; anything else (a name the model invented) ``unknown``."""
    if name in catalog:
        return name
    if name not in remote:
        return "unknown"
    named = _remote_labels.setdefault(tenant, set())
    if name in named:
        return name
    if len(named) >= MAX_REMOTE_TOOL_LABELS:
        return OTHER_TOOL
    named.add(name)
    return name


def _count_tools(record: kernel.TurnRecord, *, config: RunConfig, catalog: Collection[str]) -> None:
    if not isinstance(record, kernel.Answered | kernel.Resumed):
        return
    tenant = config.tenant
    remote = {t.name for t in config.remote_tools}
    resumed = isinstance(record, kernel.Resumed)
    for result in record.results:
        outcome = tool_result(
            result,
            denied=resumed and result.content == kernel.DENIED,
            not_run=record.stopped is not None,
        )
        tool = tool_label(result.name, tenant=tenant, catalog=catalog, remote=remote)
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


def forget_tenant_budgets() -> None:
    """Drop every tenant's budget series (``agentrun_tenant_budget_*``): the operator's parts
    stopped, and the next ones (of other shards, perhaps) set those of the tenants they own;
    a tenant whose shard went to another process is not shown here with frozen values."""
    for gauge in (TENANT_BUDGET_LIMIT, TENANT_BUDGET_USED, TENANT_BUDGET_RESERVED):
        gauge.clear()


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
