"""The effect ledger under SIGKILL, with a counting MCP server: a write happens at most once
whatever point its worker dies at, and exactly once whenever the run completes."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Iterator
from pathlib import Path

import mcp_support
import nats
import nats.js.errors
import pytest

from agentrun import effects
from agentrun_dev import components, natsserver, stack

from .conftest import ACK_WAIT, E2EStack, run_manifest

pytestmark = pytest.mark.e2e


@pytest.fixture
def lone_worker(stack_: E2EStack) -> Iterator[components.Component]:
    """The only worker (the stack's two are stopped; ``restart_dead`` brings them back)."""
    for worker in stack_.workers:
        components.stop_component(worker)
    lone = stack.start_worker(7, env=stack_.env, launch=stack_.launch)
    try:
        yield lone
    finally:
        if lone.is_alive():
            components.kill_component(lone)
        stack_.restart_dead()


def start_run(
    stack_: E2EStack, namespace: str, tmp: Path, name: str, goal: str, tools: list[str]
) -> mcp_support.McpProcess:
    server = mcp_support.McpProcess(
        mcp_support.free_port(), "streamable-http", tmp / "counts.json", tmp / "mcp.log"
    )
    server.start()
    manifest = {
        "apiVersion": "agentrun.dev/v1alpha1",
        "kind": "AgentToolServer",
        "metadata": {"name": "ledger"},
        "spec": {
            "url": server.url,
            "tools": [
                {"name": "count", "effect": "write"},
                {"name": "count_slow", "effect": "write"},
            ],
        },
    }
    stack_.apply(namespace, manifest)
    stack_.apply(namespace, run_manifest(name, goal, tools=tools))
    return server


def wait_recorded_done(nats_url: str, key: str, *, timeout: float = 30) -> None:
    """Until the effect ledger's entry ``key`` is ``done`` (the write answered and was
    recorded)."""

    async def poll() -> None:
        client = await nats.connect(nats_url)
        try:
            kv = await client.jetstream().key_value(effects.BUCKET)
            end = time.monotonic() + timeout
            while time.monotonic() < end:
                with contextlib.suppress(nats.js.errors.KeyNotFoundError):
                    entry = await kv.get(key)
                    if entry.value and json.loads(entry.value)["state"] == "done":
                        return
                await asyncio.sleep(0.05)
            raise AssertionError(f"{key} was never recorded done")
        finally:
            await client.close()

    asyncio.run(poll())


def wait_count(server: mcp_support.McpProcess, key: str, *, timeout: float = 30) -> None:
    end = time.monotonic() + timeout
    while server.counts().get(key, 0) < 1:
        assert time.monotonic() < end, f"{key} was never called"
        time.sleep(0.05)


def test_a_write_recorded_before_the_worker_died_is_replayed_not_repeated(
    stack_: E2EStack,
    test_namespace: str,
    tmp_path: Path,
    lone_worker: components.Component,
    nats_server: natsserver.NatsServer,
) -> None:
    server = start_run(
        stack_,
        test_namespace,
        tmp_path,
        "replayed",
        "E2E-WRITE-THEN-WAIT",
        ["ledger/count", "sleep"],
    )
    try:
        wait_count(server, "done-then-kill")
        uid = stack_.kubectl(
            "get", "agentrun", "replayed", "-n", test_namespace, "-o", "jsonpath={.metadata.uid}"
        ).stdout
        # the write answered and was recorded; the 4 s sleep still runs
        wait_recorded_done(nats_server.url, effects.effect_key(uid, "w1"))
        components.kill_component(lone_worker)
        stack_.restart_dead()
        run = stack_.wait_terminal(test_namespace, "replayed", timeout=40 + ACK_WAIT)
        assert (run["terminalReason"], run["answer"]) == ("completed", "written once"), run
        assert server.counts() == {"done-then-kill": 1}  # exactly once: the run completed
    finally:
        server.stop()


def test_a_write_in_flight_when_the_worker_died_ends_effect_unknown_never_resent(
    stack_: E2EStack, test_namespace: str, tmp_path: Path, lone_worker: components.Component
) -> None:
    server = start_run(
        stack_, test_namespace, tmp_path, "unknown", "E2E-WRITE-IN-FLIGHT", ["ledger/count_slow"]
    )
    try:
        wait_count(server, "kill-in-flight")  # sent; the server answers 4 s later
        components.kill_component(lone_worker)
        stack_.restart_dead()
        run = stack_.wait_terminal(test_namespace, "unknown", timeout=40 + ACK_WAIT)
        assert run["terminalReason"] == "effect_unknown", run
        assert "ledger__count_slow (w1) was sent before its worker stopped" in run["message"]
        time.sleep(1.0)
        assert server.counts() == {"kill-in-flight": 1}  # at most once
    finally:
        server.stop()
