"""``AgentRun.spec`` as pydantic models: the operator's one parser of a run's spec.

What belongs here: the shapes of ``AgentRun.spec`` and of the part of an AgentRun object the
operator keeps while the run is queued, their defaults (each defined once: per-run step and
tool-call caps come from ``kernel.Limits``; the run timeout is here), and ``RunBudgetSpec``, the
per-run caps an AgentTenant defaults and caps too. What does not: the shared base and value
types (``platform.spec``), tenant policy (``tenants``), building a ``RunConfig``
(``admission``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import Field

from agentrun import kernel, protocol

from ..platform.spec import USD, Duration, DurationField, ObjectMeta, SpecModel, parse

KERNEL_DEFAULTS = kernel.Limits()
"""Where per-run step/tool-call caps and the model's window default from."""
DEFAULT_TIMEOUT = protocol.DEFAULT_RUN_TIMEOUT
"""A run's wall-clock budget when neither it nor its tenant sets one."""


class RunStatusView(SpecModel):
    """The part of an AgentRun's ``.status`` the queue pump reads."""

    terminal_reason: str | None = Field(default=None, alias="terminalReason")
    resolved_spec: dict[str, Any] | None = Field(default=None, alias="resolvedSpec")
    """The spec a run with ``spec.agentRef`` executes, recorded when it was created."""
    reruns: int = 0
    """How many times the run was started again from turn 0: the life its next admission
    seals (``RunConfig.reruns``)."""


class RunObject(SpecModel):
    """An AgentRun object as the queue pump keeps it; its spec stays as written until the run
    is admitted (``AgentRunSpec.of`` then names a bad field in the run's status)."""

    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: dict[str, Any] = Field(default_factory=dict)
    status: RunStatusView = Field(default_factory=RunStatusView)

    @classmethod
    def of(cls, obj: Mapping[str, Any]) -> RunObject:
        """Parse an AgentRun object as read from the API server; raises ``SpecError``."""
        return parse(cls, obj, where="AgentRun")

    def run_spec(self) -> dict[str, Any]:
        """The spec the run executes: ``status.resolvedSpec`` for a run of an Agent (once
        recorded), else ``spec`` as written."""
        if "agentRef" in self.spec and self.status.resolved_spec is not None:
            return self.status.resolved_spec
        return self.spec


class RunBudgetSpec(SpecModel):
    """The per-run caps a tenant can default and cap: ``AgentRun.spec.budget`` and
    ``AgentTenant.spec.runBudget.max|default``. ``None``: not set here."""

    max_steps: int | None = Field(default=None, alias="maxSteps")
    max_tool_calls: int | None = Field(default=None, alias="maxToolCalls")
    max_tokens: int | None = Field(default=None, alias="maxTokens")
    max_cost_usd: USD | None = Field(default=None, alias="maxCostUSD")
    timeout: DurationField | None = None

    def filled_from(self, defaults: RunBudgetSpec) -> RunBudgetSpec:
        """This budget with its unset fields taken from ``defaults``."""
        unset = {
            name: getattr(defaults, name)
            for name in RunBudgetSpec.model_fields
            if getattr(self, name) is None
        }
        return self.model_copy(update=unset)

    def written(self) -> dict[str, Any]:
        """The set fields by their CRD names, as written (numbers, decimal and duration text)."""
        return {
            RunBudgetSpec.model_fields[name].alias or name: value
            if isinstance(value, int)
            else str(value)
            for name in RunBudgetSpec.model_fields
            if (value := getattr(self, name)) is not None
        }


IMPLICIT_BUDGET = RunBudgetSpec(
    maxSteps=KERNEL_DEFAULTS.max_steps,
    maxToolCalls=KERNEL_DEFAULTS.max_tool_calls,
    timeout=Duration.parse(DEFAULT_TIMEOUT),
)
"""What a run gets for a field that neither it nor its tenant sets (no token or cost cap)."""


class NoProgressSpec(SpecModel):
    """``spec.budget.noProgress``."""

    window: int = KERNEL_DEFAULTS.no_progress_window
    pollable: tuple[str, ...] = ()


class AgentRunBudget(RunBudgetSpec):
    """``AgentRun.spec.budget``: the caps plus what happens at one."""

    on_exhausted: kernel.OnExhausted = Field(
        default=KERNEL_DEFAULTS.on_exhausted, alias="onExhausted"
    )
    no_progress: NoProgressSpec = Field(default_factory=NoProgressSpec, alias="noProgress")


class ApprovalSpec(SpecModel):
    """``spec.approval``."""

    tools: tuple[str, ...] = ()


class OutputSpec(SpecModel):
    """``spec.output``."""

    json_schema: dict[str, Any] | None = Field(default=None, alias="schema")


class AgentRefSpec(SpecModel):
    """``AgentRun.spec.agentRef``: which Agent, with which parameter values."""

    name: str
    parameters: dict[str, str] = Field(default_factory=dict)


class AgentRunSpec(SpecModel):
    """``AgentRun.spec``. Parse with ``AgentRunSpec.of``."""

    model: str = ""
    agent_ref: AgentRefSpec | None = Field(default=None, alias="agentRef")
    goal: str = ""
    instructions: str | None = None
    tools: tuple[str, ...] = ()
    budget: AgentRunBudget = Field(default_factory=AgentRunBudget)
    approval: ApprovalSpec = Field(default_factory=ApprovalSpec)
    output: OutputSpec = Field(default_factory=OutputSpec)

    @classmethod
    def of(cls, spec: Mapping[str, Any] | None) -> AgentRunSpec:
        """Parse an AgentRun's spec; raises ``SpecError`` naming the field."""
        return parse(cls, spec, where="spec")
