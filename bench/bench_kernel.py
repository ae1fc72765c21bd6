"""Kernel cost per turn: everything the pure loop kernel computes for one turn, no I/O.

A 50-turn run with 4 ``calculate`` calls a turn, from pre-built chat-completions responses
and pre-built tool results. Per turn, in the order the worker does it (``execute_turn``, then
the consumer's ``advance`` and event summary):

- core (the kernel's decisions): ``admit_model_call``, ``classify``, ``check_calls``,
  ``admit_tool_batch``, ``advance``;
- full: core plus prompt building and accounting: ``fit_context`` (which also estimates the
  prompt's tokens; the ``estimate_tokens`` stage is what is left of it), ``read_usage`` and
  ``RunState.summary`` in its JSON shape.

Figures are per turn over every turn of every repeat (the history, and so some costs, grow
with the turn). Target: median ≤ 0.2 ms per turn (full).

    cd bench && ../.venv/bin/python bench_kernel.py [--repeats 200] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import pstats
import time
from decimal import Decimal
from typing import Any

from harness import median, percentile, write_result

from agentrun import kernel, protocol
from agentrun.tools import calculate

TURNS = 50
CALLS_PER_TURN = 4
TARGET_US = 200.0
PRICING = kernel.Pricing(Decimal("2.50"), Decimal("1.25"), Decimal("10.00"))
LIMITS = kernel.Limits(
    max_steps=TURNS + 1,
    max_tool_calls=TURNS * CALLS_PER_TURN,
    max_tokens=10_000_000,
    max_cost_usd=Decimal("100"),
    no_progress_window=3,
)
SCHEMAS = {"calculate": kernel.ToolSchema("calculate", calculate.SPEC.parameters)}
OPENAI_TOOLS = [calculate.SPEC.as_openai_tool()]
NOW, DEADLINE = 1_000.0, 2_000.0
STAGES = (
    "fit_context",
    "estimate_tokens",
    "admit_model_call",
    "read_usage",
    "classify",
    "check_calls",
    "admit_tool_batch",
    "advance",
    "summary",
)
CORE = ("admit_model_call", "classify", "check_calls", "admit_tool_batch", "advance")


def response(turn: int) -> dict[str, Any]:
    """The chat.completion object of ``turn``: 4 parallel calls, provider usage."""
    calls = [
        {
            "id": f"call_{turn}_{i}",
            "type": "function",
            "function": {
                "name": "calculate",
                "arguments": f'{{"expression": "{turn} * {i + 3} + {17 * i}"}}',
            },
        }
        for i in range(CALLS_PER_TURN)
    ]
    return {
        "id": f"chatcmpl-{turn}",
        "object": "chat.completion",
        "created": 0,
        "model": "scripted",
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": "Computing the next four values.",
                    "refusal": None,
                    "tool_calls": calls,
                },
                "logprobs": None,
                "finish_reason": "tool_calls",
            }
        ],
        "usage": {
            "prompt_tokens": 200 + 90 * turn,
            "completion_tokens": 80,
            "total_tokens": 280 + 90 * turn,
            "prompt_tokens_details": {"cached_tokens": 128},
        },
    }


RESPONSES = [response(turn) for turn in range(TURNS)]
RESULTS = [
    tuple(
        kernel.ToolResult(f"call_{turn}_{i}", "calculate", str(turn * (i + 3) + 17 * i))
        for i in range(CALLS_PER_TURN)
    )
    for turn in range(TURNS)
]


def run_once(samples: dict[str, list[int]] | None) -> kernel.RunState:
    """One whole run; with ``samples``, the nanoseconds of every stage of every turn."""
    clock = time.perf_counter_ns
    state = kernel.initial_state(
        goal="Compute four sequences for fifty steps.", instructions="Use the calculate tool."
    )
    for turn in range(TURNS):
        t0 = clock()
        fitted = kernel.fit_context(state.messages, limits=LIMITS, tools=OPENAI_TOOLS)
        t1 = clock()
        estimate = fitted.tokens  # estimated once, by fit_context
        t2 = clock()
        gate = kernel.admit_model_call(
            state, LIMITS, pricing=PRICING, prompt_estimate=estimate, now=NOW, deadline=DEADLINE
        )
        t3 = clock()
        usage = kernel.read_usage(RESPONSES[turn], pricing=PRICING, prompt_estimate=estimate)
        t4 = clock()
        decision = kernel.classify(RESPONSES[turn])
        t5 = clock()
        assert gate.phase is None and isinstance(decision, kernel.ToolCalls)
        calls = kernel.check_calls(
            decision.calls, turn=state.turn, tools=SCHEMAS, used_ids=state.call_ids
        )
        t6 = clock()
        batch = kernel.admit_tool_batch(state, LIMITS, calls=len(calls), now=NOW, deadline=DEADLINE)
        t7 = clock()
        assert batch.phase is None
        record = kernel.Answered(
            turn=state.turn, decision=decision, calls=calls, results=RESULTS[turn], usage=usage
        )
        state = kernel.advance(state, record, LIMITS)
        t8 = clock()
        protocol.summary_as_dict(state.summary())  # the summary as an event carries it
        t9 = clock()
        if samples is not None:
            marks = (t0, t1, t2, t3, t4, t5, t6, t7, t8, t9)
            for stage, start, end in zip(STAGES, marks, marks[1:], strict=False):
                samples[stage].append(end - start)
    assert state.phase is kernel.Phase.RUNNING and state.tool_calls == TURNS * CALLS_PER_TURN
    return state


def profile(repeats: int) -> None:
    """Print where the time goes: kernel functions by cumulative time, then everything by own
    time (cProfile inflates functions that make many small calls, such as ``dict.get``)."""
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(repeats):
        run_once(None)
    profiler.disable()
    stats = pstats.Stats(profiler)
    stats.sort_stats("cumulative").print_stats(r"agentrun/kernel/", 20)
    stats.sort_stats("tottime").print_stats(12)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--profile", action="store_true", help="also print a cProfile report")
    args = parser.parse_args()

    for _ in range(5):  # warm up: schema validators, caches
        run_once(None)
    samples: dict[str, list[int]] = {stage: [] for stage in STAGES}
    whole_run_ns: list[int] = []
    for _ in range(args.repeats):
        run_once(samples)
        gc.collect()
        start = time.perf_counter_ns()
        run_once(None)
        whole_run_ns.append(time.perf_counter_ns() - start)

    turns = len(samples["advance"])
    full = [sum(samples[s][i] for s in STAGES) / 1000 for i in range(turns)]
    core = [sum(samples[s][i] for s in CORE) / 1000 for i in range(turns)]
    by_turn = [full[i::TURNS] for i in range(TURNS)]
    figures = {
        "turns_per_run": TURNS,
        "calls_per_turn": CALLS_PER_TURN,
        "repeats": args.repeats,
        "median_us_per_turn": round(median(full), 1),
        "p90_us_per_turn": round(percentile(full, 0.9), 1),
        "core_median_us_per_turn": round(median(core), 1),
        "core_p90_us_per_turn": round(percentile(core, 0.9), 1),
        "untimed_run_median_us_per_turn": round(median(whole_run_ns) / 1000 / TURNS, 1),
        "first_turn_median_us": round(median(by_turn[0]), 1),
        "last_turn_median_us": round(median(by_turn[-1]), 1),
        "stage_median_us": {s: round(median(samples[s]) / 1000, 1) for s in STAGES},
        "target": f"median <= {TARGET_US:g} us per turn (full)",
        "target_met": median(full) <= TARGET_US,
    }
    write_result("kernel", figures)
    if args.profile or not figures["target_met"]:
        profile(min(args.repeats, 50))


if __name__ == "__main__":
    main()
