"""A tenant's MCP server (the suite's real one, ``mcp_support.build``) whose ``tools/list``
answers ``--pages`` pages, each ``--tools`` tools (one by default) whose input schema holds
``--objects`` empty JSON objects (``{}``: two bytes each on the wire, a Python dict each once
parsed) and whose description is ``--description`` characters long. Run:
``python dense_mcp.py --port P --pages N --objects K [--tools T] [--description C]``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import uvicorn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import mcp_support


def page(
    request_id: Any, objects: int, *, last: bool, tools: int = 1, description: int = 0
) -> bytes:
    tool = {
        "name": "t",
        "description": "d" * description,
        "inputSchema": {"type": "object", "x": [{}] * objects},
    }
    result: dict[str, Any] = {
        "tools": [tool] * tools,
        "resultType": "complete",
        "cacheScope": "private",
        "ttlMs": 0,
    }
    if not last:
        result["nextCursor"] = "more"
    reply = {"jsonrpc": "2.0", "id": request_id, "result": result}
    return json.dumps(reply, separators=(",", ":")).encode()


class Pages:
    """The app, with ``tools/list`` answered by ``page``."""

    def __init__(self, app: Any, pages: int, objects: int, *, tools: int, description: int) -> None:
        self.app, self.pages, self.objects, self.served = app, pages, objects, 0
        self.tools, self.description = tools, description

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        messages, body = await mcp_support.buffered(receive)
        parsed = json.loads(body or b"{}")
        if isinstance(parsed, dict) and parsed.get("method") == "tools/list":
            self.served += 1
            last = self.served % self.pages == 0
            reply = page(
                parsed.get("id"),
                self.objects,
                last=last,
                tools=self.tools,
                description=self.description,
            )
            headers = [(b"content-type", b"application/json")]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": reply})
            return

        await self.app(scope, mcp_support.replaying(messages, receive), send)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--pages", type=int, default=3)
    parser.add_argument("--objects", type=int, required=True)
    parser.add_argument("--tools", type=int, default=1)
    parser.add_argument("--description", type=int, default=0)
    args = parser.parse_args()
    app = mcp_support.build(None).streamable_http_app(host="127.0.0.1")
    uvicorn.run(
        Pages(app, args.pages, args.objects, tools=args.tools, description=args.description),
        host="127.0.0.1",
        port=args.port,
        log_level="warning",
    )


if __name__ == "__main__":
    main()
