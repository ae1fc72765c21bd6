"""MCP tools against real MCP servers (the ``mcp`` SDK's own server, in child processes):
discovery, calls, result mapping, and each way a server misbehaves."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import mcp_support
import pytest

from agentrun import kernel
from agentrun.kernel import ToolFault
from agentrun.protocol import RemoteTool
from agentrun.tools import ToolContext, ToolError, remote
from agentrun.worker import toolrunner

CTX = ToolContext(namespace="ns", run_name="run", run_uid="run-uid", call_id="call_0_0")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[mcp_support.McpProcess]:
    with mcp_support.running(tmp_path_factory.mktemp("mcp")) as started:
        yield started


@pytest.fixture
def fresh_server(tmp_path: Path) -> Iterator[mcp_support.McpProcess]:
    """A server of the test's own (its tool list, its life)."""
    with mcp_support.running(tmp_path) as started:
        yield started


def admitted(
    url: str, tool: str, *, effect: str = "read", timeout: float = 10.0, **schema: Any
) -> RemoteTool:
    return RemoteTool(
        name=remote.function_name("tools", tool),
        server="tools",
        tool=tool,
        description="",
        parameters=schema or {"type": "object"},
        effect=effect,
        url=url,
        transport="StreamableHTTP",
        timeout=timeout,
        private_network=True,  # the test servers listen on loopback
    )


def call(tool: RemoteTool, **arguments: Any) -> str:
    return asyncio.run(remote.mcp_tool(tool).run(arguments, CTX))


def failure(tool: RemoteTool, **arguments: Any) -> ToolError:
    with pytest.raises(ToolError) as caught:
        call(tool, **arguments)
    return caught.value


def test_discovery_lists_every_tool_with_its_real_input_schema(
    server: mcp_support.McpProcess,
) -> None:
    found = {
        d.name: d
        for d in asyncio.run(remote.discover(remote.Endpoint(server.url, private_network=True)))
    }
    assert {"add", "echo", "divide", "slow", "huge", "picture", "count"} <= set(found)
    add = found["add"].input_schema
    assert add["required"] == ["a", "b"]
    assert add["properties"]["a"]["type"] == "integer"
    assert found["add"].description == "Add two integers."


def test_a_well_behaved_tool_answers_with_its_text(server: mcp_support.McpProcess) -> None:
    assert call(admitted(server.url, "add"), a=2, b=40) == "42"


def test_an_is_error_result_is_an_error_the_model_reads(server: mcp_support.McpProcess) -> None:
    err = failure(admitted(server.url, "divide"), a=1, b=0)
    assert err.fault is ToolFault.REJECTED
    assert "cannot divide by zero" in err.message


def test_arguments_the_server_refuses_are_the_models_error(server: mcp_support.McpProcess) -> None:
    err = failure(admitted(server.url, "add"), a="two", b=2)
    assert not err.fault.infrastructure
    assert "valid integer" in err.message


def test_large_arguments_arrive_whole(server: mcp_support.McpProcess) -> None:
    text = "é" * 300_000
    assert call(admitted(server.url, "echo"), text=text) == f"300000:{text}"


def test_non_text_content_is_named_and_text_content_kept(server: mcp_support.McpProcess) -> None:
    out = call(admitted(server.url, "picture"))
    assert out == "[image image/png, 68 bytes, not shown]\na single pixel"


def test_structured_content_is_kept(server: mcp_support.McpProcess) -> None:
    out = call(admitted(server.url, "structured"), city="Oslo")
    assert '"city": "Oslo"' in out and '"celsius": 21' in out


def test_a_huge_result_is_cut_to_the_byte_cap_by_the_runner(
    server: mcp_support.McpProcess,
) -> None:
    tool = remote.mcp_tool(admitted(server.url, "huge"))
    checked = kernel.CheckedCall("c1", tool.spec.name, {"n": 3_000_000})
    settings = toolrunner.ToolRunSettings(max_result_bytes=4096)
    (result,) = asyncio.run(
        toolrunner.run_batch(
            [checked],
            tools={tool.spec.name: tool},
            context=CTX,
            settings=settings,
            deadline=time.time() + 60,
        )
    )
    assert not result.is_error
    assert len(result.content.encode()) < 4200
    assert "[agentrun: result truncated, 2995904 more bytes]" in result.content


def test_a_slow_tool_is_cut_at_its_timeout_as_an_infrastructure_fault(
    server: mcp_support.McpProcess,
) -> None:
    started = time.monotonic()
    err = failure(admitted(server.url, "slow", timeout=1.0), seconds=10)
    assert err.fault is ToolFault.TIMEOUT and err.fault.infrastructure
    # cut at 1 s, not after the tool's 10 s; the rest is the session's opening and closing,
    # slower on a busy machine
    assert time.monotonic() - started < 6


def test_write_and_idempotent_calls_carry_the_idempotency_key(
    server: mcp_support.McpProcess,
) -> None:
    assert call(admitted(server.url, "count", effect="write"), key="w").endswith(
        "key=run-uid:call_0_0"
    )
    assert call(admitted(server.url, "count", effect="idempotent"), key="i").endswith(
        "key=run-uid:call_0_0"
    )
    assert call(admitted(server.url, "count"), key="r").endswith("key=None")


def test_a_connection_reset_mid_call_then_a_restart_gets_a_new_session(
    fresh_server: mcp_support.McpProcess,
) -> None:
    err = failure(admitted(fresh_server.url, "die"))
    assert err.fault is ToolFault.CONNECTION
    down = failure(admitted(fresh_server.url, "add"), a=1, b=1)
    assert down.fault is ToolFault.CONNECTION  # refused while it is down
    fresh_server.start()
    assert call(admitted(fresh_server.url, "add"), a=1, b=1) == "2"


def test_a_changing_tool_list_is_seen_by_the_next_discovery(
    fresh_server: mcp_support.McpProcess,
) -> None:
    endpoint = remote.Endpoint(fresh_server.url, private_network=True)
    before = {d.name for d in asyncio.run(remote.discover(endpoint))}
    assert call(admitted(fresh_server.url, "grow")) == "grown"
    after = {d.name for d in asyncio.run(remote.discover(endpoint))}
    assert after - before == {"extra"}


def test_discovery_of_a_server_that_never_answers_ends_at_its_hard_timeout() -> None:
    with socket.socket() as hole:  # accepts connections, never answers
        hole.bind(("127.0.0.1", 0))
        hole.listen()
        url = f"http://127.0.0.1:{hole.getsockname()[1]}/mcp"
        started = time.monotonic()
        with pytest.raises(remote.RemoteError) as caught:
            asyncio.run(remote.discover(remote.Endpoint(url, timeout=1.0, private_network=True)))
    assert caught.value.fault is ToolFault.TIMEOUT
    assert time.monotonic() - started < 2.5


def test_discovery_of_a_server_that_is_down_says_so() -> None:
    url = f"http://127.0.0.1:{mcp_support.free_port()}/mcp"
    with pytest.raises(remote.RemoteError) as caught:
        asyncio.run(remote.discover(remote.Endpoint(url, timeout=5.0, private_network=True)))
    assert caught.value.fault is ToolFault.CONNECTION
    assert url in caught.value.message


def test_a_wrong_endpoint_path_is_a_transport_fault(server: mcp_support.McpProcess) -> None:
    err = failure(admitted(server.url.replace("/mcp", "/elsewhere"), "add"), a=1, b=1)
    assert err.fault is ToolFault.TRANSPORT


def test_an_sse_server_works_the_same(tmp_path: Path) -> None:
    with mcp_support.running(tmp_path, transport="sse") as sse:
        endpoint = remote.Endpoint(sse.url, remote.Transport.SSE, private_network=True)
        assert "add" in {d.name for d in asyncio.run(remote.discover(endpoint))}
        tool = admitted(sse.url, "add")
        sse_tool = dataclasses.replace(tool, transport="SSE")
        assert asyncio.run(remote.mcp_tool(sse_tool).run({"a": 3, "b": 4}, CTX)) == "7"


def test_headers_are_read_at_call_time_and_their_failure_is_infrastructure(
    server: mcp_support.McpProcess,
) -> None:
    async def unreadable() -> dict[str, str]:
        raise ToolError("cannot read Secret ns/creds", fault=ToolFault.TRANSPORT)

    tool = remote.mcp_tool(admitted(server.url, "add"), headers=unreadable)
    with pytest.raises(ToolError) as caught:
        asyncio.run(tool.run({"a": 1, "b": 1}, CTX))
    assert caught.value.fault is ToolFault.TRANSPORT


@pytest.fixture(scope="module")
def gated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[mcp_support.McpProcess]:
    """A server behind a gateway that answers ``add`` with 403 and ``echo`` with 503."""
    with mcp_support.running(tmp_path_factory.mktemp("gated"), deny="add=403,echo=503") as s:
        yield s


def run_one(
    tool: RemoteTool, *, retries: int = 2, **arguments: Any
) -> tuple[kernel.ToolResult, float]:
    """One call through the worker's tool runner (its retries): the result and the seconds."""
    mcp = remote.mcp_tool(tool)
    settings = toolrunner.ToolRunSettings(retries=retries, retry_backoff=0.2, call_timeout=60)
    started = time.monotonic()
    (result,) = asyncio.run(
        toolrunner.run_batch(
            [kernel.CheckedCall("c1", mcp.spec.name, arguments)],
            tools={mcp.spec.name: mcp},
            context=CTX,
            settings=settings,
            deadline=time.time() + 120,
        )
    )
    return result, time.monotonic() - started


def test_a_403_goes_back_to_the_model_once_naming_the_status(
    gated: mcp_support.McpProcess,
) -> None:
    err = failure(admitted(gated.url, "add"), a=1, b=2)
    assert err.fault is ToolFault.REJECTED and not err.fault.infrastructure
    assert "HTTP 403 Forbidden" in str(err)
    before = [r["method"] for r in gated.requests()].count("tools/call")
    result, _ = run_one(admitted(gated.url, "add"), a=1, b=2)
    calls = [r["method"] for r in gated.requests()].count("tools/call") - before
    assert result.fault is ToolFault.REJECTED and calls == 1  # not retried
    assert "HTTP 403" in result.content and "attempts" not in result.content


def test_a_503_is_a_server_fault_retried_and_named(gated: mcp_support.McpProcess) -> None:
    err = failure(admitted(gated.url, "echo"), text="hi")
    assert err.fault is ToolFault.SERVER and "HTTP 503 Service Unavailable" in str(err)
    before = [r["method"] for r in gated.requests()].count("tools/call")
    result, _ = run_one(admitted(gated.url, "echo"), text="hi")
    calls = [r["method"] for r in gated.requests()].count("tools/call") - before
    assert result.fault is ToolFault.SERVER and calls == 3
    assert "HTTP 503" in result.content and "(after 3 attempts)" in result.content


@pytest.mark.parametrize("status", [400, 401, 404, 409, 413, 422])
def test_every_4xx_but_408_and_429_is_the_models_to_correct(status: int) -> None:
    assert remote.status_fault(status) is ToolFault.REJECTED


@pytest.mark.parametrize(
    ("status", "fault"),
    [(408, ToolFault.TIMEOUT), (429, ToolFault.SERVER), (500, ToolFault.SERVER)],
)
def test_408_429_and_5xx_are_faults(status: int, fault: ToolFault) -> None:
    assert remote.status_fault(status) is fault and fault.infrastructure


def test_one_deadline_bounds_a_call_and_all_its_retries(server: mcp_support.McpProcess) -> None:
    """A read call on a server that never answers in time ends at its declared timeout, not
    three times it (the timeout is not restarted for each retry)."""
    result, seconds = run_one(admitted(server.url, "slow", timeout=3.0), seconds=30)
    assert result.fault is ToolFault.TIMEOUT
    assert "timed out after 3s" in result.content
    assert seconds < 5.5  # one 3 s deadline (and a session's closing), not 3 x 3 s


def test_an_escape_heavy_result_is_cut_to_the_cap_as_stored(
    server: mcp_support.McpProcess,
) -> None:
    tool = remote.mcp_tool(admitted(server.url, "echo"))
    text = '"\\\n\x01' * 12_000  # 2 + 2 + 2 + 6 stored bytes a group of 4 characters
    settings = toolrunner.ToolRunSettings(max_result_bytes=16_384)
    (result,) = asyncio.run(
        toolrunner.run_batch(
            [kernel.CheckedCall("c1", tool.spec.name, {"text": text})],
            tools={tool.spec.name: tool},
            context=CTX,
            settings=settings,
            deadline=time.time() + 60,
        )
    )
    body = result.content[: result.content.rindex("\n[agentrun: result truncated")]
    assert kernel.bounds.stored_bytes(body) <= 16_384
    assert kernel.bounds.stored_bytes(result.content) <= 16_384 + 64


async def _call_while_ticking(tool: RemoteTool, pool: bool) -> tuple[str, float]:
    """Call ``tool`` while another task ticks every 10 ms, as another run's turn would; the
    result and the longest the ticker waited."""
    ticks: list[float] = []
    stop = asyncio.Event()

    async def ticker() -> None:
        while not stop.is_set():
            ticks.append(time.monotonic())
            await asyncio.sleep(0.01)

    task = asyncio.create_task(ticker())
    sessions = remote.SessionPool() if pool else None
    try:
        out = await remote.mcp_tool(tool, pool=sessions).run({}, CTX)
    finally:
        stop.set()
        await task
        ticks.append(time.monotonic())  # the wait since the ticker's last turn counts too
        if sessions is not None:
            await sessions.aclose()
    return out, max(b - a for a, b in itertools.pairwise(ticks))


@pytest.mark.parametrize("pool", [False, True], ids=["own-session", "pooled"])
def test_a_hostile_output_schema_never_runs_in_the_callers_loop(
    server: mcp_support.McpProcess, pool: bool
) -> None:
    """The SDK would check ``shaped``'s structured content against its listed outputSchema
    (``^(a+)+$``, 41 characters: hours on Python's re) inside the event loop every run of the
    worker shares; the runtime drops that check."""
    started = time.monotonic()
    out, gap = asyncio.run(_call_while_ticking(admitted(server.url, "shaped", timeout=8), pool))
    assert mcp_support.HOSTILE_TEXT in out
    assert time.monotonic() - started < 6
    assert gap < 1.0, f"the event loop stalled {gap:.2f}s"


def test_a_hostile_server_lists_the_schemas_its_author_chose(
    server: mcp_support.McpProcess,
) -> None:
    found = {
        d.name: d
        for d in asyncio.run(remote.discover(remote.Endpoint(server.url, private_network=True)))
    }
    code = found["guarded"].input_schema["properties"]["code"]
    assert code["pattern"] == mcp_support.HOSTILE_PATTERN
    assert "(?!x)" in found["lookahead"].input_schema["properties"]["code"]["pattern"]
