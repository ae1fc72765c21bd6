"""AgentTenant policy: which namespaces a tenant binds, and what it allows a run to ask for.

Pure: the caller passes the AgentTenant object and the namespace's labels; the binding rule
itself (``resolve``, ``selector_matches``, ``Ambiguous``) is ``agentrun.tenancy``'s, shared
with the trajectory API and re-exported here. Prices and limits
come only from cluster-scoped objects (the AgentTenant here, the AgentModel in ``agents``):
nothing in an AgentRun can raise its tenant's limits, choose its tenant or lower its price.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from agentrun import tenancy
from agentrun.ledger import TenantLimits
from agentrun.protocol import UrlRule
from agentrun.tenancy import Ambiguous, resolve, selector_matches

from .. import runs
from ..platform.spec import ObjectMeta, SpecError, hint, with_hints
from .spec import AgentTenantSpec, OverMax, WhenExhausted

__all__ = [
    "Ambiguous",
    "InvalidTenant",
    "OverCap",
    "OverMax",
    "TenantPolicy",
    "WhenExhausted",
    "bound_namespaces",
    "resolve",
    "selector_matches",
]

MIN_WINDOW_SECONDS = 1.0


class InvalidTenant(Exception):
    """The AgentTenant cannot be enforced as written; the message names the field."""


@dataclasses.dataclass(frozen=True, slots=True)
class TenantPolicy:
    """One AgentTenant, parsed. Build with ``TenantPolicy.of``."""

    name: str
    generation: int
    namespaces: frozenset[str]
    selector: Mapping[str, Any] | None
    limits: TenantLimits
    when_exhausted: WhenExhausted
    run_max: runs.RunBudgetSpec
    """``spec.runBudget.max``: caps on a run's budget (unset fields: no cap)."""
    run_default: runs.RunBudgetSpec
    """``spec.runBudget.default``: what a run that leaves a field unset gets."""
    over_max: OverMax
    allowed_models: frozenset[str] | None
    allowed_tools: frozenset[str] | None
    url_rules: tuple[UrlRule, ...] = ()
    """``spec.httpGet.allow``: what the ``http_get`` tool may fetch for this tenant's runs."""
    tool_server_rules: tuple[UrlRule, ...] = ()
    """``spec.toolServers.allow``: the URLs its namespaces' AgentToolServers may have (none:
    no tool server is discovered or called)."""
    ttl_after_finished: int | None = None
    """``spec.ttlSecondsAfterFinished``: the default of its runs that set none."""
    max_concurrent_turns: int | None = None
    """``spec.maxConcurrentTurns``: most turns of its runs in the workers' hands or the work
    queue at once (``None``: no cap beyond the fair share)."""

    @classmethod
    def of(cls, obj: Mapping[str, Any]) -> TenantPolicy:
        """Parse an AgentTenant object; raises ``InvalidTenant`` naming the field."""
        try:
            meta = ObjectMeta.of(obj)
            spec = AgentTenantSpec.of(obj.get("spec"))
        except SpecError as err:
            raise InvalidTenant(str(err)) from None
        if spec.window.seconds < MIN_WINDOW_SECONDS:
            raise InvalidTenant(f"spec.window: {spec.window.text!r} is shorter than 1s")
        budget = spec.budget
        run_budget = spec.run_budget
        _check_defaults_under_caps(run_budget.default, run_budget.max)
        return cls(
            name=meta.name,
            generation=meta.generation,
            namespaces=frozenset(spec.namespaces),
            selector=spec.namespace_selector,
            limits=TenantLimits(
                tokens=budget.tokens,
                cost_usd=budget.cost_usd,
                wall_seconds=budget.wall_clock_seconds,
                window_seconds=spec.window.seconds,
                max_concurrent_runs=spec.max_concurrent_runs,
            ),
            when_exhausted=spec.when_exhausted,
            run_max=run_budget.max,
            run_default=run_budget.default,
            over_max=run_budget.over_max,
            allowed_models=_names(spec.allowed_models),
            allowed_tools=_names(spec.allowed_tools),
            url_rules=tuple(
                UrlRule(r.host, r.path_prefix, r.private_network) for r in spec.http_get.allow
            ),
            tool_server_rules=tuple(
                UrlRule(r.host, r.path_prefix, r.private_network) for r in spec.tool_servers.allow
            ),
            ttl_after_finished=spec.ttl_seconds_after_finished,
            max_concurrent_turns=spec.max_concurrent_turns,
        )

    def binds(self, namespace: str, labels: Mapping[str, str]) -> bool:
        """Whether runs in ``namespace`` (with these labels) belong to this tenant
        (``agentrun.tenancy``)."""
        return tenancy.binds(self, namespace, labels)

    def apply(self, spec: runs.AgentRunSpec) -> runs.AgentRunSpec:
        """The run's spec as this tenant admits it: allowed model and tools checked, budget
        defaults filled in and ``runBudget.max`` enforced (clamped or rejected per ``overMax``).

        Returns a new spec whose caps are all set (except token and cost caps nobody sets).
        Raises ``SpecError`` naming the field and the tenant.
        """
        if self.allowed_models is not None and spec.model not in self.allowed_models:
            raise SpecError(
                f"spec.model: AgentModel {spec.model!r}{hint(spec.model, self.allowed_models)} "
                f"is not allowed by AgentTenant {self.name!r} "
                f"(allowedModels: {', '.join(sorted(self.allowed_models)) or 'none'})"
            )
        if self.allowed_tools is not None:
            denied = sorted(t for t in set(spec.tools) if not _tool_allowed(t, self.allowed_tools))
            if denied:
                raise SpecError(
                    f"spec.tools: {with_hints(denied, self.allowed_tools)} not allowed by "
                    f"AgentTenant {self.name!r} "
                    f"(allowedTools: {', '.join(sorted(self.allowed_tools)) or 'none'})"
                )
        asked = spec.budget
        admitted: dict[str, Any] = {}
        for over in self.capped(asked):
            if over.asked and self.over_max is OverMax.REJECT:  # asked: never None
                raise SpecError(
                    f"spec.budget.{over.name}: {over.value} is above the cap {over.cap} of "
                    f"AgentTenant {self.name!r} (spec.runBudget.max.{over.name})"
                )
            admitted[over.field] = over.cap
        wanted = asked.filled_from(self.run_default).filled_from(runs.IMPLICIT_BUDGET)
        budget = wanted.model_copy(update=admitted)
        return spec.model_copy(update={"budget": asked.model_copy(update=dict(budget))})

    def capped(self, budget: runs.RunBudgetSpec) -> tuple[OverCap, ...]:
        """The caps of a run's ``spec.budget`` (``budget``, as written) that this tenant's
        ``runBudget.max`` lowers at admission (``apply``): above it as the run asks, or as
        its default gives (the tenant's ``runBudget.default`` never is, the implicit one may
        be), or unset with no default (no cap: the tenant's applies), in
        ``RunBudgetSpec``'s field order; empty when none is."""
        filled = budget.filled_from(self.run_default).filled_from(runs.IMPLICIT_BUDGET)
        found = []
        for field, info in runs.RunBudgetSpec.model_fields.items():
            value, cap = getattr(filled, field), getattr(self.run_max, field)
            if cap is not None and (value is None or value > cap):
                asked = getattr(budget, field) is not None
                found.append(OverCap(field, info.alias or field, value, cap, asked=asked))
        return tuple(found)


@dataclasses.dataclass(frozen=True, slots=True)
class OverCap:
    """One cap of a run's budget above its tenant's ``spec.runBudget.max`` (``capped``)."""

    field: str
    """``RunBudgetSpec``'s field name."""
    name: str
    """Its CRD name (``maxSteps``)."""
    value: Any
    """What the run would get without the cap (an int, a ``Decimal`` or a ``Duration``;
    ``None``: no cap)."""
    cap: Any
    """``spec.runBudget.max``'s value, what it gets."""
    asked: bool
    """Whether the run's own ``spec.budget`` set it (else its default is above the cap)."""

    def text(self) -> str:
        """``maxSteps 20 (50 asked)``, ``timeout 5m (10m by default)``, ``maxTokens 1000
        (none by default)``."""
        how = "asked" if self.asked else "by default"
        return f"{self.name} {self.cap} ({'none' if self.value is None else self.value} {how})"


def bound_namespaces(obj: Mapping[str, Any]) -> frozenset[str]:
    """The namespaces an AgentTenant lists, read leniently (also from an invalid one, whose
    runs must be rejected rather than fall through to another tenant)."""
    spec = obj.get("spec")
    listed = spec.get("namespaces") if isinstance(spec, Mapping) else None
    if not isinstance(listed, list | tuple):
        return frozenset()
    return frozenset(str(name) for name in listed)


def _names(names: Iterable[str] | None) -> frozenset[str] | None:
    return None if names is None else frozenset(names)


def _check_defaults_under_caps(default: runs.RunBudgetSpec, cap: runs.RunBudgetSpec) -> None:
    """Raises ``InvalidTenant`` for a ``runBudget.default`` field above its ``runBudget.max``."""
    for field, info in runs.RunBudgetSpec.model_fields.items():
        name = info.alias or field
        value, most = getattr(default, field), getattr(cap, field)
        if value is not None and most is not None and value > most:
            raise InvalidTenant(
                f"spec.runBudget.default.{name}: {value} is above spec.runBudget.max.{name} {most}"
            )


def _tool_allowed(name: str, allowed: frozenset[str]) -> bool:
    """Whether ``allowedTools`` grants ``name``: listed as is, or an MCP tool
    (``SERVER/TOOL``) whose server is granted whole (``SERVER/*``)."""
    if name in allowed:
        return True
    server, slash, _ = name.partition("/")
    return bool(slash) and f"{server}/*" in allowed
