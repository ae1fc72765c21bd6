"""The harness's arithmetic: percentiles, the floor, CPU per turn, the ratios and targets, the
A/B medians, and the printed table."""

from __future__ import annotations

import json
import math

import figures
import pytest


def test_percentiles_interpolate_between_the_samples_around_them() -> None:
    values = [4.0, 1.0, 3.0, 2.0]
    assert figures.percentile(values, 0.5) == 2.5
    assert figures.percentile(values, 0.0) == 1.0
    assert figures.percentile(values, 1.0) == 4.0
    assert figures.percentile([7.0], 0.99) == 7.0
    assert math.isnan(figures.percentile([], 0.5))


def test_the_floor_is_the_sum_of_the_hops_medians_and_the_chain_is_apart() -> None:
    hops = {
        "publish": [0.1, 0.2, 0.3],
        "work_queue": [0.2, 0.3, 0.4],
        "kv_cas": [0.3, 0.4, 0.5],
        "chain": [0.7, 0.9, 1.1],
    }
    floor = figures.floor_figures(hops)
    assert floor["sum_p50_ms"] == pytest.approx(0.9)
    assert floor["sum_p99_ms"] == pytest.approx(0.298 + 0.398 + 0.498)
    assert floor["chain_p50_ms"] == pytest.approx(0.9)
    assert set(floor["hops"]) == {"publish", "work_queue", "kv_cas"}
    assert floor["samples"] == 3


def test_cpu_per_turn_subtracts_each_process_idle_rate_over_the_window() -> None:
    per_turn = figures.cpu_per_turn_ms(
        {"operator": 2.0, "etcd": 0.5, "model-server": 1.0},
        {"operator": 0.01, "etcd": 0.02},  # the model server was idle at zero
        seconds=10.0,
        turns=1000,
    )
    assert per_turn == {"operator": 1.9, "etcd": 0.3, "model-server": 1.0}


def test_a_process_below_its_idle_rate_reads_negative_rather_than_hidden() -> None:
    assert figures.cpu_per_turn_ms({"etcd": 0.1}, {"etcd": 0.02}, seconds=10, turns=100) == {
        "etcd": -1.0
    }


def test_cpu_per_turn_refuses_a_window_without_turns() -> None:
    with pytest.raises(ValueError, match="turns must be at least 1"):
        figures.cpu_per_turn_ms({"operator": 1.0}, {}, seconds=1, turns=0)


def test_the_cpu_table_sums_with_and_without_the_model_server() -> None:
    table = figures.cpu_table({"operator": 1.0, "worker-1": 2.0, figures.MODEL_SERVER: 0.5})
    assert table["sum"] == 3.5
    assert table["sum_without_model_server"] == 3.0
    assert figures.cpu_table({"peer": 6.0})["sum_without_model_server"] == 6.0


FLOOR = {"sum_p50_ms": 0.75}
PEER = {
    "turns_per_second": 150.0,
    "cpu_ms_per_turn": figures.cpu_table({"peer": 6.0, figures.MODEL_SERVER: 0.5}),
}
OURS = {
    "overhead": {"p50_ms": 1.5, "p99_ms": 6.0},
    "turns_per_second": 300.0,
    "cpu_ms_per_turn": figures.cpu_table(
        {
            "operator": 1.0,
            "worker-1": 0.5,
            "worker-2": 0.5,
            "nats-server": 0.2,
            "kube-apiserver": 0.2,
            "etcd": 0.1,
            figures.MODEL_SERVER: 1.5,
        }
    ),
}


def test_the_ratios_set_agentrun_against_the_floor_and_the_peer() -> None:
    assert figures.ratios(FLOOR, PEER, OURS) == {
        "overhead_p50_vs_floor": 2.0,
        "overhead_p99_vs_floor": 8.0,
        "throughput_vs_peer": 2.0,
        "cpu_vs_peer": 0.417,  # 2.5 of the stack without its model server over 6.0
        "cpu_services_vs_peer": 0.333,  # operator and both workers
        "cpu_with_model_server_vs_peer": 0.615,  # 4.0 over 6.5
    }


def test_a_missing_or_zero_side_gives_no_ratio_rather_than_a_wrong_one() -> None:
    found = figures.ratios({"sum_p50_ms": 0.0}, {}, OURS)
    assert found["overhead_p50_vs_floor"] is None
    assert found["throughput_vs_peer"] is None
    assert found["cpu_vs_peer"] is None
    assert found["cpu_services_vs_peer"] is None


@pytest.mark.parametrize(
    ("name", "value", "met"),
    [
        pytest.param("overhead_p50_vs_floor", 1.5, True, id="at-an-upper-bound"),
        pytest.param("overhead_p50_vs_floor", 1.51, False, id="over-an-upper-bound"),
        pytest.param("throughput_vs_peer", 3.5, True, id="at-a-lower-bound"),
        pytest.param("throughput_vs_peer", 3.49, False, id="under-a-lower-bound"),
        pytest.param("cpu_vs_peer", None, None, id="not-measured"),
    ],
)
def test_targets_are_met_at_their_bound_and_unknown_when_not_measured(
    name: str, value: float | None, met: bool | None
) -> None:
    assert figures.targets_met({name: value})[name] is met


def test_numbers_flattens_a_record_by_dotted_path_and_leaves_out_text_and_booleans() -> None:
    record = {"a": 1, "b": {"c": 2.5, "d": "text", "e": True}, "f": [3, {"g": 4}]}
    assert figures.numbers(record) == {"a": 1.0, "b.c": 2.5, "f.0": 3.0, "f.1.g": 4.0}


def test_the_ab_summary_gives_medians_and_this_over_ref_for_figures_every_run_has() -> None:
    ref = [{"cpu": 10.0, "only_some": 1}, {"cpu": 12.0}, {"cpu": 30.0}]
    this = [{"cpu": 9.0}, {"cpu": 11.0}, {"cpu": 5.0}]
    summary = figures.ab_summary(ref, this)
    assert list(summary) == ["cpu"]
    assert summary["cpu"]["a"] == 12.0
    assert summary["cpu"]["b"] == 9.0
    assert summary["cpu"]["b_over_a"] == 0.75
    assert summary["cpu"]["a_runs"] == [10.0, 12.0, 30.0]


def test_the_ab_summary_needs_a_record_on_each_side() -> None:
    with pytest.raises(ValueError, match="each side needs at least one record"):
        figures.ab_summary([{"cpu": 1.0}], [])


def test_a_compare_record_is_json_and_prints_every_ratio_with_its_target() -> None:
    found = figures.ratios(FLOOR, PEER, OURS)
    record = {
        "floor": {**FLOOR, "hops": {"publish": {"p50_ms": 0.2, "p99_ms": 0.4}}},
        "peer": PEER,
        "agentrun": OURS,
        "ratios": found,
        "targets_met": figures.targets_met(found),
    }
    assert json.loads(json.dumps(record)) == record
    text = "\n".join(figures.report_lines(record))
    assert "2× (target <= 1.5: not met)" in text
    assert "8× (target <= 4: not met)" in text
    assert "0.417× (target <= 0.286: not met)" in text
    assert "worker-2 0.5" in text
    assert "publish 0.2 / 0.4" in text


@pytest.mark.parametrize(
    ("model_calls", "tool_calls", "problem"),
    [
        pytest.param(210, 200, None, id="the-workload"),
        pytest.param(200, 200, "200 model calls and 200 tool calls", id="a-call-short"),
        pytest.param(210, 190, "(210 and 200 expected)", id="tools-missing"),
        pytest.param(1010, 1000, "for 10 runs of 20 turns", id="runs-never-answered"),
    ],
)
def test_a_side_that_did_other_work_than_the_workload_is_named(
    model_calls: int, tool_calls: int, problem: str | None
) -> None:
    found = figures.workload_problem(
        runs=10, turns=20, model_calls=model_calls, tool_calls=tool_calls
    )
    assert found is None if problem is None else problem in (found or "")


def _waits(p50: float, p99: float) -> dict[str, float | int]:
    return {"p50_s": p50, "p99_s": p99, "max_s": p99, "runs": 10}


def test_wait_figures_give_the_median_the_p99_and_the_worst_wait() -> None:
    found = figures.wait_figures([0.1, 0.2, 0.3, 1.0])
    assert found == {"p50_s": 0.25, "p99_s": 0.979, "max_s": 1.0, "runs": 4}
    assert math.isnan(figures.wait_figures([])["max_s"])


def test_the_fairness_comparison_gives_ratios_the_extra_p99_and_the_one_turn_target() -> None:
    quiet = {"from_created": _waits(0.1, 0.2), "from_admission": _waits(0.05, 0.0)}
    flood = {"from_created": _waits(0.4, 1.4), "from_admission": _waits(0.1, 0.2)}
    found = figures.fairness_comparison(quiet, flood, turn_seconds=0.2)
    assert found["from_created"] == {
        "p50_ratio": 4.0,
        "p99_ratio": 7.0,
        "p99_extra_s": 1.2,
        "target_met": False,
    }
    # the extra p99 equal to one turn meets the target; a quiet p99 of 0 has no ratio
    assert found["from_admission"] == {
        "p50_ratio": 2.0,
        "p99_ratio": None,
        "p99_extra_s": 0.2,
        "target_met": True,
    }


def test_the_fairness_table_shows_both_phases_ratios_and_verdicts() -> None:
    quiet = {"from_created": _waits(0.1, 0.2), "from_admission": _waits(0.05, 0.1)}
    flood = {"from_created": _waits(0.4, 1.4), "from_admission": _waits(0.1, 0.2)}
    record = {
        "turn_seconds": 0.2,
        "b_runs": 10,
        "flood_runs": 1000,
        "quiet": quiet,
        "flood": flood,
        "comparison": figures.fairness_comparison(quiet, flood, turn_seconds=0.2),
    }
    head, _, created, admitted = figures.fairness_lines(record)
    assert "10 runs" in head and "1000 runs" in head
    assert created.startswith("created") and "4× / 7×" in created and "1.2 s (not met)" in created
    assert admitted.startswith("after admission") and "2×" in admitted
    assert admitted.endswith("0.1 s (met)")
