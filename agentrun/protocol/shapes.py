"""JSON shapes of the NATS payloads that are not on a turn's hot path, as pydantic models.

A TurnRequest, a run's config (carried by its ``admitted`` event) and a reviewer's approval are
parsed here, checked field by field, and converted once into the frozen values of
``protocol.messages``; nothing past this module sees their JSON. The turn events' own records
and summaries are shaped in ``protocol.events`` (hand-written there: see that module for why).
Each shape's fields carry the names of the value it shapes, so a value becomes its shape and
back with no field listed twice; on the wire they are camelCase (``alias_generator``), an
acronym spelled by an explicit alias (``runUID``, ``baseURL``, ``maxCostUSD``).

Raises, when parsing: ``pydantic.ValidationError`` (a ``ValueError``) on a malformed payload.
"""

from __future__ import annotations

import json
import typing
from collections.abc import Callable
from decimal import Decimal
from typing import Annotated, Any, ClassVar, Self, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from agentrun import kernel
from agentrun.protocol import versions
from agentrun.protocol.messages import (
    Approval,
    ModelConfig,
    RemoteTool,
    RunConfig,
    SecretRef,
    TurnRequest,
    UrlRule,
)

V = TypeVar("V")

Names = Annotated[list[str], AfterValidator(sorted)]
"""A set of names, written sorted so equal sets encode to equal bytes."""


class _Shape(BaseModel):
    """A value's JSON shape: its fields by the value's own names, on the wire in camelCase
    (an acronym spelled out by an explicit alias). Dump with ``by_alias=True``."""

    model_config = ConfigDict(
        frozen=True,
        extra="ignore",
        alias_generator=to_camel,
        populate_by_name=True,
        from_attributes=True,
    )

    @classmethod
    def of(cls, value: Any) -> Self:
        """The shape of ``value`` (a frozen dataclass with these fields' names)."""
        return cls.model_validate(value)

    _nested: ClassVar[tuple[str, ...]] = ()
    """The fields that hold shapes or lists (converted by ``build``); the rest pass as they are."""

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        cls._nested = tuple(n for n, f in cls.model_fields.items() if _holds_nested(f.annotation))

    if typing.TYPE_CHECKING:

        def value(self) -> Any:
            """The value this shape stands for (each shape a value is built from has one)."""

    def build(self, kind: Callable[..., V], **overrides: Any) -> V:
        """The value ``kind(...)`` of these fields (shapes inside turned into values, lists into
        tuples), with ``overrides`` taking the place of fields of the same name."""
        fields = dict(self.__dict__)
        for name in self._nested:
            if name not in overrides:
                fields[name] = _value(fields[name])
        fields.update(overrides)
        return kind(**fields)


def _holds_nested(annotation: Any) -> bool:
    if isinstance(annotation, type) and issubclass(annotation, _Shape):
        return True
    if typing.get_origin(annotation) is list:
        return True
    return any(_holds_nested(arg) for arg in typing.get_args(annotation))


def _value(field: Any) -> Any:
    """A field as its value takes it: a shape as its value, a list as a tuple (of values)."""
    if isinstance(field, list):
        if field and isinstance(field[0], _Shape):
            return tuple([item.value() for item in field])
        return tuple(field)
    if isinstance(field, _Shape):
        return field.value()
    return field


class TurnRequestShape(_Shape):
    """A work item on ``agentrun.turn.<tenant>`` (its trace context rides in the headers)."""

    run_uid: str = Field(alias="runUID")
    namespace: str
    name: str
    turn: int
    expected_seq: int
    stored: int = Field(default=0, ge=0)
    """Absent in requests of an older operator; an older worker ignores it."""

    def value(self, *, traceparent: str | None = None) -> TurnRequest:
        """The request as a value."""
        return self.build(TurnRequest, traceparent=traceparent)


class PricingShape(_Shape):
    """USD per one million tokens (decimal strings)."""

    input_per_million: Decimal = Field(alias="inputPerMillionUSD")
    cached_input_per_million: Decimal = Field(alias="cachedInputPerMillionUSD")
    output_per_million: Decimal = Field(alias="outputPerMillionUSD")

    def value(self) -> kernel.Pricing:
        """The prices as a value."""
        return self.build(kernel.Pricing)


class SecretRefShape(_Shape):
    """Where the model's API key lives."""

    name: str
    namespace: str
    key: str

    def value(self) -> SecretRef:
        """The reference as a value."""
        return self.build(SecretRef)


class ModelShape(_Shape):
    """The AgentModel as snapshotted at admission."""

    name: str
    base_url: str = Field(alias="baseURL")
    model: str
    pricing: PricingShape
    context_window: int
    max_output_tokens: int
    secret: SecretRefShape | None = Field(alias="secretRef")

    def value(self) -> ModelConfig:
        """The model as a value."""
        return self.build(ModelConfig)


class LimitsShape(_Shape):
    """The run's own budget (``spec.budget``, resolved at admission); the model's window and
    output cap and the output schema are carried by the model and the config."""

    max_steps: int
    max_tool_calls: int
    max_tokens: int | None
    max_cost_usd: Decimal | None = Field(alias="maxCostUSD")
    no_progress_window: int
    pollable: Names
    on_exhausted: kernel.OnExhausted
    approval_tools: Names


class RemoteToolShape(_Shape):
    """One admitted MCP tool of a run."""

    name: str
    server: str
    tool: str
    description: str
    parameters: dict[str, Any]
    effect: str
    url: str
    transport: str
    timeout: float
    headers_secret: str | None = None
    headers_keys: list[str] = []
    """Absent in configs written before ``headersFrom.keys``: no header is sent then."""
    private_network: bool = False
    """Absent in configs written before tool-server rules: only global addresses then."""
    path_prefix: str = "/"
    """Absent in configs written before the rule's prefix went with the tool: the whole origin
    of the URL then (as those releases allowed)."""

    def value(self) -> RemoteTool:
        """The tool as a value."""
        return self.build(RemoteTool)


class UrlRuleShape(_Shape):
    """One URL rule of ``http_get``."""

    host: str
    path_prefix: str = "/"
    private_network: bool = False

    def value(self) -> UrlRule:
        """The rule as a value."""
        return self.build(UrlRule)


class RunConfigShape(_Shape):
    """Everything a worker needs to run any turn of a run (the ``admitted`` event's config)."""

    uid: str
    namespace: str
    name: str
    goal: str
    instructions: str
    tools: list[str]
    limits: LimitsShape
    model: ModelShape
    deadline: float
    tenant: str
    output_schema: dict[str, Any] | None
    traceparent: str | None
    remote_tools: list[RemoteToolShape] = []
    """Absent in configs written before MCP tools existed."""
    url_rules: list[UrlRuleShape] = []
    """Absent in configs written before http_get existed."""
    reruns: int = 0
    """Absent in configs written before reruns were sealed: a first life."""

    def value(self) -> RunConfig:
        """The config as a value; the model's window and output cap complete its limits."""
        lim, model = self.limits, self.model.value()
        limits = lim.build(
            kernel.Limits,
            context_window=model.context_window,
            max_output_tokens=model.max_output_tokens,
            pollable=frozenset(lim.pollable),
            approval_tools=frozenset(lim.approval_tools),
            output_schema=self.output_schema,
        )
        return self.build(RunConfig, limits=limits, model=model)


class ApprovalShape(_Shape):
    """A reviewer's decision on the pending held call, bound to its digest."""

    digest: str
    approved: bool
    reviewer: str = ""
    after: int = 0

    def value(self) -> Approval:
        """The approval as a value."""
        return self.build(Approval)


def encode_turn_request(request: TurnRequest) -> bytes:
    """A TurnRequest's payload bytes (compact UTF-8 JSON), with ``schemaVersion``."""
    data = TurnRequestShape.of(request).model_dump(by_alias=True)
    versioned = {versions.FIELD: versions.SCHEMA_VERSION, **data}
    return json.dumps(versioned, separators=(",", ":")).encode()


def decode_turn_request(payload: bytes, *, traceparent: str | None = None) -> TurnRequest:
    """Parse a TurnRequest payload. Raises ``versions.UnsupportedSchema`` when it is written in
    a newer schema than this release reads, ``ValueError`` (``pydantic.ValidationError``, JSON
    errors) when it is malformed."""
    data = json.loads(payload)
    if not isinstance(data, dict):
        raise ValueError("a TurnRequest is a JSON object")
    versions.check(data, what="TurnRequest")
    return TurnRequestShape.model_validate(data).value(traceparent=traceparent)


def encode_run_config(config: RunConfig) -> bytes:
    """A run config as an ``admitted`` event carries it (compact UTF-8 JSON)."""
    return RunConfigShape.of(config).model_dump_json(by_alias=True).encode()
