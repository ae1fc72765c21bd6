"""``agentrun_tenant_budget_*`` are the ledger as this operator process sees it: once its parts
stop (with shards, before it serves another share), the series go, so a tenant whose shard
moved to another process is not shown here with the values it had when it left."""

from __future__ import annotations

from prometheus_client import REGISTRY

from agentrun import metrics
from agentrun.ledger import Book, TenantLimits

NAMES = ("agentrun_tenant_budget_used", "agentrun_tenant_budget_reserved")


def series(tenant: str) -> list[tuple[str, float]]:
    found = []
    for family in REGISTRY.collect():
        for sample in family.samples:
            if sample.labels.get("tenant") == tenant and sample.name.startswith(
                "agentrun_tenant_budget_"
            ):
                found.append((sample.name, sample.value))
    return found


def test_the_budget_series_go_with_the_parts_and_come_back_with_the_owner() -> None:
    book = Book.new("moved-away", TenantLimits(tokens=5_000), now=0.0)
    metrics.record_tenant_budget("moved-away", book, now=1.0)
    shown = dict(series("moved-away"))
    assert shown["agentrun_tenant_budget_limit"] == 5_000
    assert {name for name in shown} >= set(NAMES)
    metrics.forget_tenant_budgets()
    assert series("moved-away") == []
    metrics.record_tenant_budget("moved-away", book, now=1.0)  # its owner's process
    assert dict(series("moved-away"))["agentrun_tenant_budget_limit"] == 5_000
