"""Added latency of an MCP tool call: what a worker's call costs over the server's own time.

A real MCP server (the ``mcp`` SDK's ``MCPServer``, the suite's test server) in a child
process; the worker's ``McpTool`` calls its ``slow`` tool with ``seconds=SERVER_SECONDS``, one
call at a time, so each call's time minus ``SERVER_SECONDS`` is the client's overhead: a new
session (connect, handshake), the request, the session's close. Printed as p50 and p99 over
``--calls`` calls, after a few warm-up calls.

    cd bench && ../.venv/bin/python bench_mcp.py [--calls 200]
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
from agentrun.tools import ToolContext, remote

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import mcp_support

SERVER_SECONDS = 0.01
WARMUP = 5


async def measure(url: str, calls: int) -> list[float]:
    """Milliseconds of overhead per call."""
    tool = remote.mcp_tool(
        RemoteTool("b__slow", "b", "slow", "", {}, "read", url, "StreamableHTTP", 30.0)
    )
    ctx = ToolContext(namespace="bench", run_name="bench", run_uid="bench", call_id="c")
    added: list[float] = []
    for i in range(WARMUP + calls):
        started = time.perf_counter()
        await tool.run({"seconds": SERVER_SECONDS}, ctx)
        if i >= WARMUP:
            added.append((time.perf_counter() - started - SERVER_SECONDS) * 1000)
    return added


def main() -> None:
    """Start the server, measure, print and record the figures."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, mcp_support.running(Path(tmp)) as server:
        added = asyncio.run(measure(server.url, args.calls))
    figures = {
        "calls": args.calls,
        "added_ms_p50": round(percentile(added, 0.5), 2),
        "added_ms_p99": round(percentile(added, 0.99), 2),
    }
    print(
        f"MCP call overhead over the server's own time: p50 {figures['added_ms_p50']} ms, "
        f"p99 {figures['added_ms_p99']} ms ({args.calls} calls, one session each)"
    )
    write_result("mcp", figures)


if __name__ == "__main__":
    main()
