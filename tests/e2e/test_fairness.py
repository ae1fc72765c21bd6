"""Hostile neighbours, driven as users would (kubectl, the scripted model, real MCP servers): a
poison object stops only itself, and one tenant flooding cannot starve another tenant's worker
slots, tool discovery or Kubernetes Events."""

from __future__ import annotations

import contextlib
import json
import selectors
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import mcp_support
import pytest
import yaml

from agentrun_dev import components, stack

from .conftest import E2EStack, apply_all, restart_operator, run_manifest, wait_consuming
from .events import settled_book
from .test_mcp_tools import tool_server, wait_server
from .test_tenants import (  # noqa: F401
    TenantFactory,
    admission_times,
    append_scenario,
    more_namespaces,
    tenants,
)

pytestmark = pytest.mark.e2e

TURN_SECONDS = 3.0
"""How long one turn of a flooding tenant's runs holds a worker slot (the model's latency)."""
SLOTS = 4
"""Worker slots of the lone worker the slot tests run on (``AGENTRUN_WORKER_CONCURRENCY``)."""
CALL_SECONDS = 4.0
"""How long the model takes to answer each run of the platform's default cap test: the
runs applied together must all have reached the model within that (less 0.2 s) for their
calls to be counted at once, so that a tenant reaches its cap; a loaded machine can spread
their admissions, dispatches and reservations over more than the 1.3 s a 1.5 s call left."""
CAP_RUNS = 4
"""Runs each tenant of the platform's default cap test starts at once."""


def slow_scenario(tag: str) -> dict[str, Any]:
    """Two turns of ``TURN_SECONDS`` each (a tool call, then the answer), for goals with
    ``tag``."""
    latency = int(TURN_SECONDS * 1000)
    return {
        "name": f"fair-slow-{tag}",
        "match": {"goal": f"E2E-FAIR-SLOW {tag}"},
        "turns": [
            {
                "tool_calls": [{"name": "calculate", "arguments": {"expression": "1+1"}}],
                "latency_ms": latency,
                "usage": {"prompt_tokens": 20, "completion_tokens": 5},
            },
            {"content": "slow done", "latency_ms": latency},
        ],
    }


def quick_scenario(tag: str, *, seconds: float = 0.0) -> dict[str, Any]:
    """One answer after ``seconds`` (at once by default), for goals with ``tag``."""
    answer: dict[str, Any] = {
        "content": "quick done",
        "usage": {"prompt_tokens": 10, "completion_tokens": 2},
    }
    if seconds:
        answer["latency_ms"] = int(seconds * 1000)
    return {
        "name": f"fair-quick-{tag}",
        "match": {"goal": f"E2E-FAIR-QUICK {tag}"},
        "turns": [answer],
    }


def arrivals(stack_: E2EStack, tag: str) -> list[float]:
    """When the scripted model received each request of a run whose goal holds ``tag``."""
    return sorted(r["time"] for r in stack_.mock_requests() if tag in json.dumps(r["body"]))


def most_at_once(starts: list[float], seconds: float) -> int:
    """The most of the model calls that began at ``starts`` and took ``seconds`` each that were
    in flight at one time: the most that began within any window 0.2 s shorter than a call. A
    call held back until another's turn committed begins ``seconds`` or more after that one,
    so it is never counted with it."""
    return max((sum(1 for t in starts if s <= t < s + seconds - 0.2) for s in starts), default=0)


def wait_until(check: Callable[[], bool], what: str, *, timeout: float) -> None:
    end = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < end, f"{what} did not happen within {timeout}s"
        time.sleep(0.1)


@contextlib.contextmanager
def lone_worker(stack_: E2EStack, *, slots: int) -> Iterator[components.Component]:
    """The stack's workers replaced by one worker with ``slots`` turns at once; the stack's
    own workers come back afterwards."""
    for worker in stack_.workers:
        components.stop_component(worker)
    env = {**stack_.env, "AGENTRUN_WORKER_CONCURRENCY": str(slots)}
    lone = stack.start_worker(9, env=env, launch=stack_.launch)
    try:
        wait_consuming(lone)
        yield lone
    finally:
        components.stop_component(lone)
        stack_.restart_dead()


def delete_runs(stack_: E2EStack, namespace: str) -> None:
    stack_.kubectl("delete", "agentruns", "--all", "-n", namespace, "--wait=false")


# --- a poison object stops only itself -----------------------------------------------------------


def test_a_run_too_large_to_checkpoint_ends_invalid_spec_and_the_next_run_of_its_tenant_runs(
    stack_: E2EStack,
    test_namespace: str,
    tenants: TenantFactory,  # noqa: F811
    nats_server: object,
) -> None:
    """A 1.2 MB ``spec.output.schema`` is stored by the API server, but the run's admitted
    event cannot be: the run ends ``invalid_spec`` naming the field (once, in the log too),
    its slot and budget hold are released, and the tenant's next run — queued behind it with
    ``maxConcurrentRuns: 1`` — is admitted and completes."""
    tenant = tenants(
        f"t-{test_namespace}", [test_namespace], maxConcurrentRuns=1, budget={"tokens": 100_000}
    )
    append_scenario(stack_, quick_scenario(test_namespace))
    big = run_manifest("big", "a large answer", tools=[])
    big["spec"]["output"] = {"schema": {"type": "object", "description": "x" * 1_200_000}}
    # create, not apply: apply would copy the object into an annotation, over its 256 KiB limit
    stack_.kubectl("create", "-n", test_namespace, "-f", "-", input=yaml.safe_dump(big))
    stack_.apply(test_namespace, run_manifest("next", f"E2E-FAIR-QUICK {test_namespace}"))
    status = stack_.wait_terminal(test_namespace, "big", timeout=30)
    assert (status["terminalReason"], status["outcome"]) == ("invalid_spec", "none")
    assert status["message"].startswith("spec.output.schema: "), status["message"]
    after = stack_.wait_terminal(test_namespace, "next", timeout=30)
    assert (after["terminalReason"], after["answer"]) == ("completed", "quick done")
    settled_book(nats_server, tenant)  # type: ignore[arg-type]  # its slot and hold released
    time.sleep(3)  # six ledger sweeps: a failure retried each pass would be logged again
    log = stack_.operator.spec.log_path.read_text(errors="replace").splitlines()
    told = [line for line in log if f"{test_namespace}/big" in line and "bytes" in line]
    assert len(told) == 1, told
    assert not [line for line in log if f"pump of tenant {tenant} failed" in line]


# --- fair shares ---------------------------------------------------------------------------------


def test_a_tenant_flooding_the_worker_slots_makes_another_tenants_turn_wait_one_turn_at_most(
    stack_: E2EStack,
    tenants: TenantFactory,  # noqa: F811
    more_namespaces: Callable[[], str],  # noqa: F811
    nats_server: Any,
) -> None:
    """One worker with 4 slots; tenant A has 24 runs whose turns take 3 s each, so 20 of its
    turns wait at any time. Tenant B's run arrives: its first model call comes within about
    one turn's time (the next slots to free) of its admission, not after A's 20 waiting
    turns (15 s). (Timed from B's ``admitted`` event: the ``kubectl apply`` and the admission
    before it take seconds of their own on a loaded machine, waiting for no slot.)"""
    flood, other = more_namespaces(), more_namespaces()
    tenants(f"a-{flood}", [flood])
    tenants(f"b-{other}", [other])
    append_scenario(stack_, slow_scenario(flood))
    append_scenario(stack_, quick_scenario(other))
    with lone_worker(stack_, slots=SLOTS):
        try:
            apply_all(
                stack_,
                flood,
                [run_manifest(f"a-{i}", f"E2E-FAIR-SLOW {flood}") for i in range(24)],
            )
            wait_until(
                lambda: len(arrivals(stack_, flood)) >= SLOTS, "A filling the slots", timeout=60
            )
            submitted = time.time()
            stack_.apply(other, run_manifest("b", f"E2E-FAIR-QUICK {other}"))
            stack_.wait_terminal(other, "b", timeout=60)
            (first, *_) = arrivals(stack_, other)
            admitted = admission_times(nats_server, other, ["b"])["b"]
            waited = first - admitted
            assert waited < 2 * TURN_SECONDS, f"B's first model call came {waited:.1f}s after it"
            assert first - submitted < 5 * TURN_SECONDS, (
                f"B applied {first - submitted:.1f}s before"
            )
        finally:
            delete_runs(stack_, flood)


def test_max_concurrent_turns_caps_a_tenants_turns_in_flight_and_leaves_slots_to_others(
    stack_: E2EStack,
    tenants: TenantFactory,  # noqa: F811
    more_namespaces: Callable[[], str],  # noqa: F811
    nats_server: Any,
) -> None:
    """Tenant A with ``maxConcurrentTurns: 2`` and 8 slow runs on a 4-slot worker never has
    more than 2 model calls in flight; tenant B's run finds a free slot at once (timed from
    its ``admitted`` event, as in the flood test)."""
    capped, other = more_namespaces(), more_namespaces()
    tenants(f"a-{capped}", [capped], maxConcurrentTurns=2)
    tenants(f"b-{other}", [other])
    append_scenario(stack_, slow_scenario(capped))
    append_scenario(stack_, quick_scenario(other))
    with lone_worker(stack_, slots=SLOTS):
        try:
            apply_all(
                stack_,
                capped,
                [run_manifest(f"a-{i}", f"E2E-FAIR-SLOW {capped}") for i in range(8)],
            )
            wait_until(lambda: len(arrivals(stack_, capped)) >= 2, "A's first calls", timeout=60)
            submitted = time.time()
            stack_.apply(other, run_manifest("b", f"E2E-FAIR-QUICK {other}"))
            stack_.wait_terminal(other, "b", timeout=60)
            (first, *_) = arrivals(stack_, other)
            admitted = admission_times(nats_server, other, ["b"])["b"]
            assert first - admitted < TURN_SECONDS, f"B waited {first - admitted:.1f}s"
            assert first - submitted < 5 * TURN_SECONDS, (
                f"B applied {first - submitted:.1f}s before"
            )
            wait_until(lambda: len(arrivals(stack_, capped)) >= 6, "A going on", timeout=60)
            seen = arrivals(stack_, capped)
            assert most_at_once(seen, TURN_SECONDS) <= 2, seen
        finally:
            delete_runs(stack_, capped)


def test_the_platforms_default_max_concurrent_turns_caps_the_tenants_that_set_none(
    stack_: E2EStack,
    tenants: TenantFactory,  # noqa: F811
    more_namespaces: Callable[[], str],  # noqa: F811
) -> None:
    """The operator started with ``AGENTRUN_DEFAULT_MAX_CONCURRENT_TURNS=2``: tenant A, which
    sets no ``maxConcurrentTurns``, has 2 model calls of its 4 runs in flight at most, and
    reaches 2; tenant B, with ``maxConcurrentTurns: 3``, keeps its own 3. Started with ``0``:
    a tenant that sets none has all 4 of its calls in flight at once."""
    setting = "AGENTRUN_DEFAULT_MAX_CONCURRENT_TURNS"
    try:
        restart_operator(stack_, **{setting: "2"})
        default, own = more_namespaces(), more_namespaces()
        tenants(f"a-{default}", [default])
        tenants(f"b-{own}", [own], maxConcurrentTurns=3)
        assert calls_at_once(stack_, [default, own]) == {default: 2, own: 3}
        restart_operator(stack_, **{setting: "0"})
        uncapped = more_namespaces()
        tenants(f"c-{uncapped}", [uncapped])
        assert calls_at_once(stack_, [uncapped]) == {uncapped: CAP_RUNS}
    finally:
        restart_operator(stack_, **{setting: None})


def calls_at_once(stack_: E2EStack, namespaces: list[str]) -> dict[str, int]:
    """``CAP_RUNS`` runs of one ``CALL_SECONDS`` model call in each of ``namespaces``, applied
    together and completed: the most calls each namespace's runs had in flight at one time."""
    for namespace in namespaces:
        append_scenario(stack_, quick_scenario(namespace, seconds=CALL_SECONDS))
    for namespace in namespaces:
        goal = f"E2E-FAIR-QUICK {namespace}"
        apply_all(stack_, namespace, [run_manifest(f"r-{i}", goal) for i in range(CAP_RUNS)])
    for namespace in namespaces:
        for i in range(CAP_RUNS):
            status = stack_.wait_terminal(namespace, f"r-{i}", timeout=60)
            assert status["terminalReason"] == "completed", status
    return {ns: most_at_once(arrivals(stack_, ns), CALL_SECONDS) for ns in namespaces}


class HangingServer:
    """A TCP listener that accepts connections and never answers: an MCP server that hangs.
    It reads and drops what clients send, and sees when a client gives a connection up."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0), backlog=128)
        self.port = self.sock.getsockname()[1]
        self.accepted: list[socket.socket] = []
        self.before_first_close: int | None = None
        """How many connections were accepted before a client first closed one (its discovery
        timed out, so its slot was free again); ``None`` while none was closed."""
        self._selector = selectors.DefaultSelector()
        self._selector.register(self.sock, selectors.EVENT_READ)
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def _serve(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            while True:
                ready = [key.fileobj for key, _ in self._selector.select()]
                # closes first: a client closes a connection before it opens the next one,
                # and both may be seen in one pass
                for conn in (c for c in ready if c is not self.sock):
                    assert isinstance(conn, socket.socket)
                    try:
                        gone = not conn.recv(65536)
                    except ConnectionError:  # reset: given up too
                        gone = True
                    if gone:
                        self._selector.unregister(conn)
                        if self.before_first_close is None:
                            self.before_first_close = len(self.accepted)
                if self.sock in ready:
                    conn, _ = self.sock.accept()
                    self.accepted.append(conn)
                    self._selector.register(conn, selectors.EVENT_READ)

    def close(self) -> None:
        self.sock.close()
        for conn in self.accepted:
            conn.close()
        self._selector.close()


def test_hanging_tool_servers_in_one_namespace_do_not_starve_discovery_in_another(
    stack_: E2EStack,
    more_namespaces: Callable[[], str],  # noqa: F811
    tmp_path: Path,
) -> None:
    """16 AgentToolServers in one namespace point at a server that accepts and never answers
    (discovery timeout 30 s): another namespace's real MCP server is still discovered at once,
    while the hanging ones hold only their namespace's share of the discovery slots (4)."""
    hostile, other = more_namespaces(), more_namespaces()
    hold_only_their_share(stack_, [hostile], servers=16, share=4, other=other, tmp_path=tmp_path)


def test_hanging_tool_servers_over_one_tenants_namespaces_hold_its_share_only(
    stack_: E2EStack,
    tenants: TenantFactory,  # noqa: F811
    more_namespaces: Callable[[], str],  # noqa: F811
    tmp_path: Path,
) -> None:
    """A tenant bound to four namespaces puts 6 hanging AgentToolServers in each (24, each
    namespace within its own share of 4): together they hold the tenant's 8 discovery slots,
    never all 24, and another tenant's real MCP server is discovered at once."""
    spread = [more_namespaces() for _ in range(4)]
    other = more_namespaces()
    loopback = {"allow": [{"host": "127.0.0.1", "privateNetwork": True}]}
    tenants(f"spread-{spread[0]}", spread, toolServers=loopback)
    tenants(f"other-{other}", [other], toolServers=loopback)
    hold_only_their_share(stack_, spread, servers=24, share=8, other=other, tmp_path=tmp_path)


def hold_only_their_share(
    stack_: E2EStack,
    hostile: list[str],
    *,
    servers: int,
    share: int,
    other: str,
    tmp_path: Path,
) -> None:
    """``servers`` hanging AgentToolServers, spread over the ``hostile`` namespaces (discovery
    timeout 30 s), hold ``share`` discovery slots, no more: no further one started until one
    of them timed out (on a machine slow enough to outlast the 30 s, more come after); a real
    MCP server in ``other`` is discovered at once beside them."""
    hanging = HangingServer()
    try:
        for i in range(servers):
            manifest = tool_server(
                f"hang-{i}", hanging.url, {"name": "add"}, timeouts={"discovery": "30s"}
            )
            stack_.apply(hostile[i % len(hostile)], manifest)
        wait_until(
            lambda: len(hanging.accepted) >= share, "discovery of the hanging servers", timeout=30
        )
        with mcp_support.running(tmp_path) as server:
            started = time.monotonic()
            stack_.apply(other, tool_server("good", server.url, {"name": "add"}))
            status = wait_server(stack_, other, "good", "Discovered", timeout=10)
            assert [t["name"] for t in status["tools"]] == ["add"]
            assert time.monotonic() - started < 10
        held = hanging.before_first_close
        assert (len(hanging.accepted) if held is None else held) <= share, held
    finally:
        for namespace in hostile:
            stack_.kubectl("delete", "agenttoolservers", "--all", "-n", namespace, "--wait=false")
        hanging.close()


def test_a_tenant_flooding_events_from_three_namespaces_leaves_other_tenants_theirs(
    stack_: E2EStack,
    tenants: TenantFactory,  # noqa: F811
    more_namespaces: Callable[[], str],  # noqa: F811
) -> None:
    """150 runs over three namespaces of one tenant fail at once (an unknown AgentModel), each
    with an ``InvalidSpec`` Event; the runs another tenant creates right after still get
    theirs, and the flooding tenant's namespaces together got no more than one share."""
    flood = [more_namespaces() for _ in range(3)]
    other = more_namespaces()
    tenants(f"flood-{flood[0]}", flood)
    tenants(f"other-{other}", [other])
    bad = {"model": "no-such-model", "tools": []}
    started = time.monotonic()
    for n, namespace in enumerate(flood):
        runs = [run_manifest(f"f-{n}-{i}", "flood", **bad) for i in range(50)]
        apply_all(stack_, namespace, runs)
    names = [f"b-{i}" for i in range(3)]
    apply_all(stack_, other, [run_manifest(name, "mine", **bad) for name in names])
    for name in names:
        stack_.wait_terminal(other, name, timeout=60)

    def reasons(namespace: str) -> list[str]:
        listed = json.loads(stack_.kubectl("get", "events", "-n", namespace, "-o", "json").stdout)[
            "items"
        ]
        return [e["involvedObject"]["name"] for e in listed if e["reason"] == "InvalidSpec"]

    wait_until(lambda: sorted(reasons(other)) == names, "B's InvalidSpec Events", timeout=30)
    elapsed = time.monotonic() - started
    flooded = sum(len(reasons(namespace)) for namespace in flood)
    assert flooded <= 25 + 2 * elapsed + 5, f"{flooded} events in {elapsed:.0f}s"
