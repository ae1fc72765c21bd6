"""`bench_big_tenant_api.py`'s arithmetic and its checks that need no stack: admissions per
second from whole-second stamps, API requests per run, and the exact sum of the runs' usage
that the tenant's ledger must equal (a run whose status shows another cost stops it)."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import bench_big_tenant_api as big
import pytest


def a_run(name: str, *, input_tokens: int, output_tokens: int, cost: str) -> dict[str, Any]:
    usage = {"inputTokens": input_tokens, "outputTokens": output_tokens, "costUSD": cost}
    return {"metadata": {"name": name}, "status": {"usage": usage}}


def test_admissions_per_second_count_the_last_stamps_second_too() -> None:
    stamps = ["2026-12-02T11:00:00Z", "2026-12-02T11:00:09Z", "2026-12-02T11:00:04Z"]
    assert big.rate(100, stamps) == 10.0
    assert big.rate(30, ["2026-12-02T11:00:00Z"]) == 30.0  # a burst within one second
    assert big.rate(5, []) is None


def test_requests_per_run_keep_only_the_counts_that_moved() -> None:
    before = {"POST agentruns": 10, "WATCH agents": 1, "PATCH agentruns/status": 4}
    after = {"POST agentruns": 110, "WATCH agents": 1, "PATCH agentruns/status": 304}
    assert big.per_run(before, after, 100) == {
        "PATCH agentruns/status": 3.0,
        "POST agentruns": 1.0,
    }


def test_the_runs_usage_is_summed_exactly_at_the_models_prices() -> None:
    runs = [
        a_run("a", input_tokens=40, output_tokens=6, cost="0.000160"),
        a_run("b", input_tokens=41, output_tokens=6, cost="0.000162"),
    ]
    tokens, cost = big.run_sums(runs)
    assert tokens == 93
    assert cost == Decimal("0.0001600") + Decimal("0.0001625")  # exact, not the shown rounding


def test_a_run_whose_status_shows_another_cost_stops_the_check() -> None:
    with pytest.raises(AssertionError, match="b:"):
        big.run_sums([a_run("b", input_tokens=40, output_tokens=6, cost="0.000170")])


def test_polls_are_rarer_for_bigger_tenants() -> None:
    assert big.poll_seconds(500) == 3.0
    assert big.poll_seconds(10_000) == 10.0
