"""The benchmarks' arithmetic: percentiles, CPU per turn, the ratios `make bench` reports, the
medians and ratio of an A/B comparison, and the printed table. Pure: no processes, no clock, no
I/O (the scripts measure; this computes), so ``tests/bench`` can check it.

Shapes are plain JSON-ready dicts, since every figure ends in a ``bench/results/*.json`` file;
each function's docstring gives the keys it reads and writes. Times are milliseconds
(``*_ms``), CPU per turn milliseconds of CPU time (user + system) per turn, throughput turns
per second.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

MODEL_SERVER = "model-server"
"""The process name of the scripted model in CPU tables: a stand-in for the provider, so it is
summed apart (``sum_without_model_server``)."""

TARGETS: Mapping[str, tuple[str, float]] = {
    "overhead_p50_vs_floor": ("<=", 1.5),
    "overhead_p99_vs_floor": ("<=", 4.0),
    "throughput_vs_peer": (">=", 3.5),
    "cpu_vs_peer": ("<=", 1 / 3.5),
}
"""The performance round's targets for the ratios (issue 24): comparison and bound."""


def percentile(values: Sequence[float], q: float) -> float:
    """The q-quantile (0..1) of ``values`` by linear interpolation; NaN when empty."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    pos = (len(ordered) - 1) * q
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def spread(values: Sequence[float], *, digits: int = 3) -> dict[str, float | int]:
    """``{"p50_ms", "p90_ms", "p99_ms", "samples"}`` of millisecond ``values``."""
    return {
        "p50_ms": round(percentile(values, 0.5), digits),
        "p90_ms": round(percentile(values, 0.9), digits),
        "p99_ms": round(percentile(values, 0.99), digits),
        "samples": len(values),
    }


def floor_figures(hops: Mapping[str, Sequence[float]]) -> dict[str, Any]:
    """The NATS floor from per-hop millisecond samples.

    ``hops`` maps each hop's name to its samples, plus ``chain`` (each iteration's total).
    Returns ``{"hops": {name: spread}, "sum_p50_ms", "sum_p99_ms", "chain_p50_ms",
    "chain_p99_ms", "samples"}``; the floor the ratios use is ``sum_p50_ms``, the sum of the
    hops' medians. Raises KeyError without ``chain``.
    """
    per_hop = {name: spread(values) for name, values in hops.items() if name != "chain"}
    chain = hops["chain"]
    return {
        "hops": per_hop,
        "sum_p50_ms": round(sum(float(h["p50_ms"]) for h in per_hop.values()), 3),
        "sum_p99_ms": round(sum(float(h["p99_ms"]) for h in per_hop.values()), 3),
        "chain_p50_ms": round(percentile(chain, 0.5), 3),
        "chain_p99_ms": round(percentile(chain, 0.99), 3),
        "samples": len(chain),
    }


def cpu_per_turn_ms(
    used: Mapping[str, float],
    idle_rate: Mapping[str, float],
    *,
    seconds: float,
    turns: int,
) -> dict[str, float]:
    """Each process's CPU milliseconds per turn over a measured window.

    ``used`` is each process's CPU seconds over the window (after minus before), ``idle_rate``
    its CPU seconds per second while the stack was idle (polling, lease renewals; missing: 0),
    ``seconds`` the window's length and ``turns`` the turns done in it. The idle cost over the
    window is subtracted (it does not scale with turns); noise can leave a process slightly
    below zero, which is kept rather than hidden. Raises ValueError when ``turns`` < 1.
    """
    if turns < 1:
        raise ValueError(f"turns must be at least 1, got {turns}")
    return {
        name: round((cpu - idle_rate.get(name, 0.0) * seconds) / turns * 1000, 3)
        for name, cpu in used.items()
    }


def workload_problem(*, runs: int, turns: int, model_calls: int, tool_calls: int) -> str | None:
    """Why a side did not run the comparison's workload (``runs`` runs of ``turns`` turns of
    one tool call and a final answer: ``runs`` × (``turns`` + 1) model calls and ``runs`` ×
    ``turns`` tool calls), or None when it did. A side that did other work has no figures
    comparable with the other's."""
    want_calls, want_tools = runs * (turns + 1), runs * turns
    if model_calls == want_calls and tool_calls == want_tools:
        return None
    return (
        f"{model_calls} model calls and {tool_calls} tool calls for {runs} runs of {turns}"
        f" turns and an answer ({want_calls} and {want_tools} expected)"
    )


def cpu_table(per_process: Mapping[str, float]) -> dict[str, Any]:
    """``{"per_process": …, "sum", "sum_without_model_server"}`` (ms per turn) of a CPU split
    whose model server, if any, is named ``MODEL_SERVER``."""
    total = sum(per_process.values())
    return {
        "per_process": dict(per_process),
        "sum": round(total, 3),
        "sum_without_model_server": round(total - per_process.get(MODEL_SERVER, 0.0), 3),
    }


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or denominator is None or not denominator or math.isnan(denominator):
        return None
    return round(numerator / denominator, 3)


def ratios(
    floor: Mapping[str, Any], peer: Mapping[str, Any], agentrun: Mapping[str, Any]
) -> dict[str, float | None]:
    """The ratios of one run (None where a side is missing or zero).

    Reads ``floor["sum_p50_ms"]``; ``peer["turns_per_second"]``, ``peer["cpu_ms_per_turn"]``
    (a `cpu_table`); ``agentrun["overhead"]["p50_ms" | "p99_ms"]``,
    ``agentrun["turns_per_second"]``, ``agentrun["cpu_ms_per_turn"]`` (a `cpu_table` whose
    processes include ``operator`` and ``worker-*``). Returns:

    - ``overhead_p50_vs_floor``, ``overhead_p99_vs_floor``: agentrun's overhead percentile
      over the floor (both over the floor's median sum, as the issue reads them);
    - ``throughput_vs_peer``: agentrun's turns/s over the peer's;
    - ``cpu_vs_peer``: the whole stack's CPU per turn without the model server over the
      peer's process (the efficiency target: ≤ 1/3.5);
    - ``cpu_services_vs_peer``: operator and workers only, over the peer's process;
    - ``cpu_with_model_server_vs_peer``: both sides with their model server.
    """
    floor_ms = floor.get("sum_p50_ms")
    overhead = agentrun.get("overhead") or {}
    ours, theirs = agentrun.get("cpu_ms_per_turn") or {}, peer.get("cpu_ms_per_turn") or {}
    services = sum(
        v
        for k, v in (ours.get("per_process") or {}).items()
        if k == "operator" or k.startswith("worker-")
    )
    peer_process = (theirs.get("per_process") or {}).get("peer")
    return {
        "overhead_p50_vs_floor": _ratio(overhead.get("p50_ms"), floor_ms),
        "overhead_p99_vs_floor": _ratio(overhead.get("p99_ms"), floor_ms),
        "throughput_vs_peer": _ratio(
            agentrun.get("turns_per_second"), peer.get("turns_per_second")
        ),
        "cpu_vs_peer": _ratio(ours.get("sum_without_model_server"), peer_process),
        "cpu_services_vs_peer": _ratio(services if ours else None, peer_process),
        "cpu_with_model_server_vs_peer": _ratio(ours.get("sum"), theirs.get("sum")),
    }


def targets_met(found: Mapping[str, float | None]) -> dict[str, bool | None]:
    """For each of ``TARGETS``, whether the ratio in ``found`` meets it (None: not measured)."""
    out: dict[str, bool | None] = {}
    for name, (how, bound) in TARGETS.items():
        value = found.get(name)
        out[name] = None if value is None else (value <= bound if how == "<=" else value >= bound)
    return out


# --------------------------------------------------------------------------- A/B


def numbers(record: Any, prefix: str = "") -> dict[str, float]:
    """Every number in a JSON record, by dotted path (``a.b.0``); booleans and text left out."""
    out: dict[str, float] = {}
    if isinstance(record, Mapping):
        items: Iterable[tuple[str, Any]] = ((str(k), v) for k, v in record.items())
    elif isinstance(record, list):
        items = ((str(i), v) for i, v in enumerate(record))
    else:
        if isinstance(record, int | float) and not isinstance(record, bool):
            out[prefix] = float(record)
        return out
    for key, value in items:
        out.update(numbers(value, f"{prefix}.{key}" if prefix else key))
    return out


def ab_summary(
    a: Sequence[Mapping[str, Any]], b: Sequence[Mapping[str, Any]]
) -> dict[str, dict[str, Any]]:
    """Medians of each numeric figure over side A's and side B's records, and B/A.

    Returns ``{path: {"a": median, "b": median, "b_over_a": ratio or None, "a_runs": [...],
    "b_runs": [...]}}`` for every dotted path (`numbers`) present in every record of both sides
    (a figure one run lacks is left out rather than compared over fewer runs). Raises
    ValueError when a side has no record.
    """
    if not a or not b:
        raise ValueError(f"each side needs at least one record (A: {len(a)}, B: {len(b)})")
    flat_a, flat_b = [numbers(r) for r in a], [numbers(r) for r in b]
    shared = set(flat_a[0]).intersection(*flat_a[1:], *flat_b)
    out: dict[str, dict[str, Any]] = {}
    for path in sorted(shared):
        runs_a, runs_b = [f[path] for f in flat_a], [f[path] for f in flat_b]
        mid_a, mid_b = statistics.median(runs_a), statistics.median(runs_b)
        out[path] = {
            "a": round(mid_a, 4),
            "b": round(mid_b, 4),
            "b_over_a": _ratio(mid_b, mid_a),
            "a_runs": runs_a,
            "b_runs": runs_b,
        }
    return out


# --------------------------------------------------------------------------- printing


def _fmt(value: Any, unit: str = "") -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.3g}{unit}" if abs(value) < 10 else f"{value:.1f}{unit}"
    return f"{value}{unit}"


def report_lines(record: Mapping[str, Any]) -> list[str]:
    """The human table of a ``compare`` record (`ratios` names the keys it reads)."""
    floor, peer, ours = record["floor"], record["peer"], record["agentrun"]
    found, met = record["ratios"], record["targets_met"]
    overhead = ours.get("overhead") or {}

    def verdict(name: str) -> str:
        bound = TARGETS[name]
        flag = {True: "met", False: "not met", None: "—"}[met.get(name)]
        return f"(target {bound[0]} {bound[1]:.3g}: {flag})"

    lines = [
        "figure                         agentrun        reference                 ratio",
        f"overhead per turn p50 (ms)     {_fmt(overhead.get('p50_ms')):<15} "
        f"floor {_fmt(floor.get('sum_p50_ms')):<19} "
        f"{_fmt(found['overhead_p50_vs_floor'], '×')} {verdict('overhead_p50_vs_floor')}",
        f"overhead per turn p99 (ms)     {_fmt(overhead.get('p99_ms')):<15} "
        f"{'':<25} "
        f"{_fmt(found['overhead_p99_vs_floor'], '×')} {verdict('overhead_p99_vs_floor')}",
        f"throughput, one worker (t/s)   {_fmt(ours.get('turns_per_second')):<15} "
        f"peer {_fmt(peer.get('turns_per_second')):<20} "
        f"{_fmt(found['throughput_vs_peer'], '×')} {verdict('throughput_vs_peer')}",
        f"CPU per turn, stack (ms)       "
        f"{_fmt((ours.get('cpu_ms_per_turn') or {}).get('sum_without_model_server')):<15} "
        f"peer {_fmt((peer.get('cpu_ms_per_turn') or {}).get('per_process', {}).get('peer')):<20} "
        f"{_fmt(found['cpu_vs_peer'], '×')} {verdict('cpu_vs_peer')}",
        "",
        "floor hops (ms, p50 / p99): "
        + ", ".join(
            f"{name} {_fmt(h['p50_ms'])} / {_fmt(h['p99_ms'])}"
            for name, h in (floor.get("hops") or {}).items()
        )
        + f"; sum {_fmt(floor.get('sum_p50_ms'))} / {_fmt(floor.get('sum_p99_ms'))}",
    ]
    for side, data in (("agentrun", ours), ("peer", peer)):
        table = data.get("cpu_ms_per_turn") or {}
        per = table.get("per_process") or {}
        lines.append(
            f"CPU ms/turn, {side}: "
            + ", ".join(f"{k} {_fmt(v)}" for k, v in per.items())
            + f"; sum {_fmt(table.get('sum'))}, without the model server "
            f"{_fmt(table.get('sum_without_model_server'))}"
        )
    lines.append(
        "other ratios: operator + workers vs peer "
        f"{_fmt(found['cpu_services_vs_peer'], '×')}, with each side's model server "
        f"{_fmt(found['cpu_with_model_server_vs_peer'], '×')}"
    )
    return lines


FAIRNESS_PHASES = (("from_created", "created"), ("from_admission", "after admission"))
"""The two waits `bench_fairness.py` measures (the key prefix, the words in the table)."""


def wait_figures(waits: Sequence[float]) -> dict[str, float | int]:
    """``{"p50_s", "p99_s", "max_s", "runs"}`` of waits in seconds (NaN percentiles when
    ``waits`` is empty, ``max_s`` too)."""
    return {
        "p50_s": round(percentile(waits, 0.5), 3),
        "p99_s": round(percentile(waits, 0.99), 3),
        "max_s": round(max(waits), 3) if waits else float("nan"),
        "runs": len(waits),
    }


def fairness_comparison(
    quiet: Mapping[str, Mapping[str, float]],
    flood: Mapping[str, Mapping[str, float]],
    *,
    turn_seconds: float,
) -> dict[str, Any]:
    """Tenant B's waits with a flooding neighbour against the same with none.

    ``quiet`` and ``flood`` map each of ``FAIRNESS_PHASES``' keys (``from_created``,
    ``from_admission``) to a `wait_figures` dict (seconds). Returns, per phase key:
    ``p50_ratio`` and ``p99_ratio`` (flood over quiet; None when quiet is 0),
    ``p99_extra_s`` (flood minus quiet, seconds) and ``target_met`` (the extra p99 wait is at
    most ``turn_seconds``: one turn's time, issue 21's bound)."""
    out: dict[str, Any] = {}
    for key, _ in FAIRNESS_PHASES:
        calm, busy = quiet[key], flood[key]
        extra = round(busy["p99_s"] - calm["p99_s"], 3)
        out[key] = {
            "p50_ratio": _ratio(busy["p50_s"], calm["p50_s"]),
            "p99_ratio": _ratio(busy["p99_s"], calm["p99_s"]),
            "p99_extra_s": extra,
            "target_met": extra <= turn_seconds,
        }
    return out


def fairness_lines(record: Mapping[str, Any]) -> list[str]:
    """The human table of a ``bench_fairness`` record: B's waits (p50 / p99 / max, seconds)
    with no flood and with the flood, their ratios and the extra p99 against one turn."""
    turn = record["turn_seconds"]
    lines = [
        f"tenant B's {record['b_runs']} runs, wait to the first model request (s); tenant A "
        f"flooding {record['flood_runs']} runs; one turn = {_fmt(turn)} s",
        "wait from            no flood p50/p99/max    flood p50/p99/max       "
        "ratio p50/p99    extra p99 (target <= one turn)",
    ]
    for key, words in FAIRNESS_PHASES:
        calm, busy, cmp = record["quiet"][key], record["flood"][key], record["comparison"][key]
        flag = "met" if cmp["target_met"] else "not met"
        lines.append(
            f"{words:<20} "
            f"{_fmt(calm['p50_s'])} / {_fmt(calm['p99_s'])} / {_fmt(calm['max_s']):<12} "
            f"{_fmt(busy['p50_s'])} / {_fmt(busy['p99_s'])} / {_fmt(busy['max_s']):<12} "
            f"{_fmt(cmp['p50_ratio'], '×')} / {_fmt(cmp['p99_ratio'], '×'):<9} "
            f"{_fmt(cmp['p99_extra_s'])} s ({flag})"
        )
    return lines
