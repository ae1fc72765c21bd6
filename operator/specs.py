"""The CRD specs as pydantic models: the operator's one parser of what kopf hands it.

What belongs here: the shapes of ``AgentRun.spec``, ``Agent.spec`` and ``AgentModel.spec``,
their defaults (each defined once: per-run step and tool-call caps and the model's window come
from ``kernel.Limits``; the run timeout is here), the base model and value types every spec
shares (``SpecModel``, ``Duration``, USD amounts) and the conversion of a validation error into
one message naming the field (``spec.budget.maxCostUSD: 'lots' is not a decimal number``).
What does not: ``AgentTenant.spec`` (``tenantspecs``), tenant policy (``tenancy``), building a
``RunConfig`` (``admission``).

The API server already checks most of this against the CRD schemas; parsing again here keeps
the operator safe from objects written before a schema change, or without one (tests).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from typing import Annotated, Any, TypeVar

import pydantic
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PlainValidator

from agentrun import kernel

KERNEL_DEFAULTS = kernel.Limits()
"""Where per-run step/tool-call caps and the model's window default from."""
DEFAULT_TIMEOUT = "10m"
"""A run's wall-clock budget when neither it nor its tenant sets one."""

_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


class SpecError(ValueError):
    """A spec that does not parse; the message names the field."""


@dataclasses.dataclass(frozen=True, slots=True, order=True)
class Duration:
    """A Go-style duration (``90s``, ``1h30m``, ``250ms``): compared by its seconds, printed
    as written."""

    seconds: float
    text: str = dataclasses.field(compare=False)

    def __str__(self) -> str:
        return self.text

    @classmethod
    def parse(cls, value: Any) -> Duration:
        """Raises ``ValueError`` for anything but a duration (a number alone has no unit)."""
        if isinstance(value, Duration):
            return value
        text = str(value).strip()
        pos, total = 0, 0.0
        for match in _DURATION.finditer(text):
            if match.start() != pos:
                break
            total += float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
            pos = match.end()
        if pos != len(text) or not text:
            raise ValueError(f"{value!r} is not a duration like 90s, 10m or 1h30m")
        return cls(total, text)


def _usd(value: Any) -> Decimal:
    """A non-negative decimal amount (USD); raises ``ValueError``."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a decimal number")
    try:
        number = Decimal(str(value))
    except InvalidOperation as err:
        raise ValueError(f"{value!r} is not a decimal number") from err
    if not number.is_finite() or number < 0:
        raise ValueError(f"{value!r} must be a non-negative decimal")
    return number


DurationField = Annotated[Duration, PlainValidator(Duration.parse)]
USD = Annotated[Decimal, PlainValidator(_usd)]


class SpecModel(BaseModel):
    """The base of every spec model: frozen, camelCase on the wire, unknown fields ignored (the
    CRD schema prunes them)."""

    model_config = ConfigDict(frozen=True, extra="ignore", populate_by_name=True)


M = TypeVar("M", bound=SpecModel)


def parse(model: type[M], data: Mapping[str, Any] | None, *, where: str) -> M:
    """``data`` as ``model``; raises ``SpecError`` naming the first bad field under ``where``
    (e.g. ``spec``)."""
    try:
        return model.model_validate(dict(data or {}))
    except pydantic.ValidationError as err:
        raise SpecError(describe(err, where=where)) from None


def describe(err: pydantic.ValidationError, *, where: str) -> str:
    """The first error as ``<where>.<field path>: <what is wrong>``."""
    first = err.errors()[0]
    path = ".".join([where, *(str(part) for part in first["loc"])])
    if first["type"] == "value_error":
        return f"{path}: {first['ctx']['error']}"
    return f"{path}: {first['input']!r} is invalid ({first['msg'][0].lower()}{first['msg'][1:]})"


# --- object metadata --------------------------------------------------------------------------


Generation = Annotated[int, BeforeValidator(lambda value: value or 1)]
"""``metadata.generation``; an object that has none (a stand-in, an old fixture) is at 1."""


class ObjectMeta(SpecModel):
    """The part of ``metadata`` the operator reads."""

    name: str = ""
    uid: str = ""
    generation: Generation = 1
    annotations: dict[str, str] = Field(default_factory=dict)

    @classmethod
    def of(cls, obj: Mapping[str, Any]) -> ObjectMeta:
        """The metadata of a Kubernetes object (as a dict); raises ``SpecError``."""
        return parse(cls, obj.get("metadata"), where="metadata")


class RunStatusView(SpecModel):
    """The part of an AgentRun's ``.status`` the queue pump reads."""

    terminal_reason: str | None = Field(default=None, alias="terminalReason")
    resolved_spec: dict[str, Any] | None = Field(default=None, alias="resolvedSpec")
    """The spec a run with ``spec.agentRef`` executes, recorded when it was created."""


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


# --- AgentRun ---------------------------------------------------------------------------------


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


# --- Agent ------------------------------------------------------------------------------------


class ParameterSpec(SpecModel):
    """One of ``Agent.spec.parameters``."""

    name: str
    description: str = ""
    default: str | None = None
    required: bool = False


class AgentSpec(SpecModel):
    """``Agent.spec``: the fields a run of the Agent takes (as written: ``agents`` copies them
    into the run's resolved spec) and the parameters it declares. Parse with
    ``AgentSpec.of``."""

    model: str = ""
    instructions: str | None = None
    tools: tuple[str, ...] = ()
    parameters: tuple[ParameterSpec, ...] = ()

    @classmethod
    def of(cls, name: str, spec: Mapping[str, Any] | None) -> AgentSpec:
        """Parse Agent ``name``'s spec; raises ``SpecError`` naming the Agent and field."""
        return parse(cls, spec, where=f"Agent {name!r} spec")


# --- AgentModel -------------------------------------------------------------------------------


class PricingSpec(SpecModel):
    """``AgentModel.spec.pricing``: USD per one million tokens."""

    input_per_million: USD = Field(default=Decimal(0), alias="inputPerMillionUSD")
    cached_input_per_million: USD = Field(default=Decimal(0), alias="cachedInputPerMillionUSD")
    output_per_million: USD = Field(default=Decimal(0), alias="outputPerMillionUSD")
    free: bool = False
    """``pricing.free: true``: the model's calls cost nothing, said on purpose."""

    @property
    def unpriced(self) -> bool:
        """No price is set and the model is not declared free: its calls would be charged
        0 USD, so no cost budget could hold them."""
        prices = (self.input_per_million, self.cached_input_per_million, self.output_per_million)
        return not self.free and not any(prices)


class SecretRefSpec(SpecModel):
    """``AgentModel.spec.credentials.secretRef``."""

    name: str
    namespace: str
    key: str = "apiKey"


class CredentialsSpec(SpecModel):
    """``AgentModel.spec.credentials``."""

    secret_ref: SecretRefSpec | None = Field(default=None, alias="secretRef")


class AgentModelSpec(SpecModel):
    """``AgentModel.spec``. Parse with ``AgentModelSpec.of``."""

    base_url: str = Field(default="", alias="baseURL")
    model: str = ""
    pricing: PricingSpec = Field(default_factory=PricingSpec)
    context_window: int = Field(default=KERNEL_DEFAULTS.context_window, alias="contextWindow")
    max_output_tokens: int = Field(
        default=KERNEL_DEFAULTS.max_output_tokens, alias="maxOutputTokens"
    )
    credentials: CredentialsSpec = Field(default_factory=CredentialsSpec)

    @classmethod
    def of(cls, name: str, spec: Mapping[str, Any] | None) -> AgentModelSpec:
        """Parse AgentModel ``name``'s spec; raises ``SpecError`` naming the model and field."""
        return parse(cls, spec, where=f"AgentModel {name!r} spec")
