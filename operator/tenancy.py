"""AgentTenant policy: which namespaces a tenant binds, and what it allows a run to ask for.

Pure: the caller passes the AgentTenant object and the namespace's labels. Prices and limits
come only from cluster-scoped objects (the AgentTenant here, the AgentModel in ``admission``):
nothing in an AgentRun can raise its tenant's limits, choose its tenant or lower its price.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable, Mapping
from decimal import Decimal, InvalidOperation
from typing import Any

from agentrun.ledger import TenantLimits

from .admission import DEFAULT_TIMEOUT, InvalidSpec, parse_duration


class InvalidTenant(Exception):
    """The AgentTenant cannot be enforced as written; the message names the field."""


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


RUN_BUDGET_FIELDS = ("maxSteps", "maxToolCalls", "maxTokens", "maxCostUSD", "timeout")
IMPLICIT: Mapping[str, Any] = {
    "maxSteps": 20,
    "maxToolCalls": 50,
    "maxTokens": None,
    "maxCostUSD": None,
    "timeout": DEFAULT_TIMEOUT,
}
"""What a run that sets a field gets without a tenant default (``None``: no per-run cap)."""


def _measure(field: str, value: Any) -> Decimal:
    """A run-budget value as a comparable number (durations in seconds)."""
    if field == "timeout":
        return Decimal(str(parse_duration(str(value))))
    try:
        return Decimal(str(value))
    except InvalidOperation as err:
        raise InvalidSpec(f"spec.budget.{field}: {value!r} is not a number") from err


def _seconds(text: Any, field: str) -> float:
    try:
        return parse_duration(str(text))
    except InvalidSpec as err:
        raise InvalidTenant(f"{field}: {text!r} is not a duration like 30s, 1h or 24h") from err


def selector_matches(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """A Kubernetes ``LabelSelector`` (matchLabels AND matchExpressions) against ``labels``.

    An empty selector matches everything (as in the Kubernetes API). Operators: In, NotIn,
    Exists, DoesNotExist; an unknown operator matches nothing.
    """
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expression in selector.get("matchExpressions") or ():
        key = expression.get("key")
        values = set(expression.get("values") or ())
        operator = expression.get("operator")
        present = key in labels
        if operator == "In":
            ok = present and labels[key] in values
        elif operator == "NotIn":
            ok = not present or labels[key] not in values
        elif operator == "Exists":
            ok = present
        elif operator == "DoesNotExist":
            ok = not present
        else:
            ok = False
        if not ok:
            return False
    return True


@dataclasses.dataclass(frozen=True, slots=True)
class TenantPolicy:
    """One AgentTenant, parsed. Build with ``TenantPolicy.of``."""

    name: str
    generation: int
    namespaces: frozenset[str]
    selector: Mapping[str, Any] | None
    limits: TenantLimits
    when_exhausted: WhenExhausted
    run_max: Mapping[str, Any]
    run_default: Mapping[str, Any]
    over_max: OverMax
    allowed_models: frozenset[str] | None
    allowed_tools: frozenset[str] | None

    @classmethod
    def of(cls, obj: Mapping[str, Any]) -> TenantPolicy:
        """Parse an AgentTenant object; raises ``InvalidTenant`` naming the field."""
        meta = obj.get("metadata") or {}
        spec = obj.get("spec") or {}
        budget = spec.get("budget") or {}
        run_budget = spec.get("runBudget") or {}
        cost = budget.get("costUSD")
        try:
            cost_usd = None if cost is None else Decimal(str(cost))
        except InvalidOperation as err:
            raise InvalidTenant(f"spec.budget.costUSD: {cost!r} is not a decimal") from err
        window = _seconds(spec.get("window", "24h"), "spec.window")
        if window < 1:
            raise InvalidTenant(f"spec.window: {spec.get('window')!r} is shorter than 1s")
        wall = budget.get("wallClockSeconds")
        concurrent = spec.get("maxConcurrentRuns")
        models = spec.get("allowedModels")
        tools = spec.get("allowedTools")
        policy = cls(
            name=str(meta.get("name", "")),
            generation=int(meta.get("generation") or 1),
            namespaces=frozenset(spec.get("namespaces") or ()),
            selector=spec.get("namespaceSelector"),
            limits=TenantLimits(
                tokens=None if budget.get("tokens") is None else int(budget["tokens"]),
                cost_usd=cost_usd,
                wall_seconds=None if wall is None else float(wall),
                window_seconds=window,
                max_concurrent_runs=None if concurrent is None else int(concurrent),
            ),
            when_exhausted=WhenExhausted(spec.get("whenExhausted", "Queue")),
            run_max=dict(run_budget.get("max") or {}),
            run_default=dict(run_budget.get("default") or {}),
            over_max=OverMax(run_budget.get("overMax", "Reject")),
            allowed_models=None if models is None else frozenset(models),
            allowed_tools=None if tools is None else frozenset(tools),
        )
        for field, value in policy.run_default.items():
            cap = policy.run_max.get(field)
            try:
                over = cap is not None and _measure(field, value) > _measure(field, cap)
            except InvalidSpec as err:
                raise InvalidTenant(f"spec.runBudget.default.{field}: {err}") from err
            if over:
                raise InvalidTenant(
                    f"spec.runBudget.default.{field}: {value} is above spec.runBudget.max.{field} "
                    f"{cap}"
                )
        return policy

    def binds(self, namespace: str, labels: Mapping[str, str]) -> bool:
        """Whether runs in ``namespace`` (with these labels) belong to this tenant."""
        if namespace in self.namespaces:
            return True
        return self.selector is not None and selector_matches(self.selector, labels)

    def apply(self, spec: Mapping[str, Any]) -> dict[str, Any]:
        """The run's spec as this tenant admits it: allowed model and tools checked, budget
        defaults filled in and ``runBudget.max`` enforced (clamped or rejected per ``overMax``).

        Returns a new spec (the object is never edited: spec is immutable). Raises
        ``InvalidSpec`` naming the field and the tenant.
        """
        model = str(spec.get("model", ""))
        if self.allowed_models is not None and model not in self.allowed_models:
            raise InvalidSpec(
                f"spec.model: AgentModel {model!r} is not allowed by AgentTenant {self.name!r} "
                f"(allowedModels: {', '.join(sorted(self.allowed_models)) or 'none'})"
            )
        tools = [str(t) for t in spec.get("tools") or ()]
        if self.allowed_tools is not None:
            denied = sorted(set(tools) - self.allowed_tools)
            if denied:
                raise InvalidSpec(
                    f"spec.tools: {', '.join(denied)} not allowed by AgentTenant {self.name!r} "
                    f"(allowedTools: {', '.join(sorted(self.allowed_tools)) or 'none'})"
                )
        budget = dict(spec.get("budget") or {})
        for field in RUN_BUDGET_FIELDS:
            value = budget.get(field)
            if value is None:
                value = self.run_default.get(field, IMPLICIT[field])
            cap = self.run_max.get(field)
            if cap is not None and (value is None or _measure(field, value) > _measure(field, cap)):
                if value is not None and field in budget and self.over_max is OverMax.REJECT:
                    raise InvalidSpec(
                        f"spec.budget.{field}: {value} is above the cap {cap} of AgentTenant "
                        f"{self.name!r} (spec.runBudget.max.{field})"
                    )
                value = cap
            if value is not None:
                budget[field] = value
        return {**spec, "budget": budget}


class Ambiguous(Exception):
    """More than one AgentTenant binds the namespace."""


def resolve(
    policies: Iterable[TenantPolicy],
    namespace: str,
    labels: Mapping[str, str],
    *,
    default: str | None = None,
) -> TenantPolicy | None:
    """The tenant a run in ``namespace`` belongs to: the one AgentTenant binding it, else the
    operator's ``default`` tenant (by name), else ``None``.

    Raises ``Ambiguous`` when several AgentTenants bind the namespace (a budget must never be
    chosen by accident).
    """
    pool = list(policies)
    bound = [p for p in pool if p.binds(namespace, labels)]
    if len(bound) > 1:
        names = ", ".join(sorted(p.name for p in bound))
        raise Ambiguous(f"namespace {namespace!r} is bound by several AgentTenants: {names}")
    if bound:
        return bound[0]
    if default:
        return next((p for p in pool if p.name == default), None)
    return None
