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
- ``chatter`` (n): sends n log notifications at a level the protocol does not have before it
  answers; the client's SDK logs a warning for each (a noisy or hostile server).
- ``grow``: adds the tool ``extra`` to the server's list (a changing tool list).
- ``guarded`` (lists an ``inputSchema`` whose ``code`` has the catastrophic pattern
  ``^(a+)+$``), ``lookahead`` (lists a pattern with a lookahead, which RE2 refuses) and
  ``shaped`` (lists an ``outputSchema`` with ``^(a+)+$`` and returns structured content that
  backtracks on it for hours): a hostile server's schemas, as its author chooses them.
- ``count`` (a write): counts its calls per key in a file given by ``--count-file``, and echoes
  the idempotency key it received in ``_meta`` (an ignored ``note`` makes a second argument);
  ``count_slow`` counts at once and answers after the given seconds (a window to kill a worker
  in).

Every POST is recorded, one JSON line each (``--requests-file``): its path, its JSON-RPC
method, the ``Mcp-Session-Id`` it carried and its ``Authorization`` header, so a test can
count handshakes (``initialize``, ``server/discover``) and see which session and headers a
call came with.
``--deny TOOL=STATUS,…`` answers those tools' calls with that HTTP status and a plain-text
body, as a gateway in front of a server does (a 403 from an auth proxy, a 503 from an
overloaded backend). ``--era legacy`` makes the server answer like the servers of the
handshake era (protocol 2025-xx and before): the 2026 ``server/discover`` probe is refused as
a request without a session, so clients fall back to ``initialize`` and get an
``Mcp-Session-Id`` — which a restarted server no longer knows (HTTP 404), the field failure
pooled clients must survive. ``--sse-path`` and ``--message-path`` move an SSE server's
stream and the path its ``endpoint`` event names for messages (e.g. ``/a/sse`` naming
``/b/messages/``: a server sending its session's messages outside its tenant's path prefix).
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

import uvicorn
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ImageContent, TextContent
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS

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


async def chatter(n: int, ctx: Context) -> str:
    """Send n notifications the client cannot validate (a log message at a level the protocol
    does not have), each of which the client's SDK logs a warning for, then answer."""
    for i in range(n):
        # the SDK's own way out, below its typed notifications (which would refuse the level)
        await ctx.session._request_outbound.notify(
            "notifications/message", {"level": "shout", "data": f"chatter {i}"}
        )
    return f"said {n}"


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
            # Written whole and renamed into place: the test process reads this file while the
            # server writes it, and must never see it empty or half written.
            partial = path.with_name(path.name + ".partial")
            partial.write_text(json.dumps(counts))
            os.replace(partial, path)
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

    tools = (add, echo, divide, slow, die, huge, picture, grow, chatter, *counters(count_file))
    for tool in tools:
        server.add_tool(tool)

    def structured(city: str) -> dict[str, Any]:
        """Structured weather data."""
        return {"city": city, "celsius": 21}

    server.add_tool(structured, structured_output=True)
    hostile(server)
    return server


HOSTILE_PATTERN = "^(a+)+$"
"""Backtracks for seconds at 30 characters, hours at 40 (Python's re)."""
HOSTILE_TEXT = "a" * 40 + "!"


def guarded(code: str) -> str:
    """Echo a code (its listed schema asks for ^(a+)+$)."""
    return f"code {len(code)}"


def lookahead(code: str) -> str:
    """Echo a code (its listed schema has a lookahead)."""
    return f"code {code}"


def shaped() -> dict[str, Any]:
    """Structured content its listed output schema backtracks on."""
    return {"v": HOSTILE_TEXT}


def hostile(server: MCPServer) -> None:
    """Add ``guarded``, ``lookahead`` and ``shaped`` with the schemas a hostile author lists.
    The SDK derives a tool's listed schemas from its signature; these are replaced after
    (``Tool.parameters`` and the output schema of its ``fn_metadata``: the SDK's own fields),
    as a server written by hand would list them. The server's own argument checks keep the
    signature's (no pattern)."""
    for tool in (guarded, lookahead):
        server.add_tool(tool)
    server.add_tool(shaped, structured_output=True)
    tools = server._tool_manager  # the SDK keeps its tools here
    pattern = {"guarded": HOSTILE_PATTERN, "lookahead": "^(?!x)[a-z]+$"}
    for name, regex in pattern.items():
        tools.get_tool(name).parameters = {
            "type": "object",
            "properties": {"code": {"type": "string", "pattern": regex}},
            "required": ["code"],
        }
    shaped_tool = tools.get_tool("shaped")
    shaped_tool.fn_metadata.output_schema = {
        "type": "object",
        "properties": {"v": {"type": "string", "pattern": HOSTILE_PATTERN}},
    }


class Recorder:
    """ASGI middleware: records every POST (``requests_file``) and, for ``legacy``, refuses
    requests of the 2026 protocol as a handshake-era server does."""

    def __init__(
        self,
        app: Any,
        *,
        requests_file: str | None,
        legacy: bool,
        deny: dict[str, int] | None = None,
    ) -> None:
        self.app = app
        self.requests_file = requests_file
        self.legacy = legacy
        self.deny = deny or {}
        """Tool name → HTTP status its ``tools/call`` is answered with, as by a gateway in
        front of the server (an auth proxy's 403, an overloaded backend's 503)."""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        messages, body = await buffered(receive)
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        try:
            parsed = json.loads(body)
            method = parsed.get("method")
            tool = (parsed.get("params") or {}).get("name")
        except (ValueError, AttributeError):
            method = tool = None
        if self.requests_file:
            line = {
                "path": scope["path"],
                "method": method,
                "session": headers.get("mcp-session-id"),
                "authorization": headers.get("authorization"),
                "headers": sorted(headers),
            }
            with open(self.requests_file, "a") as out:
                out.write(json.dumps(line) + "\n")
        if method == "tools/call" and tool in self.deny:
            start = {"type": "http.response.start", "status": self.deny[tool]}
            start["headers"] = [(b"content-type", b"text/plain")]
            await send(start)
            await send({"type": "http.response.body", "body": b"denied by the gateway"})
            return
        version = headers.get("mcp-protocol-version")
        if self.legacy and version is not None and version not in HANDSHAKE_PROTOCOL_VERSIONS:
            error = {"code": -32600, "message": "Bad Request: Missing session ID"}
            reply = json.dumps({"jsonrpc": "2.0", "id": None, "error": error}).encode()
            start = {"type": "http.response.start", "status": 400}
            start["headers"] = [(b"content-type", b"application/json")]
            await send(start)
            await send({"type": "http.response.body", "body": reply})
            return

        await self.app(scope, replaying(messages, receive), send)


async def buffered(receive: Any) -> tuple[list[Any], bytes]:
    """An ASGI request's messages, read whole, and its body: for a middleware that looks at
    the body before it hands the request on (``replaying``)."""
    messages: list[Any] = []
    body = b""
    while True:
        message = await receive()
        messages.append(message)
        body += message.get("body", b"")
        if not message.get("more_body"):
            return messages, body


def replaying(messages: list[Any], receive: Any) -> Any:
    """An ASGI ``receive`` that gives ``messages`` (``buffered``) again, then reads on."""

    async def replay() -> Any:
        return messages.pop(0) if messages else await receive()

    return replay


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
    era: str = "modern"
    """``modern`` (the SDK's own: 2026 protocol, no sessions) or ``legacy`` (see above)."""
    requests_file: Path | None = None
    host: str = "127.0.0.1"
    """The address it listens on (the node's pod gateway for pods to reach it)."""
    deny: str = ""
    """``TOOL=STATUS,…``: calls of those tools are answered with that HTTP status."""
    sse_path: str = "/sse"
    """Where an SSE server's stream is."""
    message_path: str = "/messages/"
    """The path an SSE server's ``endpoint`` event names for the session's messages."""

    @property
    def url(self) -> str:
        """The endpoint: ``/mcp`` (streamable HTTP) or ``sse_path``."""
        path = self.sse_path if self.transport == "sse" else "/mcp"
        return f"http://{self.host}:{self.port}{path}"

    def start(self, *, timeout: float = 20.0) -> None:
        """Start the server and wait until it accepts connections (after the previous process,
        if any — e.g. one that killed itself — has exited, so its listener is not mistaken for
        the new one)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.wait(timeout)
        cmd = [sys.executable, str(HERE), "--port", str(self.port), "--transport", self.transport]
        cmd += ["--count-file", str(self.count_file), "--era", self.era, "--host", self.host]
        if self.requests_file is not None:
            cmd += ["--requests-file", str(self.requests_file)]
        if self.deny:
            cmd += ["--deny", self.deny]
        cmd += ["--sse-path", self.sse_path, "--message-path", self.message_path]
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"MCP server exited: {self.log.read_text()[-2000:]}")
            with contextlib.suppress(OSError), socket.create_connection((self.host, self.port)):
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

    def requests(self) -> list[dict[str, Any]]:
        """Every POST so far (across restarts): ``method``, ``session``, ``authorization``,
        ``headers`` (the names of every header it came with, lower case)."""
        if self.requests_file is None or not self.requests_file.exists():
            return []
        # Only whole lines: the server may be appending the last one while this reads.
        text = self.requests_file.read_text()
        return [json.loads(line) for line in text[: text.rfind("\n") + 1].splitlines()]

    def handshakes(self) -> int:
        """Sessions opened so far: ``initialize`` requests, or else ``server/discover`` probes
        (a legacy server gets both from a client that probes first)."""
        methods = [r["method"] for r in self.requests()]
        return methods.count("initialize") or methods.count("server/discover")


@contextlib.contextmanager
def running(
    tmp: Path,
    *,
    transport: str = "streamable-http",
    era: str = "modern",
    deny: str = "",
    sse_paths: tuple[str, str] = ("/sse", "/messages/"),
) -> Iterator[McpProcess]:
    """A started test server, stopped on exit; ``sse_paths``: an SSE server's stream and the
    path its ``endpoint`` event names."""
    server = McpProcess(free_port(), transport, tmp / "counts.json", tmp / "mcp.log", era=era)
    server.deny = deny
    server.sse_path, server.message_path = sse_paths
    server.requests_file = tmp / "requests.jsonl"
    try:
        server.start()  # a start that times out leaves its process: stopped below too
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
    parser.add_argument("--requests-file")
    parser.add_argument("--era", choices=["modern", "legacy"], default="modern")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--deny", default="", help="TOOL=STATUS,...: answer their calls so")
    parser.add_argument("--sse-path", default="/sse")
    parser.add_argument("--message-path", default="/messages/")
    args = parser.parse_args()
    deny = {k: int(v) for k, v in (p.split("=") for p in args.deny.split(",") if p)}
    server = build(args.count_file)
    # the SDK guards a loopback server against DNS rebinding (Host must be loopback); one on
    # the node's pod gateway is reached by that address
    if args.transport == "sse":
        app = server.sse_app(host=args.host, sse_path=args.sse_path, message_path=args.message_path)
    else:
        app = server.streamable_http_app(host=args.host)
    recorded = Recorder(
        app, requests_file=args.requests_file, legacy=args.era == "legacy", deny=deny
    )
    uvicorn.run(recorded, host=args.host, port=args.port, log_level="info")


if __name__ == "__main__":
    main()
