"""JSON shapes of the NATS payloads that are not on a turn's hot path, as pydantic models.

A TurnRequest, a run's config (carried by its ``admitted`` event) and a reviewer's approval are
parsed here, checked field by field, and converted once into the frozen values of
``protocol.messages``; nothing past this module sees their JSON. The turn events' own records
and summaries are shaped in ``protocol.events`` (hand-written there: see that module for why).
Field names are the wire's (camelCase), so each model reads as the payload does.

Raises, when parsing: ``pydantic.ValidationError`` (a ``ValueError``) on a malformed payload.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from pydantic import BaseModel, ConfigDict

from agentrun import kernel
from agentrun.protocol.messages import (
    Approval,
    ModelConfig,
    RemoteTool,
    RunConfig,
    SecretRef,
    TurnRequest,
    UrlRule,
)


class _Shape(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")


class TurnRequestShape(_Shape):
    """A work item on ``agentrun.turn.<tenant>`` (its trace context rides in the headers)."""

    runUID: str
    namespace: str
    name: str
    turn: int
    expectedSeq: int

    @classmethod
    def of(cls, request: TurnRequest) -> TurnRequestShape:
        """The shape of ``request``."""
        return cls(
            runUID=request.run_uid,
            namespace=request.namespace,
            name=request.name,
            turn=request.turn,
            expectedSeq=request.expected_seq,
        )

    def value(self, *, traceparent: str | None = None) -> TurnRequest:
        """The request as a value."""
        return TurnRequest(
            self.runUID, self.namespace, self.name, self.turn, self.expectedSeq, traceparent
        )


class PricingShape(_Shape):
    """USD per one million tokens (decimal strings)."""

    inputPerMillionUSD: Decimal
    cachedInputPerMillionUSD: Decimal
    outputPerMillionUSD: Decimal


class SecretRefShape(_Shape):
    """Where the model's API key lives."""

    name: str
    namespace: str
    key: str


class ModelShape(_Shape):
    """The AgentModel as snapshotted at admission."""

    name: str
    baseURL: str
    model: str
    pricing: PricingShape
    contextWindow: int
    maxOutputTokens: int
    secretRef: SecretRefShape | None

    @classmethod
    def of(cls, model: ModelConfig) -> ModelShape:
        """The shape of ``model``."""
        pricing, secret = model.pricing, model.secret
        return cls(
            name=model.name,
            baseURL=model.base_url,
            model=model.model,
            pricing=PricingShape(
                inputPerMillionUSD=pricing.input_per_million,
                cachedInputPerMillionUSD=pricing.cached_input_per_million,
                outputPerMillionUSD=pricing.output_per_million,
            ),
            contextWindow=model.context_window,
            maxOutputTokens=model.max_output_tokens,
            secretRef=None
            if secret is None
            else SecretRefShape(name=secret.name, namespace=secret.namespace, key=secret.key),
        )

    def value(self) -> ModelConfig:
        """The model as a value."""
        p, s = self.pricing, self.secretRef
        return ModelConfig(
            name=self.name,
            base_url=self.baseURL,
            model=self.model,
            pricing=kernel.Pricing(
                p.inputPerMillionUSD, p.cachedInputPerMillionUSD, p.outputPerMillionUSD
            ),
            context_window=self.contextWindow,
            max_output_tokens=self.maxOutputTokens,
            secret=None if s is None else SecretRef(s.name, s.namespace, s.key),
        )


class LimitsShape(_Shape):
    """The run's own budget (``spec.budget``, resolved at admission)."""

    maxSteps: int
    maxToolCalls: int
    maxTokens: int | None
    maxCostUSD: Decimal | None
    noProgressWindow: int
    pollable: list[str]
    onExhausted: kernel.OnExhausted
    approvalTools: list[str]


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
    headersSecret: str | None = None

    @classmethod
    def of(cls, tool: RemoteTool) -> RemoteToolShape:
        """The shape of ``tool``."""
        return cls(
            name=tool.name,
            server=tool.server,
            tool=tool.tool,
            description=tool.description,
            parameters=dict(tool.parameters),
            effect=tool.effect,
            url=tool.url,
            transport=tool.transport,
            timeout=tool.timeout,
            headersSecret=tool.headers_secret,
        )

    def value(self) -> RemoteTool:
        """The tool as a value."""
        return RemoteTool(
            self.name,
            self.server,
            self.tool,
            self.description,
            self.parameters,
            self.effect,
            self.url,
            self.transport,
            self.timeout,
            self.headersSecret,
        )


class UrlRuleShape(_Shape):
    """One URL rule of ``http_get``."""

    host: str
    pathPrefix: str = "/"
    privateNetwork: bool = False

    @classmethod
    def of(cls, rule: UrlRule) -> UrlRuleShape:
        """The shape of ``rule``."""
        return cls(host=rule.host, pathPrefix=rule.path_prefix, privateNetwork=rule.private_network)

    def value(self) -> UrlRule:
        """The rule as a value."""
        return UrlRule(self.host, self.pathPrefix, self.privateNetwork)


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
    outputSchema: dict[str, Any] | None
    traceparent: str | None
    remoteTools: list[RemoteToolShape] = []
    """Absent in configs written before MCP tools existed."""
    urlRules: list[UrlRuleShape] = []
    """Absent in configs written before http_get existed."""

    @classmethod
    def of(cls, config: RunConfig) -> RunConfigShape:
        """The shape of ``config``."""
        lim = config.limits
        return cls(
            uid=config.uid,
            namespace=config.namespace,
            name=config.name,
            goal=config.goal,
            instructions=config.instructions,
            tools=list(config.tools),
            limits=LimitsShape(
                maxSteps=lim.max_steps,
                maxToolCalls=lim.max_tool_calls,
                maxTokens=lim.max_tokens,
                maxCostUSD=lim.max_cost_usd,
                noProgressWindow=lim.no_progress_window,
                pollable=sorted(lim.pollable),
                onExhausted=lim.on_exhausted,
                approvalTools=sorted(lim.approval_tools),
            ),
            model=ModelShape.of(config.model),
            deadline=config.deadline,
            tenant=config.tenant,
            outputSchema=None if config.output_schema is None else dict(config.output_schema),
            traceparent=config.traceparent,
            remoteTools=[RemoteToolShape.of(t) for t in config.remote_tools],
            urlRules=[UrlRuleShape.of(r) for r in config.url_rules],
        )

    def value(self) -> RunConfig:
        """The config as a value; the model's window and output cap complete its limits."""
        lim, model = self.limits, self.model.value()
        return RunConfig(
            uid=self.uid,
            namespace=self.namespace,
            name=self.name,
            goal=self.goal,
            instructions=self.instructions,
            tools=tuple(self.tools),
            limits=kernel.Limits(
                max_steps=lim.maxSteps,
                max_tool_calls=lim.maxToolCalls,
                max_tokens=lim.maxTokens,
                max_cost_usd=lim.maxCostUSD,
                context_window=model.context_window,
                max_output_tokens=model.max_output_tokens,
                no_progress_window=lim.noProgressWindow,
                pollable=frozenset(lim.pollable),
                output_schema=self.outputSchema,
                on_exhausted=lim.onExhausted,
                approval_tools=frozenset(lim.approvalTools),
            ),
            model=model,
            deadline=self.deadline,
            tenant=self.tenant,
            output_schema=self.outputSchema,
            traceparent=self.traceparent,
            remote_tools=tuple(t.value() for t in self.remoteTools),
            url_rules=tuple(r.value() for r in self.urlRules),
        )


class ApprovalShape(_Shape):
    """A reviewer's decision on the pending held call, bound to its digest."""

    digest: str
    approved: bool

    @classmethod
    def of(cls, approval: Approval) -> ApprovalShape:
        """The shape of ``approval``."""
        return cls(digest=approval.digest, approved=approval.approved)

    def value(self) -> Approval:
        """The approval as a value."""
        return Approval(self.digest, self.approved)


def encode_turn_request(request: TurnRequest) -> bytes:
    """A TurnRequest's payload bytes (compact UTF-8 JSON)."""
    return TurnRequestShape.of(request).model_dump_json().encode()


def decode_turn_request(payload: bytes, *, traceparent: str | None = None) -> TurnRequest:
    """Parse a TurnRequest payload; raises ``pydantic.ValidationError`` if it is malformed."""
    return TurnRequestShape.model_validate_json(payload).value(traceparent=traceparent)


def encode_run_config(config: RunConfig) -> bytes:
    """A run config as an ``admitted`` event carries it (compact UTF-8 JSON)."""
    return RunConfigShape.of(config).model_dump_json().encode()
