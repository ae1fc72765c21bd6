"""The MCP SDK is loaded on first use: a worker or operator that never reaches an MCP server
does not import it (with the server stack it brings, about 27 MB of each process)."""

from __future__ import annotations

import subprocess
import sys

import mcp

from agentrun.tools import endpoint

HEAVY = ("mcp", "uvicorn", "starlette")


def test_the_runtime_processes_start_without_the_mcp_sdk() -> None:
    code = (
        "import sys, agentrun.worker.main, agentrun.operator.main, agentrun.tools.remote;"
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]", done.stdout


async def test_load_sdk_imports_what_a_session_uses() -> None:
    await endpoint.load_sdk()  # loaded already in this process: returns at once
    assert all(name in sys.modules for name in endpoint.SDK_MODULES)
    code = (
        "import asyncio, sys; from agentrun.tools import endpoint;"
        "asyncio.run(endpoint.load_sdk());"
        "print(all(n in sys.modules for n in endpoint.SDK_MODULES))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "True"


def test_an_mcp_error_s_code_is_read_and_anything_else_has_none() -> None:
    assert endpoint.mcp_error_code(mcp.MCPError(-32602, "bad params")) == -32602
    assert endpoint.mcp_error_code(ValueError("no")) is None
    assert endpoint.mcp_error_code(None) is None
