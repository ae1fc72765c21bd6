"""A tool list is bounded by what it costs parsed, not only by its bytes: a page holding more
JSON values than ``endpoint.MAX_MESSAGE_VALUES`` is refused before it is parsed, and pages
each under that bound are refused once the tools' input schemas take more than
``remote.MAX_DISCOVERED_FOOTPRINT`` parsed in all — either way the discovery fails, naming
why, without the operator's memory growing by the pages' parsed size. Descriptions are kept
to ``remote.MAX_DESCRIPTION_CHARS`` as each page arrives and count towards that bound with the
names. Against a real MCP server (the official SDK's) in a process of its own."""

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
def dense_server(
    pages: int, objects: int, *, tools: int = 1, description: int = 0
) -> Iterator[str]:
    """``dense_mcp.py`` on a free port, its URL once it answers."""
    port = mcp_support.free_port()
    script = Path(__file__).with_name("dense_mcp.py")
    args = ["--port", str(port), "--pages", str(pages), "--objects", str(objects)]
    args += ["--tools", str(tools), "--description", str(description)]
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
    "pages-too-dense-together": (3, endpoint.MAX_MESSAGE_VALUES * 3 // 8, "input schemas, names"),
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


def _point(url: str) -> remote.Endpoint:
    return remote.Endpoint(
        url, endpoint.Transport.STREAMABLE_HTTP, {}, timeout=30.0, private_network=True
    )


async def test_a_tool_list_of_huge_descriptions_is_kept_cut() -> None:
    """20 pages, each one tool with an 8 MiB description: discovery held 160 MiB of them
    until the status was written (peak RSS about +195 MB), 8 such servers of one tenant at
    once over a gigabyte."""
    pages, description = remote.MAX_DISCOVERED_PAGES, endpoint.MAX_MESSAGE_BYTES - 4096
    with dense_server(pages, 1, description=description) as url:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        found = await remote.discover(_point(url))
        grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - before
    assert len(found) == pages
    assert {len(t.description) for t in found} == {remote.MAX_DESCRIPTION_CHARS}
    assert found[0].description.endswith("…")
    assert grown < 60, f"peak RSS grew {grown:.0f} MB"


async def test_many_tools_with_long_descriptions_fail_discovery() -> None:
    """Descriptions count towards ``MAX_DISCOVERED_FOOTPRINT`` as kept: pages of a thousand
    tools, each with a description at the kept bound, fail past it (they counted nothing)."""
    tools = 1000
    pages = remote.MAX_DISCOVERED_FOOTPRINT // (tools * remote.MAX_DESCRIPTION_CHARS) + 1
    server = dense_server(pages, 0, tools=tools, description=remote.MAX_DESCRIPTION_CHARS)
    with server as url, pytest.raises(remote.RemoteError, match="names and descriptions take"):
        await remote.discover(_point(url))
