"""A tenant's window use rebuilt from its AgentRuns (``rebuild.window_usage``): runs that ended
in the window count their recorded usage, runs admitted and not ended what their status shows
(and take their slot again, charged that, their wall clock live from the window's start or
theirs); other tenants' runs, runs ended outside the window, runs never admitted and malformed
statuses add nothing. ``RebuiltUsage`` takes the larger of that and the AgentTenant status's
last showing of the same window."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from kube_support import FakeKube

from agentrun import kernel
from agentrun.ledger import Active, Seed, UsageFloor
from agentrun.operator.platform.conditions import rfc3339
from agentrun.operator.runs.status import usage_status, usd_text
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
    return {"metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}"}, "status": status}


def test_runs_ended_in_the_window_and_runs_still_running_count() -> None:
    runs = [
        agentrun("ended-at-start", completed=START),
        agentrun("ended-inside", completed=START + 600, tokens=50, cost="0.005", wall=1.5),
        agentrun("running", tokens=30, cost="0.003", wall=10.0),
        agentrun("started-inside", started=START + 60, tokens=7, cost="0", wall=1.0),
    ]
    runs[-1]["status"]["reruns"] = 2  # its third life: its slot names it
    assert window_usage(runs, "acme", window=START, end=END) == Seed(
        UsageFloor(START, 187, Decimal("0.018"), 3.5, END),  # wall: the ended runs'
        {
            "uid-running": Active("ns", "running", START, -1, 30, Decimal("0.003"), life=0),
            "uid-started-inside": Active(
                "ns", "started-inside", START + 60, -1, 7, Decimal(0), life=2
            ),
        },
    )
    runs[-1]["status"]["reruns"] = "two"  # malformed: any life's, as before lives were kept
    assert (
        window_usage(runs, "acme", window=START, end=END).active["uid-started-inside"].life is None
    )


def test_a_run_that_straddles_the_window_start_counts_in_full() -> None:
    runs = [agentrun("long", started=START - HOUR, completed=START + 1, tokens=900)]
    assert window_usage(runs, "acme", window=START, end=END).used.tokens == 900


def test_runs_outside_the_window_of_other_tenants_or_never_admitted_add_nothing() -> None:
    runs = [
        agentrun("ended-before", completed=START - 1),
        agentrun("ended-at-the-end", completed=END),
        agentrun("other-tenant", tenant="globex"),
        agentrun("queued", started=None),
        {"metadata": {"name": "no-status"}},
        {"metadata": {"name": "status-not-a-map"}, "status": "x"},
        agentrun("bad-end", completed=START)
        | {"status": {"tenant": "acme", "completionTime": "x"}},
    ]
    assert window_usage(runs, "acme", window=START, end=END) == Seed(UsageFloor(START, end=END))


def test_malformed_usage_adds_nothing() -> None:
    runs = [
        agentrun("bad-tokens", tokens="many"),
        agentrun("bad-cost", cost="NaN"),
        agentrun("negative-cost", cost="-1"),
        agentrun("negative-tokens", tokens=-5),
        agentrun("bad-wall", wall=float("nan")),
        agentrun("bad-time", started=None) | {"status": {"tenant": "acme", "startTime": "soon"}},
        agentrun("no-usage") | {"status": {"tenant": "acme", "startTime": rfc3339(START)}},
        agentrun("negative-wall", wall=-1.0),
        agentrun("good", tokens=1, cost="0", wall=0.0),
    ]
    assert window_usage(runs, "acme", window=START, end=END).used.tokens == 1


def test_a_running_run_without_a_uid_counts_but_takes_no_slot() -> None:
    run = agentrun("odd", tokens=11)
    del run["metadata"]["uid"]
    assert window_usage([run], "acme", window=START, end=END) == Seed(
        UsageFloor(START, 11, Decimal("0.01"), 0.0, END)
    )


async def test_the_larger_of_the_runs_and_the_status_of_the_same_window_is_taken() -> None:
    api = FakeKube()
    api.put("agentruns", agentrun("r1", completed=START + 5, tokens=100, cost="0.5", wall=9.0))
    api.put("agentruns", agentrun("r2", tokens=1, cost="0", wall=0.0))
    tenants = Tenants(api)
    rebuilt = RebuiltUsage(api, tenants)
    seed = await rebuilt("acme", START, END)
    assert seed.used == UsageFloor(START, 101, Decimal("0.5"), 9.0, END)
    assert list(seed.active) == ["uid-r2"]
    tenants.seen["acme"] = UsageFloor(START, 300, Decimal("0.1"), 0.0, END)
    seed = await rebuilt("acme", START, END)
    assert seed.used == UsageFloor(START, 300, Decimal("0.5"), 9.0, END)
    assert list(seed.active) == ["uid-r2"]
    tenants.seen["acme"] = UsageFloor(START - HOUR, 5_000, Decimal(9), 0.0, START)
    assert (await rebuilt("acme", START, END)).used.tokens == 101  # an older window's: ignored
    tenants.seen["acme"] = UsageFloor(END, 5_000, Decimal(9), 0.0, END + HOUR)
    later = await rebuilt("acme", START, END)  # a later window's (a pending length edit): ignored
    assert later.used == UsageFloor(START, 101, Decimal("0.5"), 9.0, END)


def test_a_ledger_rebuilt_from_run_statuses_keeps_every_digit_of_their_costs() -> None:
    """A run's ``.status.usage.costUSD`` is its exact cost, never rounded: 40 runs of
    0.0000005 USD each rebuild to 0.00002, where six places would have read 0.000000 or
    0.000001 each (0 or 0.00004 in all)."""
    cost = Decimal("0.0000005")
    usage = kernel.Usage(10, 2, 0, cost)
    statuses = [
        usage_status(kernel.RunSummary(kernel.Phase.COMPLETED, usage=usage), wall_seconds=1)
    ]
    assert statuses[0]["costUSD"] == "0.0000005"
    runs = [
        agentrun(f"r{i}", completed=START + i, tokens=12, cost=statuses[0]["costUSD"])
        for i in range(40)
    ]
    seed = window_usage(runs, "acme", window=START, end=END)
    assert seed.used.cost_usd == cost * 40


def test_a_status_cost_shows_six_places_at_least() -> None:
    assert [usd_text(Decimal(v)) for v in ("0", "0.001715", "0.00171500", "2")] == [
        "0.000000",
        "0.001715",
        "0.001715",
        "2.000000",
    ]
