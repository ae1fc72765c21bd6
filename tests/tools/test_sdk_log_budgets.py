"""What the MCP SDK logs for a tool server counts against that server's own budget
(``process.LibraryLogBound``, keyed by ``peers.serving``): served for real by the SDK's own
server (``mcp_support``), through the worker's pooled sessions, whose SDK tasks (a session's
stream readers and writers) serve the peer of the call that opened them."""

from __future__ import annotations

import asyncio
import io
import logging
from collections.abc import Iterator
from pathlib import Path

import mcp_support
import pytest

from agentrun import process
from agentrun.protocol import RemoteTool
from agentrun.tools import ToolContext, remote, sessions

CTX = ToolContext(namespace="ns", run_name="run", run_uid="run-uid", call_id="call_0_0")


def chatter(server: str, url: str, pool: sessions.SessionPool) -> remote.McpTool:
    """The ``chatter`` tool of AgentToolServer ``server`` at ``url``, called on ``pool``."""
    admitted = RemoteTool(
        name=remote.function_name(server, "chatter"),
        server=server,
        tool="chatter",
        description="",
        parameters={"type": "object"},
        effect="read",
        url=url,
        transport="StreamableHTTP",
        timeout=20,
        private_network=True,  # the test servers listen on loopback
    )
    return remote.mcp_tool(admitted, pool=pool)


@pytest.fixture
def written() -> Iterator[io.StringIO]:
    """What the root logger writes through the process's bound, at INFO."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    process.bound_library_logs(handler)
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        yield out
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


def test_a_flooding_server_does_not_hide_another_servers_lines(
    tmp_path: Path, written: io.StringIO
) -> None:
    """Before: the SDK's client session (logger ``client``) was not bounded at all (the flood
    wrote 100 lines, each with its traceback); bounded per process, the flood would have
    spent the 60 lines of the minute and the quiet server's two would have been dropped."""
    flood_dir, quiet_dir = tmp_path / "flood", tmp_path / "quiet"
    flood_dir.mkdir()
    quiet_dir.mkdir()
    with (
        mcp_support.running(flood_dir, era="legacy") as flooding,
        mcp_support.running(quiet_dir, era="legacy") as quiet_server,
    ):
        quiet_url = quiet_server.url

        async def main() -> list[str]:
            pool = sessions.SessionPool()
            flood, quiet = chatter("flood", flooding.url, pool), chatter("quiet", quiet_url, pool)
            try:
                said = [await flood.run({"n": 100}, CTX)]
                return [*said, await quiet.run({"n": 2}, CTX)]
            finally:
                await pool.aclose()

        assert asyncio.run(main()) == ["said 100", "said 2"]
    flooded = [line for line in written.getvalue().splitlines() if "[peer ns/flood]" in line]
    # the flood's 100 lines are cut to its budget (twice that if a minute turned meanwhile)
    assert 1 <= len(flooded) <= 2 * process.LIBRARY_LINES_PER_MINUTE, len(flooded)
    heard = [line for line in written.getvalue().splitlines() if "[peer ns/quiet]" in line]
    assert len([line for line in heard if "Failed to validate notification" in line]) == 2
