"""Write tools under SIGKILL, with a counting MCP server and a model that, asked again, answers
with new call ids and its arguments in another order (as real models do): a write happens at
most once whatever point its worker dies at, and exactly once whenever the run completes.

The points: while the model decides (nothing sent: the redone turn asks the model again and
gets new ids, harmless since nothing ran); after the write answered and its result was recorded
in the effect ledger, before the turn's commit (the redone turn replays the result under the
committed id, and never asks the model again); after the commit (the next turn goes on); and
while the write is in flight (sent, outcome not recorded: never sent again, ``effect_unknown``
— the same ledger state as a worker killed after the tool answered but before recording it).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import mcp_support
import nats
import nats.js.errors
import pytest
from kv_support import live_keys

from agentrun.worker import effects
from agentrun_dev import components, natsserver, stack
from agentrun_dev.natsserver import NatsServer

from .conftest import ACK_WAIT, E2EStack, run_manifest

pytestmark = [pytest.mark.e2e, pytest.mark.long]


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


def until(check: Callable[[], bool], what: str, *, timeout: float = 30) -> None:
    end = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < end, f"{what}: not in {timeout}s"
        time.sleep(0.05)


def model_asked(stack_: E2EStack, scenario: str, turn: int) -> int:
    """How often the scripted model was asked for ``turn`` of ``scenario`` so far."""
    return sum(1 for r in stack_.mock_requests() if (r["scenario"], r["turn"]) == (scenario, turn))


def recorded_done(nats_url: NatsServer, run_uid: str) -> bool:
    """Whether a call of the run is ``done`` in the effect ledger (answered and recorded)."""

    async def look() -> bool:
        client = await nats.connect(**nats_url.client_options())
        try:
            kv = await client.jetstream().key_value(effects.BUCKET)
            for key in await live_keys(kv, f"{run_uid}.*"):
                entry = await kv.get(key)
                if entry.value and json.loads(entry.value)["state"] == "done":
                    return True
            return False
        finally:
            await client.close()

    return asyncio.run(look())


@dataclasses.dataclass(frozen=True)
class Killed:
    """Where a worker is killed: the run's scenario, the moment, and what must follow."""

    goal: str
    scenario: str
    tools: tuple[str, ...]
    counted_at_kill: int
    reason: str
    decided: int
    """How often the model is asked for the decision (turn 0) in all."""


POINTS = {
    "while-deciding": Killed(
        "E2E-WRITE-KILL-DECIDING", "write-kill-deciding", ("ledger/count",), 0, "completed", 2
    ),
    "after-ledger-write": Killed(
        "E2E-WRITE-THEN-WAIT", "write-then-wait", ("ledger/count", "sleep"), 1, "completed", 1
    ),
    "after-commit": Killed(
        "E2E-WRITE-THEN-ANSWER", "write-then-answer", ("ledger/count",), 1, "completed", 1
    ),
    "in-flight": Killed(
        "E2E-WRITE-IN-FLIGHT", "write-in-flight", ("ledger/count_slow",), 1, "effect_unknown", 1
    ),
}


def wait_for_point(
    point: str, stack_: E2EStack, *, nats_url: NatsServer, uid: str, server: mcp_support.McpProcess
) -> None:
    """Return at ``point`` of the run ``uid``."""
    scenario = POINTS[point].scenario
    if point == "while-deciding":  # the model was asked; it answers 3 s later
        until(lambda: model_asked(stack_, scenario, 0) == 1, "the model was asked")
    elif point == "after-ledger-write":  # recorded; the batch's 4 s sleep still runs
        until(lambda: recorded_done(nats_url, uid), "the write was recorded done")
    elif point == "after-commit":  # committed; the final answer comes 3 s later
        until(lambda: model_asked(stack_, scenario, 1) == 1, "the model was asked to go on")
    else:  # sent; the server answers 4 s later
        until(lambda: server.counts().get("once", 0) >= 1, "the write was sent")


@pytest.mark.parametrize("point", list(POINTS))
def test_a_write_runs_at_most_once_and_exactly_once_when_the_run_completes(
    stack_: E2EStack,
    test_namespace: str,
    tmp_path: Path,
    lone_worker: components.Component,
    nats_server: natsserver.NatsServer,
    point: str,
) -> None:
    killed = POINTS[point]
    assert model_asked(stack_, killed.scenario, 0) == 0  # each scenario runs once per session
    server = start_run(stack_, test_namespace, tmp_path, point, killed.goal, list(killed.tools))
    try:
        uid = stack_.kubectl(
            "get", "agentrun", point, "-n", test_namespace, "-o", "jsonpath={.metadata.uid}"
        ).stdout
        wait_for_point(point, stack_, nats_url=nats_server, uid=uid, server=server)
        assert sum(server.counts().values()) == killed.counted_at_kill
        components.kill_component(lone_worker)
        stack_.restart_dead()
        run = stack_.wait_terminal(test_namespace, point, timeout=40 + ACK_WAIT)
        assert run["terminalReason"] == killed.reason, run
        if killed.reason == "completed":
            assert run["answer"] == "written once"
        else:
            assert "ledger__count_slow (w" in run["message"], run
            assert "was sent before its worker stopped" in run["message"], run
            time.sleep(1.0)
        assert server.counts() == {"once": 1}  # exactly once (at most once for effect_unknown)
        # a redone turn asks the model again only while nothing was committed
        assert model_asked(stack_, killed.scenario, 0) == killed.decided
    finally:
        server.stop()
