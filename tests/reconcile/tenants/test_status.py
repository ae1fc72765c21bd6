"""An AgentTenant's status is a pure projection of its ledger entry and its queue."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from agentrun.ledger import Book
from agentrun.operator.tenants.policy import TenantPolicy
from agentrun.operator.tenants.status import (
    QueueView,
    TenantCondition,
    Transition,
    budget_status,
    invalid_tenant_status,
    tenant_status,
)
from agentrun.operator.tenants.waits import QueueWait, WaitReason

HOUR = 3_600.0
NOW = 100 * HOUR + 60.0  # one minute into a one-hour window


def policy(**budget: Any) -> TenantPolicy:
    return TenantPolicy.of(
        {"metadata": {"name": "acme", "generation": 2}, "spec": {"window": "1h", "budget": budget}}
    )


def book(p: TenantPolicy, *, tokens: int = 0, cost: str = "0") -> Book:
    entry = Book.new(p.name, p.limits, now=NOW)
    entry.used_tokens, entry.used_cost = tokens, Decimal(cost)
    return entry


def conditions(body: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in body["conditions"]}


def test_a_tenant_with_budget_left_is_accepted_and_within_budget() -> None:
    p = policy(tokens=1_000, costUSD="2.50")
    projected = tenant_status(p, book(p, tokens=400), now=NOW, previous={})
    body = projected.body
    assert conditions(body) == {
        "Accepted": ("True", "Valid"),
        "BudgetExhausted": ("False", "WithinBudget"),
        "NamespacesAmbiguous": ("False", "Unambiguous"),
    }
    assert (body["observedGeneration"], body["activeRuns"], body["queuedRuns"]) == (2, 0, 0)
    within = next(c for c in body["conditions"] if c["type"] == "BudgetExhausted")
    assert within["message"] == (  # what is left, and why a large call may still be refused
        "left in this window: tokens 600 of 1000, costUSD 2.50 of 2.50; a model call goes only "
        "when its worst case fits (its prompt's estimate plus its max output tokens)"
    )
    assert (body["windowStart"], body["resetTime"]) == (
        "1970-01-05T04:00:00Z",
        "1970-01-05T05:00:00Z",
    )
    assert body["budget"]["tokens"] == {
        "used": 400,
        "reserved": 0,
        "abandoned": 0,
        "limit": 1_000,
        "remaining": 600,
    }
    assert body["budget"]["costUSD"]["remaining"] == "2.50"


@pytest.mark.parametrize(
    ("budget", "used", "reason"),
    [
        ({"tokens": 100}, {"tokens": 100}, "TokensExhausted"),
        ({"costUSD": "1"}, {"cost": "1.000"}, "CostUSDExhausted"),
    ],
    ids=["tokens", "cost"],
)
def test_a_used_up_resource_names_itself_in_the_reason(
    budget: dict[str, Any], used: dict[str, Any], reason: str
) -> None:
    p = policy(**budget)
    body = tenant_status(p, book(p, **used), now=NOW, previous={}).body
    assert conditions(body)["BudgetExhausted"] == ("True", reason)


def test_wall_clock_counts_active_runs_up_to_now() -> None:
    p = policy(wallClockSeconds=60)
    entry = book(p)
    assert entry.admit("r1", "ns", "one", now=NOW - 60) is None  # at the window's start
    body = tenant_status(p, entry, now=NOW, previous={}).body
    assert conditions(body)["BudgetExhausted"] == ("True", "WallClockSecondsExhausted")
    assert body["budget"]["wallClockSeconds"] == {
        "used": 60.0,
        "reserved": 0,
        "limit": 60.0,
        "remaining": 0.0,
    }
    assert body["activeRuns"] == 1


def test_a_queue_head_too_big_for_what_is_left_counts_as_exhausted() -> None:
    p = policy(tokens=1_000)
    wait = QueueWait(WaitReason.BUDGET_EXHAUSTED, "a first call needs up to 700", "tokens")
    body = tenant_status(
        p, book(p, tokens=400), now=NOW, previous={}, queue=QueueView(3, wait)
    ).body
    exhausted = next(c for c in body["conditions"] if c["type"] == "BudgetExhausted")
    assert (exhausted["status"], exhausted["reason"]) == ("True", "TokensExhausted")
    assert exhausted["message"] == "a first call needs up to 700"
    assert body["queuedRuns"] == 3


def test_a_queue_waiting_for_a_slot_is_not_exhaustion() -> None:
    p = policy(tokens=1_000)
    wait = QueueWait(WaitReason.CONCURRENCY_LIMIT, "2 of 2 runs are active")
    body = tenant_status(p, book(p), now=NOW, previous={}, queue=QueueView(1, wait)).body
    assert conditions(body)["BudgetExhausted"] == ("False", "WithinBudget")


def test_unlimited_resources_show_usage_without_limit_or_remaining() -> None:
    p = policy()
    status = budget_status(book(p, tokens=7, cost="0.5"), NOW)
    assert status["tokens"] == {"used": 7, "reserved": 0, "abandoned": 0}
    assert status["costUSD"] == {"used": "0.5", "reserved": "0", "abandoned": "0"}
    assert status["wallClockSeconds"] == {"used": 0.0, "reserved": 0}


def test_a_condition_keeps_its_transition_time_until_its_status_flips() -> None:
    p = policy(tokens=100)
    first = tenant_status(p, book(p), now=NOW, previous={})
    later = tenant_status(p, book(p), now=NOW + 30, previous=first.transitions)
    assert later.body == first.body
    flipped = tenant_status(p, book(p, tokens=100), now=NOW + 60, previous=later.transitions)
    assert flipped.transitions[TenantCondition.BUDGET_EXHAUSTED] == Transition(True, NOW + 60)
    assert flipped.transitions[TenantCondition.ACCEPTED] == Transition(True, NOW)


def test_an_invalid_tenant_is_not_accepted_and_says_why() -> None:
    projected = invalid_tenant_status(
        4, "spec.window: 'soon' is not a duration", now=NOW, previous={}
    )
    [accepted] = projected.body["conditions"]
    assert (accepted["type"], accepted["status"], accepted["reason"]) == (
        "Accepted",
        "False",
        "InvalidSpec",
    )
    assert accepted["message"].startswith("spec.window: ")
    assert projected.body["observedGeneration"] == 4
    again = invalid_tenant_status(4, "same", now=NOW + 5, previous=projected.transitions)
    assert again.transitions[TenantCondition.ACCEPTED].since == NOW


def queued_reasons(events: Any) -> list[tuple[str, str]]:
    found = []
    while not events._queue.empty():
        occasion, _ = events._queue.get_nowait()
        found.append((occasion.reason, occasion.message))
    return found


@pytest.mark.parametrize(
    ("budget", "used", "resource"),
    [
        ({"tokens": 1000}, {"tokens": 1071}, "tokens"),
        ({"costUSD": "0.25"}, {"cost": "0.267"}, "costUSD"),
    ],
    ids=["tokens", "cost"],
)
async def test_a_window_used_past_its_limit_tells_the_tenant_once(
    budget: dict[str, Any], used: dict[str, Any], resource: str
) -> None:
    """B13: calls in flight used more than was held for them: a Warning on the AgentTenant,
    once per window and resource."""
    from kube_support import FakeKube

    from agentrun.operator.platform.events import EventRecorder, Throttle
    from agentrun.operator.tenants.writer import TenantStatusWriter

    api = FakeKube()
    events = EventRecorder(api, throttle=Throttle(repeat_after=0, rate=1000, burst=1000))
    writer = TenantStatusWriter(api, events=events)
    p = policy(**budget)
    for _ in range(2):
        await writer.write_enforced(p, book(p, **used), queued=0, blocked=None, now=NOW)
    overruns = [m for r, m in queued_reasons(events) if r == "BudgetOverrun"]
    assert len(overruns) == 1 and f"budget {resource} overrun" in overruns[0]
    await writer.write_enforced(p, book(p), queued=0, blocked=None, now=NOW)
    assert not [r for r, _ in queued_reasons(events) if r == "BudgetOverrun"]


def test_namespaces_shared_with_other_tenants_are_named_in_a_condition() -> None:
    p = policy()
    shared = {"team-x": ("other",), "team-y": ("other", "third")}
    body = tenant_status(p, book(p), now=NOW, previous={}, ambiguous=shared).body
    found = next(c for c in body["conditions"] if c["type"] == "NamespacesAmbiguous")
    assert (found["status"], found["reason"]) == ("True", "Ambiguous")
    assert "team-x (also other); team-y (also other, third)" in found["message"]
    assert "a name wins over a selector" in found["message"]


async def test_an_agenttenants_events_are_posted_where_no_other_tenant_reads_them() -> None:
    """An AgentTenant is cluster-scoped: client-go would post its Events in ``default``, which
    the people of every tenant read (``docs/architecture.md``, Kubernetes Events). Their
    messages carry the tenant's name, its window's use and its limits, so they go to the
    operator's own namespace, naming it as their object's (the API server refuses an Event
    whose object has no namespace anywhere but in ``default``, as FakeKube does: before, every
    AgentTenant Event of a chart install was refused, HTTP 422); an AgentModel's, which name no
    tenant, stay in ``default``."""
    from kube_support import FakeKube

    from agentrun.operator.platform.events import (
        EventRecorder,
        EventType,
        Involved,
        Throttle,
    )
    from agentrun.operator.tenants.writer import TenantStatusWriter

    api = FakeKube()
    events = EventRecorder(
        api,
        throttle=Throttle(repeat_after=0, rate=1000, burst=1000),
        private_namespace="agentrun-system",
    )
    writer = TenantStatusWriter(api, events=events)
    p = policy(tokens=1000)
    await writer.write_enforced(p, book(p, tokens=1071), queued=0, blocked=None, now=NOW)
    events.record(
        Involved("AgentModel", "mock"), type=EventType.WARNING, reason="Unpriced", message="m"
    )
    await events.drain()
    placed = {(e["involvedObject"]["kind"], e["metadata"]["namespace"]) for e in api.events}
    assert ("AgentTenant", "agentrun-system") in placed
    assert ("AgentModel", "default") in placed
    assert not [
        e for e in api.events if "1071" in e["message"] and e["metadata"]["namespace"] == "default"
    ]
    assert {n for k, n in placed if k == "AgentTenant"} == {"agentrun-system"}
    assert {
        (e["involvedObject"]["kind"], e["involvedObject"].get("namespace", "")) for e in api.events
    } == {("AgentTenant", "agentrun-system"), ("AgentModel", "")}
