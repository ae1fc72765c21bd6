"""Version skew during a rolling upgrade: this operator drives workers of the previous revision.

The supported skew (docs/operations.md "Upgrades and version skew") is operator N with workers
N-1: the operator is upgraded first, then the workers. Here the previous revision's code
(``previous_support.PREVIOUS``, built from this repository's history into a directory of its
own and put first on the worker's ``PYTHONPATH``) is the only worker; the operator is this
tree's. Runs with tool calls over three turns and with a held call approved by a person
complete as they do on one revision, and the old worker's turn events are the old schema's
(no ``schemaVersion``), read by this operator as version 1. The runs' tenant is one of the
test's own, its ledger on the release's default layout (one value), which is what the
previous release reads. ``tests/cluster/test_helm_install.py`` does the same on the node with
two images and ``helm upgrade``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from previous_support import install_previous

from agentrun import protocol
from agentrun.bus import Bus, BusSettings
from agentrun.ledger import codec
from agentrun.ledger.store import book_key
from agentrun_dev import components, stack

from .conftest import E2EStack, run_manifest, wait_consuming
from .test_ledger_layouts import forget, ledger_keys, new_tenant

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def previous_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The previous revision's ``agentrun`` package, installed into a directory of its own."""
    return install_previous(tmp_path_factory.mktemp("previous"))


@pytest.fixture
def old_worker(stack_: E2EStack, previous_site: Path) -> Iterator[components.Component]:
    """The only worker, running the previous revision's code."""
    for worker in stack_.workers:
        components.stop_component(worker)
    old = stack.start_worker(
        11, env={**stack_.env, "PYTHONPATH": str(previous_site)}, launch=stack_.launch
    )
    try:
        wait_consuming(old)
        yield old
    finally:
        components.stop_component(old)
        stack_.restart_dead()


@pytest.fixture
def skew_namespace(stack_: E2EStack) -> Iterator[str]:
    """A namespace with an AgentTenant of its own, its ledger made by this operator on the
    release's default layout (one value), as every tenant's is during a rollout: the previous
    release's workers read only that layout. (The package's shared default tenant may have
    been split by an earlier test that ran the operator with ``split``.)"""
    namespace = new_tenant(stack_, "skew-")
    try:
        yield namespace
    finally:
        forget(stack_, namespace)


def raw_events(server: Any, namespace: str, name: str) -> list[dict[str, Any]]:
    """The run's events as stored: decoded JSON, not read through this release's codec."""

    async def read() -> list[dict[str, Any]]:
        bus = await Bus.connect(BusSettings(url=server.url, auth=server.auth()), name="e2e-raw")
        found, seq = [], 1
        try:
            while True:
                try:
                    raw = await bus.js._jsm.get_msg(
                        protocol.STREAM_EVENTS, seq=seq, next=True, direct=True,
                        subject=protocol.event_subject(namespace, name),
                    )  # fmt: skip
                except Exception:
                    return found
                assert raw.data is not None and raw.seq is not None
                found.append(json.loads(raw.data))
                seq = int(raw.seq) + 1
        finally:
            await bus.close()

    return asyncio.run(read())


def turn_queue(server: Any) -> dict[str, Any]:
    """The workers' consumer's counts: what waits, what is in flight, what was redelivered."""

    async def read() -> dict[str, Any]:
        bus = await Bus.connect(BusSettings(url=server.url, auth=server.auth()), name="e2e-raw")
        try:
            info = await bus.js._jsm.consumer_info(protocol.STREAM_TURNS, protocol.WORKERS_CONSUMER)
        finally:
            await bus.close()
        return {
            "pending": info.num_pending,
            "ack_pending": info.num_ack_pending,
            "redelivered": info.num_redelivered,
            "waiting_pulls": info.num_waiting,
        }

    return asyncio.run(read())


@contextlib.contextmanager
def explained(stack_: E2EStack, old: components.Component, server: Any) -> Iterator[None]:
    """A run that did not get there fails with what explains it: the turn queue's counts and
    the tails of the old worker's and the operator's logs."""
    try:
        yield
    except AssertionError as err:
        tails = {
            c.spec.name: c.spec.log_path.read_text(errors="replace").splitlines()[-40:]
            for c in (old, stack_.operator)
        }
        detail = "\n".join(f"--- {name}\n" + "\n".join(lines) for name, lines in tails.items())
        raise AssertionError(f"{err}\nturn queue: {turn_queue(server)}\n{detail}") from err


def test_this_operator_drives_a_worker_of_the_previous_revision(
    stack_: E2EStack,
    skew_namespace: str,
    previous_site: Path,
    old_worker: components.Component,
    nats_server: Any,
) -> None:
    # the old code really runs: its protocol package predates the schema version
    script = "import agentrun.protocol as p; print(hasattr(p, 'SCHEMA_VERSION'))"
    probe = subprocess.run(
        [sys.executable, "-c", script],
        env={"PYTHONPATH": str(previous_site)}, cwd="/",
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert probe.stdout.strip() == "False"
    with explained(stack_, old_worker, nats_server):
        drive_both(stack_, skew_namespace, nats_server)
    book = ledger_keys(nats_server, skew_namespace)[book_key(skew_namespace)]
    assert codec.is_one_value(book)  # the layout the previous release reads


def drive_both(stack_: E2EStack, namespace: str, nats_server: Any) -> None:
    """A run with tool calls and one with an approved call, both completed by the old worker,
    their turn events written in the old schema."""
    stack_.apply(namespace, run_manifest("skew-tools", "E2E-SHARED skew"))
    stack_.apply(namespace, run_manifest("skew-approval", "E2E-APPROVAL skew-approval",
                                         approval={"tools": ["calculate"]}))  # fmt: skip
    stack_.wait_for(namespace, "skew-approval", lambda s: s.get("phase") == "AwaitingApproval")
    digest = stack_.get(namespace, "skew-approval")["status"]["pendingApproval"]["digest"]
    approve = subprocess.run(
        [str(Path(sys.executable).with_name("agentrun")), "approve", "skew-approval", "--digest",
         digest, "-n", namespace],
        env={**stack_.kubectl.env}, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert approve.returncode == 0, approve.stderr
    ends = {
        name: stack_.wait_terminal(namespace, name, timeout=60)
        for name in ("skew-tools", "skew-approval")
    }
    assert (ends["skew-tools"]["terminalReason"], ends["skew-tools"]["answer"]) == (
        "completed",
        "shared done",
    )
    assert (ends["skew-approval"]["terminalReason"], ends["skew-approval"]["answer"]) == (
        "completed",
        "Reviewed and done.",
    )
    for name in ends:
        events = raw_events(nats_server, namespace, name)
        written_by = {e["kind"]: "schemaVersion" in e for e in events}
        assert written_by["admitted"] is True  # this operator writes the version
        assert written_by["turn"] is False  # the old worker does not: read as version 1
