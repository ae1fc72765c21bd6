"""What the exactly-once machinery costs a write call, against the same tool called as ``read``.

Two figures, each with its floor measured in the same run:

1. ``call``: one MCP call through the worker's tool runner (``toolrunner.run_batch``) against a
   real MCP server (the suite's test server, its ``add`` tool) and a real nats-server, once with
   the tool declared ``write`` (the effect ledger's ``prepared`` create and ``done`` put around
   the call) and once declared ``read`` (the floor), interleaved one call at a time. The added
   latency per write call is the difference of the medians (and of the p99s); the two KV writes
   are also timed alone.
2. ``turn`` (``--stack``, a real stack: kube-apiserver, etcd, nats-server, the scripted model,
   the operator and one worker): runs whose every turn makes one call of that tool, declared
   ``write`` or ``read``, interleaved. A write turn first commits the model's decision and runs
   its call in the next turn (the extra commit, and the operator's dispatch of that turn); the
   figure is, per model turn, the time from one model request to the next minus the worker's
   own tool-batch time (the MCP call, and for writes the ledger writes, measured in 1.), so
   what remains is commits, dispatch and bookkeeping: median of runs per kind, and the added
   time per write turn.

    cd bench && ../.venv/bin/python bench_effects.py [--calls 300] [--stack --turns 30]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import nats
from harness import agent_run, bench_stack, percentile, write_result

from agentrun import kernel
from agentrun.protocol import RemoteTool
from agentrun.tools import ToolContext, remote
from agentrun.worker import toolrunner
from agentrun.worker.effects import EffectLedger
from agentrun_dev import components, natsserver

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import mcp_support

HERE = Path(__file__).parent
WARMUP = 10
SETTINGS = toolrunner.ToolRunSettings(retries=0)
EFFECTS = ("read", "write")
ROUNDS = 3
"""Runs per effect in the stack figure, interleaved (the machine is shared: medians of runs)."""


def _tool(url: str, effect: str) -> remote.McpTool:
    return remote.mcp_tool(
        RemoteTool(
            f"{effect}__add",
            effect,
            "add",
            "",
            {},
            effect,
            url,
            "StreamableHTTP",
            30.0,
            private_network=True,
        )
    )


def summary(values: Sequence[float]) -> dict[str, float]:
    """p50 and p99 of ``values`` (milliseconds), rounded."""
    return {
        "p50_ms": round(percentile(values, 0.5), 3),
        "p99_ms": round(percentile(values, 0.99), 3),
    }


async def measure_calls(url: str, nats_server: natsserver.NatsServer, calls: int) -> dict[str, Any]:
    """Milliseconds per call by effect, and of the ledger's two writes alone."""
    client = await nats.connect(**nats_server.client_options())
    try:
        ledger = await EffectLedger.open(client.jetstream())
        tools = {f"{e}__add": _tool(url, e) for e in EFFECTS}
        ids = itertools.count()
        timed: dict[str, list[float]] = {e: [] for e in EFFECTS}
        for i in range(WARMUP + calls):
            for effect in EFFECTS:
                call = kernel.CheckedCall(f"call_{next(ids)}", f"{effect}__add", {"a": i, "b": 1})
                ctx = ToolContext(namespace="bench", run_name="b", run_uid="bench-run", call_id="")
                started = time.perf_counter()
                (result,) = await toolrunner.run_batch(
                    [call],
                    tools=tools,
                    context=ctx,
                    settings=SETTINGS,
                    deadline=time.time() + 60,
                    effects=ledger,
                )
                if i >= WARMUP:
                    timed[effect].append((time.perf_counter() - started) * 1000)
                assert not result.is_error, result
        kv_ms: list[float] = []
        for i in range(calls):
            call = kernel.CheckedCall(f"kv_{i}", "write__add", {"a": i, "b": 1})
            started = time.perf_counter()
            assert await ledger.claim("bench-kv", call) is None
            await ledger.done("bench-kv", call, kernel.ToolResult(call.id, call.name, "1"))
            kv_ms.append((time.perf_counter() - started) * 1000)
    finally:
        await client.close()
    read, write = statistics.median(timed["read"]), statistics.median(timed["write"])
    return {
        "calls": calls,
        "read": summary(timed["read"]),
        "write": summary(timed["write"]),
        "ledger_writes": summary(kv_ms),
        "added_ms_p50": round(write - read, 3),
        "added_ms_p99": round(
            percentile(timed["write"], 0.99) - percentile(timed["read"], 0.99), 3
        ),
        "ratio_p50": round(write / read, 3),
    }


def measure_turns(mcp_url: str, turns: int) -> dict[str, Any]:
    """Per model turn, milliseconds of everything but the tool batch (the worker's own
    ``agentrun_turn_duration_seconds{phase="tools"}`` subtracted), per effect, through a real
    stack: for a write, the decision's extra commit and the dispatch of its resume turn."""
    with bench_stack(HERE / "scenarios.yaml") as bench:
        bench.start_services(workers=1, extra_env={"AGENTRUN_STATUS_INTERVAL": "1"})
        bench.apply(
            [
                {
                    "apiVersion": "agentrun.dev/v1alpha1",
                    "kind": "AgentToolServer",
                    "metadata": {"name": effect},
                    "spec": {"url": mcp_url, "tools": [{"name": "add", "effect": effect}]},
                }
                for effect in EFFECTS
            ]
        )
        time.sleep(2.0)  # discovery
        per_turn: dict[str, list[float]] = {e: [] for e in EFFECTS}
        port = bench.workers[0].ports["metrics"]
        for n, effect in enumerate(EFFECTS * ROUNDS):  # interleaved: read, write, read, ...
            goal = f"EFFECTS-{effect.upper()} {n}"
            name = f"effects-{effect}-{n}"
            tools_before = _tools_seconds(port)
            bench.apply([agent_run(name, goal, max_steps=turns, tools=[f"{effect}/add"])])
            bench.wait_all_terminal(n + 1, timeout=600)
            tools_ms = (_tools_seconds(port) - tools_before) * 1000
            arrivals = sorted(
                r["time"] for r in _mock_requests(bench) if goal in str(r["body"]["messages"][0])
            )
            gaps = len(arrivals) - 1  # each gap holds one model answer and one tool batch
            per_turn[effect].append(((arrivals[-1] - arrivals[0]) * 1000 - tools_ms) / gaps)
    read, write = statistics.median(per_turn["read"]), statistics.median(per_turn["write"])
    return {
        "runs_per_effect": ROUNDS,
        "turns_per_run": turns,
        "read_ms_per_turn": [round(v, 2) for v in per_turn["read"]],
        "write_ms_per_turn": [round(v, 2) for v in per_turn["write"]],
        "read_p50_ms": round(read, 2),
        "write_p50_ms": round(write, 2),
        "added_ms_p50": round(write - read, 2),
        "ratio_p50": round(write / read, 3),
    }


def _tools_seconds(port: int) -> float:
    """The worker's ``agentrun_turn_duration_seconds_sum{phase="tools"}``."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as response:
        text = response.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if (
                sample.name == "agentrun_turn_duration_seconds_sum"
                and sample.labels.get("phase") == "tools"
            ):
                return float(sample.value)
    return 0.0


def _mock_requests(bench: Any) -> list[dict[str, Any]]:
    import json
    import urllib.request

    from agentrun_dev import stack

    base = stack.mockllm_url(bench.mock).removesuffix("/v1")
    with urllib.request.urlopen(f"{base}/_mock/requests", timeout=30) as response:
        data: Any = json.loads(response.read())
    return list(data["requests"] if isinstance(data, dict) else data)


def main() -> None:
    """Start the MCP server (and nats-server, or a whole stack), measure, print, record."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--stack", action="store_true", help="also measure whole turns")
    parser.add_argument("--turns", type=int, default=30)
    args = parser.parse_args()
    figures: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp, mcp_support.running(Path(tmp)) as server:
        launch = components.Launch(log_dir=Path(tmp) / "logs", die_with_parent=True)
        nats_server = natsserver.start_nats_server(Path(tmp) / "nats", launch=launch)
        try:
            figures["call"] = asyncio.run(measure_calls(server.url, nats_server, args.calls))
        finally:
            nats_server.stop()
        call = figures["call"]
        print(
            f"MCP call, read (floor): p50 {call['read']['p50_ms']} ms, p99 {call['read']['p99_ms']}"
            f" ms; write: p50 {call['write']['p50_ms']} ms, p99 {call['write']['p99_ms']} ms; "
            f"added p50 {call['added_ms_p50']} ms (x{call['ratio_p50']}), p99 "
            f"{call['added_ms_p99']} ms; ledger prepared+done alone p50 "
            f"{call['ledger_writes']['p50_ms']} ms, p99 {call['ledger_writes']['p99_ms']} ms"
        )
        if args.stack:
            figures["turn"] = measure_turns(server.url, args.turns)
            turn = figures["turn"]
            print(
                f"per model turn, all but the tool batch: read (floor) p50 "
                f"{turn['read_p50_ms']} ms; write (decision committed first, call in the next "
                f"turn) p50 {turn['write_p50_ms']} ms; added p50 {turn['added_ms_p50']} ms "
                f"(x{turn['ratio_p50']}); runs: read {turn['read_ms_per_turn']}, write "
                f"{turn['write_ms_per_turn']}"
            )
    write_result("effects", figures)


if __name__ == "__main__":
    main()
