"""Added latency of an MCP tool call: what a worker's call costs over the server's own time.

A real MCP server (the ``mcp`` SDK's ``MCPServer``, the suite's test server) in a child
process; the worker's ``McpTool`` calls its ``slow`` tool with ``seconds=SERVER_SECONDS``, one
call at a time, so each call's time minus ``SERVER_SECONDS`` is the client's overhead. Measured
in the same run for each mode (``--modes``):

- ``pooled``: the worker's way, through a ``SessionPool``: one session reused for every call
  (after the first, a call is one HTTP request);
- ``per-call``: a session of its own per call (connect, handshake, request, close): the floor
  the pool removes.

Each against a server of each protocol era (``--eras``): ``legacy`` (``initialize``, session
ids) and ``modern`` (2026 ``server/discover``, no session ids). Printed as p50 and p99 over
``--calls`` calls, after a few warm-up calls.

    cd bench && ../.venv/bin/python bench_mcp.py [--calls 200] [--modes pooled,per-call]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

from harness import percentile, write_result

from agentrun.protocol import RemoteTool
from agentrun.tools import ToolContext, remote, sessions

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import mcp_support

SERVER_SECONDS = 0.01
WARMUP = 5
MODES = ("pooled", "per-call")
ERAS = ("legacy", "modern")


async def measure(url: str, calls: int, *, pooled: bool) -> list[float]:
    """Milliseconds of overhead per call."""
    admitted = RemoteTool(
        "b__slow", "b", "slow", "", {}, "read", url, "StreamableHTTP", 30.0, private_network=True
    )
    pool = sessions.SessionPool() if pooled else None
    tool = remote.mcp_tool(admitted, pool=pool)
    ctx = ToolContext(namespace="bench", run_name="bench", run_uid="bench", call_id="c")
    added: list[float] = []
    try:
        for i in range(WARMUP + calls):
            started = time.perf_counter()
            await tool.run({"seconds": SERVER_SECONDS}, ctx)
            if i >= WARMUP:
                added.append((time.perf_counter() - started - SERVER_SECONDS) * 1000)
    finally:
        if pool is not None:
            await pool.aclose()
    return added


def main() -> None:
    """Start a server per era, measure each mode, print and record the figures."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--modes", default=",".join(MODES), help="pooled, per-call")
    parser.add_argument("--eras", default=",".join(ERAS), help="legacy, modern")
    args = parser.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    eras = [e for e in args.eras.split(",") if e]
    if not set(modes) <= set(MODES) or not set(eras) <= set(ERAS):
        parser.error(f"--modes from {MODES}, --eras from {ERAS}")
    figures: dict[str, object] = {"calls": args.calls, "server_seconds": SERVER_SECONDS}
    for era in eras:
        with tempfile.TemporaryDirectory() as tmp, mcp_support.running(Path(tmp), era=era) as srv:
            for mode in modes:
                added = asyncio.run(measure(srv.url, args.calls, pooled=mode == "pooled"))
                p50, p99 = percentile(added, 0.5), percentile(added, 0.99)
                key = f"{era}_{mode.replace('-', '_')}"
                figures[f"{key}_added_ms_p50"] = round(p50, 2)
                figures[f"{key}_added_ms_p99"] = round(p99, 2)
                print(
                    f"MCP call overhead over the server's own time, {era} server, {mode}: "
                    f"p50 {p50:.1f} ms, p99 {p99:.1f} ms ({args.calls} calls)"
                )
    write_result("mcp", figures)


if __name__ == "__main__":
    main()
