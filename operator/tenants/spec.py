"""``AgentTenant.spec`` as pydantic models: a tenant's namespaces, window budget and run policy.

What belongs here: the shapes of an AgentTenant's spec and their defaults (the budget window,
what happens when the window's budget is used up, what happens to a run asking for more than
the tenant's caps). What does not: the parsing machinery and the value types shared with the
other specs (``platform.spec``), the policy they become (``policy``).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any

from pydantic import Field

from .. import runs
from ..platform.spec import USD, Duration, DurationField, SpecModel, parse

DEFAULT_WINDOW = "24h"
"""An AgentTenant's budget window when it sets none."""


class WhenExhausted(enum.StrEnum):
    """``spec.whenExhausted``: a new run of a tenant whose window budget is used up..."""

    QUEUE = "Queue"
    """...waits in the queue for the next window (or a raised budget)."""
    FAIL = "Fail"
    """...ends at once with ``tenant_budget_exhausted``."""


class OverMax(enum.StrEnum):
    """``spec.runBudget.overMax``: a run asking for more than ``runBudget.max`` is..."""

    CLAMP = "Clamp"
    """...admitted with the cap instead."""
    REJECT = "Reject"
    """...rejected ``invalid_spec``."""


class TenantBudgetSpec(SpecModel):
    """``AgentTenant.spec.budget``: per window; ``None``: unlimited."""

    tokens: int | None = None
    cost_usd: USD | None = Field(default=None, alias="costUSD")
    wall_clock_seconds: float | None = Field(default=None, alias="wallClockSeconds")


class RunBudgetPolicySpec(SpecModel):
    """``AgentTenant.spec.runBudget``."""

    max: runs.RunBudgetSpec = Field(default_factory=runs.RunBudgetSpec)
    default: runs.RunBudgetSpec = Field(default_factory=runs.RunBudgetSpec)
    over_max: OverMax = Field(default=OverMax.REJECT, alias="overMax")


class UrlRuleSpec(SpecModel):
    """``AgentTenant.spec.httpGet.allow[]``."""

    host: str
    path_prefix: str = Field(default="/", alias="pathPrefix")
    private_network: bool = Field(default=False, alias="privateNetwork")


class HttpGetSpec(SpecModel):
    """``AgentTenant.spec.httpGet``."""

    allow: tuple[UrlRuleSpec, ...] = ()


class ToolServersSpec(SpecModel):
    """``AgentTenant.spec.toolServers``: the URLs AgentToolServers of its namespaces may have."""

    allow: tuple[UrlRuleSpec, ...] = ()


class AgentTenantSpec(SpecModel):
    """``AgentTenant.spec``. Parse with ``AgentTenantSpec.of``."""

    namespaces: tuple[str, ...] = ()
    namespace_selector: dict[str, Any] | None = Field(default=None, alias="namespaceSelector")
    window: DurationField = Field(default_factory=lambda: Duration.parse(DEFAULT_WINDOW))
    budget: TenantBudgetSpec = Field(default_factory=TenantBudgetSpec)
    when_exhausted: WhenExhausted = Field(default=WhenExhausted.QUEUE, alias="whenExhausted")
    max_concurrent_runs: int | None = Field(default=None, alias="maxConcurrentRuns")
    max_concurrent_turns: int | None = Field(default=None, alias="maxConcurrentTurns", ge=1)
    run_budget: RunBudgetPolicySpec = Field(default_factory=RunBudgetPolicySpec, alias="runBudget")
    allowed_models: tuple[str, ...] | None = Field(default=None, alias="allowedModels")
    allowed_tools: tuple[str, ...] | None = Field(default=None, alias="allowedTools")
    http_get: HttpGetSpec = Field(default_factory=HttpGetSpec, alias="httpGet")
    tool_servers: ToolServersSpec = Field(default_factory=ToolServersSpec, alias="toolServers")
    ttl_seconds_after_finished: int | None = Field(
        default=None, alias="ttlSecondsAfterFinished", ge=0
    )

    @classmethod
    def of(cls, spec: Mapping[str, Any] | None) -> AgentTenantSpec:
        """Parse an AgentTenant's spec; raises ``SpecError`` naming the field."""
        return parse(cls, spec, where="spec")
