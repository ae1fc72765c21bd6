"""A tenant's window use rebuilt from its AgentRuns (``rebuild.window_usage``): runs that ended
in the window count their recorded usage, runs admitted and not ended what their status shows;
other tenants' runs, runs ended outside the window, runs never admitted and malformed statuses
add nothing. ``RebuiltUsage`` takes the larger of that and the AgentTenant status's last
showing of the same window."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from kube_support import FakeKube

from agentrun.ledger import UsageFloor
from agentrun.operator.platform.conditions import rfc3339
from agentrun.operator.tenants.rebuild import RebuiltUsage, window_usage
from agentrun.operator.tenants.registry import Tenants

HOUR = 3_600.0
START = 19_675 * 86_400.0
END = START + HOUR


def agentrun(
    name: str,
    *,
    tenant: str = "acme",
    started: float | None = START - 60,
    completed: float | None = None,
    tokens: Any = 100,
    cost: Any = "0.01",
    wall: Any = 2.0,
) -> dict[str, Any]:
    status: dict[str, Any] = {
        "tenant": tenant,
        "usage": {"totalTokens": tokens, "costUSD": cost, "wallSeconds": wall},
    }
    if started is not None:
        status["startTime"] = rfc3339(started)
    if completed is not None:
        status["completionTime"] = rfc3339(completed)
    return {"metadata": {"name": name, "namespace": "ns"}, "status": status}


def test_runs_ended_in_the_window_and_runs_still_running_count() -> None:
    runs = [
        agentrun("ended-at-start", completed=START),
        agentrun("ended-inside", completed=START + 600, tokens=50, cost="0.005", wall=1.5),
        agentrun("running", tokens=30, cost="0.003", wall=10.0),
    ]
    assert window_usage(runs, "acme", window=START, end=END) == UsageFloor(
        START, 180, Decimal("0.018"), 13.5, END
    )


def test_a_run_that_straddles_the_window_start_counts_in_full() -> None:
    runs = [agentrun("long", started=START - HOUR, completed=START + 1, tokens=900)]
    assert window_usage(runs, "acme", window=START, end=END).tokens == 900


def test_runs_outside_the_window_of_other_tenants_or_never_admitted_add_nothing() -> None:
    runs = [
        agentrun("ended-before", completed=START - 1),
        agentrun("ended-at-the-end", completed=END),
        agentrun("other-tenant", tenant="globex"),
        agentrun("queued", started=None),
        {"metadata": {"name": "no-status"}},
        {"metadata": {"name": "status-not-a-map"}, "status": "x"},
    ]
    assert window_usage(runs, "acme", window=START, end=END) == UsageFloor(START, end=END)


def test_malformed_usage_adds_nothing() -> None:
    runs = [
        agentrun("bad-tokens", tokens="many"),
        agentrun("bad-cost", cost="NaN"),
        agentrun("negative-cost", cost="-1"),
        agentrun("negative-tokens", tokens=-5),
        agentrun("bad-wall", wall=float("nan")),
        agentrun("bad-time", started=None) | {"status": {"tenant": "acme", "startTime": "soon"}},
        agentrun("no-usage") | {"status": {"tenant": "acme", "startTime": rfc3339(START)}},
        agentrun("good", tokens=1, cost="0", wall=0.0),
    ]
    assert window_usage(runs, "acme", window=START, end=END).tokens == 1


async def test_the_larger_of_the_runs_and_the_status_of_the_same_window_is_taken() -> None:
    api = FakeKube()
    api.put("agentruns", agentrun("r1", completed=START + 5, tokens=100, cost="0.5", wall=9.0))
    tenants = Tenants(api)
    rebuilt = RebuiltUsage(api, tenants)
    assert await rebuilt("acme", START, END) == UsageFloor(START, 100, Decimal("0.5"), 9.0, END)
    tenants.seen["acme"] = UsageFloor(START, 300, Decimal("0.1"), 0.0, END)
    assert await rebuilt("acme", START, END) == UsageFloor(START, 300, Decimal("0.5"), 9.0, END)
    tenants.seen["acme"] = UsageFloor(START - HOUR, 5_000, Decimal(9), 0.0, START)
    assert (await rebuilt("acme", START, END)).tokens == 100  # an older window's: ignored
