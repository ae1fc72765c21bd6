"""The peer's process: the OpenAI Agents SDK's in-process ``Runner`` on the bench workload.

Runs in the peer's own virtualenv (``requirements.txt`` here; it imports only the SDK and the
standard library, never agentrun). ``bench_peer.py`` starts it and drives it over stdin and
stdout, one JSON object a line:

1. it warms up (``--warmup`` runs, not counted: imports, first connections, schema
   compilation), then prints ``{"ready": true, "pid": …, "versions": {…}, "errors": […]}``;
2. on a line on stdin it runs ``--runs`` agents concurrently in its one event loop, each
   with the goal ``--goal`` followed by its name: the scripted model answers that goal with
   ``calculate`` calls, one a turn, then a final answer, which ends the run (``--max-turns``
   is only a guard); then it prints ``{"tool_calls", "seconds", "cpu_seconds", "errors"}``
   (``errors``: what went wrong in up to 5 runs, empty when every run answered);
3. it exits when stdin closes, so the harness can read its CPU time from ``/proc`` first
   (and at once if stdin closes before step 2).

Tracing is off. The scripted model must accept call ids of any form (the SDK echoes the
model's ids as given): the harness starts it with ``--no-strict-call-ids``.

    run_sdk.py --base-url http://127.0.0.1:PORT/v1 --goal 'WORKLOAD-20-TURNS '
        [--runs 100] [--max-turns 25]
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import json
import os
import sys
import time
from importlib import metadata
from typing import Any

import agents
import openai

INSTRUCTIONS = "You are a benchmark agent. Use the calculate tool."
_BINARY: dict[type[ast.operator], Any] = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b,
}


def _evaluate(node: ast.AST) -> float | int:
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        return _BINARY[type(node.op)](_evaluate(node.left), _evaluate(node.right))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_evaluate(node.operand)
    raise ValueError(f"unsupported expression element {type(node).__name__}")


calls = 0


@agents.function_tool
def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression (numbers, parentheses, + - * /) and return the result.

    Args:
        expression: the arithmetic expression, e.g. (12 + 3) * 4 / 5
    """
    global calls
    calls += 1
    return str(_evaluate(ast.parse(expression, mode="eval").body))


async def run_one(agent: agents.Agent[Any], goal: str, *, max_turns: int) -> str | None:
    """One run to its final answer; None when it answered, else what went wrong."""
    try:
        result = await agents.Runner.run(agent, goal, max_turns=max_turns)
    except Exception as exc:  # reported, not raised: the harness says the figure is void
        return f"{type(exc).__name__}: {exc}"
    return None if result.final_output == "done" else f"answered {result.final_output!r}"


async def batch(
    agent: agents.Agent[Any], *, goal: str, prefix: str, runs: int, max_turns: int
) -> list[str]:
    """``runs`` runs at once; their problems (empty when each answered)."""
    ended = await asyncio.gather(
        *(run_one(agent, f"{goal}{prefix}-{i}", max_turns=max_turns) for i in range(runs))
    )
    return [problem for problem in ended if problem is not None]


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--goal", required=True, help="the workload scenario's goal prefix")
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--max-turns", type=int, default=100, help="a guard; runs end before")
    parser.add_argument("--warmup", type=int, default=5)
    args = parser.parse_args()
    agents.set_tracing_disabled(True)
    client = openai.AsyncOpenAI(base_url=args.base_url, api_key="bench")
    model = agents.OpenAIChatCompletionsModel(model="scripted", openai_client=client)
    agent = agents.Agent(name="bench", instructions=INSTRUCTIONS, model=model, tools=[calculate])
    loop = asyncio.get_running_loop()
    guard = {"goal": args.goal, "max_turns": args.max_turns}
    problems = await batch(agent, prefix="warm", runs=args.warmup, **guard)
    versions = {name: metadata.version(name) for name in ("openai-agents", "openai")}
    emit({"ready": True, "pid": os.getpid(), "versions": versions, "errors": problems})
    if not await loop.run_in_executor(None, sys.stdin.readline):
        return  # stdin closed before the go: the harness is gone
    global calls
    calls = 0
    cpu, started = time.process_time(), time.perf_counter()
    problems = await batch(agent, prefix="run", runs=args.runs, **guard)
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    emit({"tool_calls": calls, "seconds": seconds, "cpu_seconds": cpu, "errors": problems[:5]})
    await loop.run_in_executor(None, sys.stdin.read)
    await client.close()


def emit(record: dict[str, Any]) -> None:
    """One JSON line on stdout, flushed."""
    print(json.dumps(record), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
