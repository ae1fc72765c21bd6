"""The capacity model's numbers in one JSON (``results/capacity.json``), derived from the
benchmarks' own result files — nothing here is measured, every figure names its source:

- from ``make bench`` (``compare.json``): CPU ms per turn of each process, turns/s per worker
  core and per operator core (1,000 ÷ CPU ms per turn: a process is one event loop, one core
  at most), NATS messages per turn, API requests per run of the bench workload;
- from ``bench_streams.py`` (``streams.json``): what one stream and one KV bucket carry at R1
  and R3 (event publishes/s, work-queue turns/s, compare-and-sets/s, one hot key's);
- from ``bench_objects.py`` (``objects.json``): admissions/s of one operator and its API
  requests per one-turn run, operator RSS and start-up time per 1,000 finished runs present
  (the slope between the smallest and the largest size);
- from ``bench_scaleout.py`` (``scaleout.json``): turns/s with 1, 2 and 4 workers on one
  machine, with its cores.

A source not given (or not found) leaves its part ``null``. docs/capacity.md says how the
figures combine into a sizing.

    cd bench && ../.venv/bin/python capacity.py [--compare FILE] [--streams FILE]
        [--objects FILE] [--scaleout FILE]
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from harness import RESULTS, write_result


def per_turn(compare: Mapping[str, Any]) -> dict[str, Any]:
    """CPU ms per turn of each process, turns/s per worker and per operator core (the workers'
    CPU averaged over their processes), messages per turn and API requests per run, from a
    ``compare.json``. Raises ``KeyError`` when it has no ``operator`` or ``worker-<n>``
    process, or lacks a figure ``make bench`` writes."""
    agentrun = compare["agentrun"]
    cpu = dict(agentrun["cpu_ms_per_turn"]["per_process"])
    workers = {k: v for k, v in cpu.items() if k.startswith("worker-")}
    if not workers:
        raise KeyError("no worker-<n> process in cpu_ms_per_turn")
    worker_ms = sum(workers.values()) / len(workers)
    steps = float(agentrun["steps_per_run"])
    return {
        "cpu_ms_per_turn": cpu,
        "stack_cpu_ms_per_turn": agentrun["cpu_ms_per_turn"]["sum_without_model_server"],
        "turns_per_second_per_worker_core": round(1000 / worker_ms, 1),
        "turns_per_second_per_operator_core": round(1000 / cpu["operator"], 1),
        "nats_messages_per_turn": agentrun["nats_messages_sent_per_turn"],
        "api_requests_per_run": {
            k: round(v * steps, 2) for k, v in agentrun["api_requests_per_turn"].items()
        },
        "turns_per_run": steps,
        "measured_turns_per_second_one_worker": agentrun["turns_per_second"],
    }


def streams_part(streams: Mapping[str, Any]) -> dict[str, Any]:
    """Per stream and bucket at each replication factor, from a ``streams.json``."""
    return {
        replicas: {**streams[replicas]["throughput"], "hops_p50_sum_ms": _hops(streams[replicas])}
        for replicas in ("r1", "r3")
        if replicas in streams
    }


def _hops(part: Mapping[str, Any]) -> float | None:
    hops = part.get("hops") or {}
    return hops.get("sum_p50_ms")


def objects_part(objects: Mapping[str, Any]) -> dict[str, Any]:
    """Admission and runs-present figures from an ``objects.json`` (rows by size): lists by
    size (admissions/s, RSS in MiB, start-up in seconds, apply → first request p50 in
    seconds), the slopes from the smallest to the largest size in MiB and seconds per 1,000
    runs present (``None`` with one size), the API requests of one-turn runs at the largest
    size; with no rows only ``operator_died``."""
    rows = sorted(objects.get("rows") or [], key=lambda r: r["present"])
    if not rows:
        return {"operator_died": objects.get("operator_died")}
    first, last = rows[0], rows[-1]
    span = (last["present"] - first["present"]) / 1000

    def slope(key: str) -> float | None:
        return round((last[key] - first[key]) / span, 2) if span > 0 else None

    return {
        "sizes": [r["present"] for r in rows],
        "admitted_per_second": [r["bulk"]["admitted_per_second"] for r in rows],
        "api_requests_per_one_turn_run": last["bulk"]["api_requests_per_run"],
        "operator_rss_mb": [r["operator_rss_mb"] for r in rows],
        "operator_rss_mb_per_1000_runs_present": slope("operator_rss_mb"),
        "operator_startup_seconds": [r["operator_settled_seconds"] for r in rows],
        "operator_startup_seconds_per_1000_runs_present": slope("operator_settled_seconds"),
        "worker_rss_mb": max(r["worker_rss_mb"] for r in rows),
        "apply_to_first_request_p50_s": [r["apply_to_first_request"]["p50_s"] for r in rows],
        "operator_died": objects.get("operator_died"),
    }


def scaleout_part(scaleout: Mapping[str, Any]) -> dict[str, Any]:
    """Turns/s by worker count from a ``scaleout.json``, with the machine's cores."""
    return {
        "cores": scaleout.get("cores"),
        "turns_per_second_by_workers": {
            str(r["workers"]): r["turns_per_second"] for r in scaleout["summary"]
        },
    }


PARTS = (
    ("per_turn", "compare", per_turn),
    ("streams", "streams", streams_part),
    ("objects", "objects", objects_part),
    ("scaleout", "scaleout", scaleout_part),
)
"""Each part of the output: its name, the source it is derived from, how."""


def capacity(sources: Mapping[str, Mapping[str, Any] | None]) -> dict[str, Any]:
    """The capacity figures from the result documents in ``sources`` (``compare``,
    ``streams``, ``objects``, ``scaleout``; any may be ``None``), each part with the tree and
    time of the run it came from."""
    out: dict[str, Any] = {}
    for part, source_name, derive in PARTS:
        source = sources.get(source_name)
        out[part] = None if source is None else derive(source)
    out["from"] = {
        name: {"tree": doc.get("tree") or doc.get("revision"), "time": doc.get("time")}
        for name, doc in sources.items()
        if doc is not None
    }
    return out


def _read(path: str | None, default: str) -> dict[str, Any] | None:
    chosen = Path(path) if path else RESULTS / default
    if not chosen.exists():
        return None
    loaded: dict[str, Any] = json.loads(chosen.read_text())
    return loaded


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    names = [source for _, source, _ in PARTS]
    for name in names:
        parser.add_argument(f"--{name}", help=f"default: results/{name}.json")
    args = parser.parse_args()
    sources = {name: _read(getattr(args, name), f"{name}.json") for name in names}
    write_result("capacity", capacity(sources))


if __name__ == "__main__":
    main()
