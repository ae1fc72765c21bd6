"""A tool list is bounded by what it costs parsed, not only by its bytes: a page holding more
JSON values than ``endpoint.MAX_MESSAGE_VALUES`` is refused before it is parsed, and pages
each under that bound are refused once the tools' input schemas take more than
``remote.MAX_DISCOVERED_FOOTPRINT`` parsed in all — either way the discovery fails, naming
why, without the operator's memory growing by the pages' parsed size. Against a real MCP
server (the official SDK's) in a process of its own."""

from __future__ import annotations

import contextlib
import resource
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import mcp_support
import pytest

from agentrun.tools import endpoint, remote


@contextlib.contextmanager
def dense_server(pages: int, objects: int) -> Iterator[str]:
    """``dense_mcp.py`` on a free port, its URL once it answers."""
    port = mcp_support.free_port()
    script = Path(__file__).with_name("dense_mcp.py")
    args = ["--port", str(port), "--pages", str(pages), "--objects", str(objects)]
    proc = subprocess.Popen([sys.executable, str(script), *args])
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(url, timeout=1)
                break
            except urllib.error.HTTPError:
                break  # it answers
            except OSError:
                time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


CASES = {
    # 8 MiB of {} a page: 2.8 million dicts parsed, about 200 MB a page
    "one-page-too-dense": (3, (endpoint.MAX_MESSAGE_BYTES - 1024) // 3, "JSON values"),
    "pages-too-dense-together": (3, endpoint.MAX_MESSAGE_VALUES * 3 // 8, "input schemas take"),
}


@pytest.mark.parametrize(("pages", "objects", "why"), CASES.values(), ids=CASES.keys())
async def test_a_dense_tool_list_fails_discovery_unparsed(
    pages: int, objects: int, why: str
) -> None:
    with dense_server(pages, objects) as url:
        point = remote.Endpoint(
            url, endpoint.Transport.STREAMABLE_HTTP, {}, timeout=30.0, private_network=True
        )
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        with pytest.raises(remote.RemoteError, match=why):
            await remote.discover(point)
        grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - before
    assert grown < 60, f"peak RSS grew {grown:.0f} MB"


async def test_a_tool_list_under_both_bounds_is_discovered() -> None:
    with dense_server(2, endpoint.MAX_MESSAGE_VALUES // 16) as url:
        point = remote.Endpoint(
            url, endpoint.Transport.STREAMABLE_HTTP, {}, timeout=30.0, private_network=True
        )
        found = await remote.discover(point)
    assert [t.name for t in found] == ["t", "t"]
