"""Real MCP tool servers for the suite, built with the ``mcp`` SDK's own server (``MCPServer``,
formerly FastMCP) and run as child processes on free ports, so a test can stop, kill and
restart them by pid.

Run directly: ``python tests/mcp_support.py --port 8123 [--transport sse]``. One server offers
every behaviour the tests need, each in its own tool:

- ``add`` (two integers), ``echo`` (any text back, with its length), ``divide`` (a domain
  error with ``isError`` on division by zero): well behaved.
- ``slow`` (sleeps the given seconds): the slow server.
- ``die``: kills the server process mid-call (the connection resets; the fixture restarts it).
- ``huge`` (n bytes of text), ``picture`` (an image and a text part), ``structured`` (structured
  content only): large and non-text results.
- ``grow``: adds the tool ``extra`` to the server's list (a changing tool list).
- ``count`` (a write): counts its calls per key in a file given by ``--count-file``, and echoes
  the idempotency key it received in ``_meta`` (an ignored ``note`` makes a second argument);
  ``count_slow`` counts at once and answers after the given seconds (a window to kill a worker
  in).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ImageContent, TextContent

HERE = Path(__file__).resolve()


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def echo(text: str) -> str:
    """Echo the text back with its length in characters."""
    return f"{len(text)}:{text}"


def huge(n: int) -> str:
    """n bytes of text."""
    return "x" * n


def extra() -> str:
    """Appeared later."""
    return "extra here"


async def slow(seconds: float) -> str:
    """Wait the given seconds, then answer."""
    await asyncio.sleep(seconds)
    return f"slept {seconds}"


def divide(a: float, b: float) -> float:
    """Divide a by b."""
    if b == 0:
        raise ToolError("cannot divide by zero")
    return a / b


def die() -> str:
    """Kill this server mid-call."""
    os.kill(os.getpid(), signal.SIGKILL)
    return "unreachable"


def picture() -> list[ImageContent | TextContent]:
    """An image and a caption."""
    png = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\x00" * 60).decode()
    return [ImageContent(data=png, mime_type="image/png"), TextContent(text="a single pixel")]


def counters(count_file: str | None) -> tuple[Any, Any]:
    """The ``count`` and ``count_slow`` tools, counting in ``count_file``."""

    def bump(key: str) -> int:
        path = Path(count_file or os.devnull)
        counts = json.loads(path.read_text()) if count_file and path.exists() else {}
        counts[key] = counts.get(key, 0) + 1
        if count_file:
            path.write_text(json.dumps(counts))
        return int(counts[key])

    def count(key: str, ctx: Context, note: str = "") -> str:
        """Count a call per key (a write; ``note`` is ignored: a second argument whose order a
        model may change)."""
        idem = (ctx.request_context.meta or {}).get("agentrun.dev/idempotencyKey")
        return f"{key}={bump(key)} key={idem}"

    async def count_slow(key: str, seconds: float) -> str:
        """Count a call per key at once, answer after the given seconds (a write)."""
        n = bump(key)
        await asyncio.sleep(seconds)
        return f"{key}={n}"

    return count, count_slow


def build(count_file: str | None) -> MCPServer:
    """The MCPServer with every tool of the module docstring."""
    server = MCPServer("agentrun-test-tools")

    def grow() -> str:
        """Add the tool 'extra' to this server."""
        server.add_tool(extra)
        return "grown"

    for tool in (add, echo, divide, slow, die, huge, picture, grow, *counters(count_file)):
        server.add_tool(tool)

    def structured(city: str) -> dict[str, Any]:
        """Structured weather data."""
        return {"city": city, "celsius": 21}

    server.add_tool(structured, structured_output=True)
    return server


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class McpProcess:
    """A test MCP server in a child process (restartable on the same port)."""

    port: int
    transport: str
    count_file: Path
    log: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The endpoint: ``/mcp`` (streamable HTTP) or ``/sse``."""
        path = "/sse" if self.transport == "sse" else "/mcp"
        return f"http://127.0.0.1:{self.port}{path}"

    def start(self, *, timeout: float = 20.0) -> None:
        """Start the server and wait until it accepts connections."""
        cmd = [sys.executable, str(HERE), "--port", str(self.port), "--transport", self.transport]
        cmd += ["--count-file", str(self.count_file)]
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"MCP server exited: {self.log.read_text()[-2000:]}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port)):
                return
            time.sleep(0.05)
        raise RuntimeError(f"MCP server did not listen on {self.port}")

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL); a no-op when it is not running."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)

    def restart(self) -> None:
        """Stop (if running) and start again on the same port."""
        self.stop()
        self.start()

    def counts(self) -> dict[str, int]:
        """Calls of ``count`` per key so far."""
        if not self.count_file.exists():
            return {}
        data: dict[str, int] = json.loads(self.count_file.read_text())
        return data


@contextlib.contextmanager
def running(tmp: Path, *, transport: str = "streamable-http") -> Iterator[McpProcess]:
    """A started test server, stopped on exit."""
    server = McpProcess(free_port(), transport, tmp / "counts.json", tmp / "mcp.log")
    server.start()
    try:
        yield server
    finally:
        server.stop()


def main() -> None:
    """Serve on ``--port`` until terminated."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument(
        "--transport", choices=["streamable-http", "sse"], default="streamable-http"
    )
    parser.add_argument("--count-file")
    args = parser.parse_args()
    server = build(args.count_file)
    if args.transport == "sse":
        server.run("sse", host="127.0.0.1", port=args.port)
    else:
        server.run("streamable-http", host="127.0.0.1", port=args.port)


if __name__ == "__main__":
    main()
