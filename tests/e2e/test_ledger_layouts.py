"""The ledger's two layouts during and after a rollout (docs/operations.md "Upgrades and version
skew"): with the release's default (``AGENTRUN_LEDGER_LAYOUT=single``) a tenant's ledger is the
one value workers of the previous release read, and stays so; once the operator is set to
``split`` (every worker runs this release), a new tenant's ledger is split from the start and a
one-value tenant is split at its next ledger change, its window's usage kept, its runs going on.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any

import nats
import pytest
from kv_support import live_keys

from agentrun.ledger import codec
from agentrun.ledger.store import BUCKET, book_key
from agentrun_dev.kubectl import create_namespace, delete_namespace

from .conftest import E2EStack, restart_operator, run_manifest
from .test_big_tenant import ledger_sums, set_max_concurrent_runs

pytestmark = pytest.mark.e2e


def ledger_keys(nats_server: Any, tenant: str) -> dict[str, bytes]:
    """The tenant's values in the ledger bucket (its book and its runs' entries), by key."""

    async def read() -> dict[str, bytes]:
        nc = await nats.connect(**nats_server.client_options())
        try:
            kv = await nc.jetstream().key_value(BUCKET)
            found = {}
            for pattern in (book_key(tenant), f"run.{tenant}.>"):
                for name in await live_keys(kv, pattern):
                    found[name] = (await kv.get(name)).value or b""
            return found
        finally:
            await nc.close()

    found: list[dict[str, bytes]] = []
    thread = threading.Thread(target=lambda: found.append(asyncio.run(read())))
    thread.start()
    thread.join(timeout=60)
    return found[0]


def run_to_the_end(stack_: E2EStack, namespace: str, name: str) -> None:
    stack_.apply(namespace, run_manifest(name, f"E2E-ONE-TURN {name}", tools=[]))
    status = stack_.wait_terminal(namespace, name, timeout=120)
    assert status["terminalReason"] == "completed", status


def used_and_sum(stack_: E2EStack, nats_server: Any, namespace: str) -> tuple[int, int]:
    """The tenant's ``used`` tokens as its ledger holds them (either layout), and the sum of
    its runs' own tokens."""
    values = ledger_keys(nats_server, namespace)
    book = codec.decode_totals(values[book_key(namespace)]).book
    listed = stack_.kubectl("get", "agentruns", "-n", namespace, "-o", "json")
    tokens, _ = ledger_sums(json.loads(listed.stdout))
    return book.used_tokens, tokens


def new_tenant(stack_: E2EStack, prefix: str) -> str:
    namespace = create_namespace(stack_.kubectl, prefix=prefix)
    set_max_concurrent_runs(stack_, namespace, namespace, 2)  # the tenant is the namespace
    return namespace


def forget(stack_: E2EStack, *namespaces: str) -> None:
    for namespace in namespaces:
        stack_.kubectl("delete", "agenttenant", namespace, "--ignore-not-found", "--wait=false")
        delete_namespace(stack_.kubectl, namespace)


def test_a_tenant_made_with_the_default_layout_stays_one_value(
    stack_: E2EStack, nats_server: Any
) -> None:
    namespace = new_tenant(stack_, "single-")
    try:
        for name in ("first", "second"):
            run_to_the_end(stack_, namespace, name)
            values = ledger_keys(nats_server, namespace)
            assert list(values) == [book_key(namespace)]  # no run entry of its own
            assert codec.is_one_value(values[book_key(namespace)])  # the previous release's
        used, runs = used_and_sum(stack_, nats_server, namespace)
        assert used == runs > 0
    finally:
        forget(stack_, namespace)


def test_with_split_set_new_tenants_are_split_and_a_one_value_tenant_is_split_keeping_its_usage(
    stack_: E2EStack, nats_server: Any
) -> None:
    single = new_tenant(stack_, "before-split-")
    fresh = ""
    try:
        run_to_the_end(stack_, single, "before")
        assert codec.is_one_value(ledger_keys(nats_server, single)[book_key(single)])
        used_before, _ = used_and_sum(stack_, nats_server, single)
        restart_operator(stack_, AGENTRUN_LEDGER_LAYOUT="split")
        end = time.monotonic() + 60  # the sweep (every 2 s here) changes it: it is split then
        while codec.is_one_value(ledger_keys(nats_server, single)[book_key(single)]):
            assert time.monotonic() < end, "the one-value ledger was not split"
            time.sleep(1)
        assert used_and_sum(stack_, nats_server, single)[0] == used_before  # usage kept
        run_to_the_end(stack_, single, "after")
        used, runs = used_and_sum(stack_, nats_server, single)
        assert used == runs > used_before
        fresh = new_tenant(stack_, "split-")
        run_to_the_end(stack_, fresh, "first")
        assert not codec.is_one_value(ledger_keys(nats_server, fresh)[book_key(fresh)])
        used, runs = used_and_sum(stack_, nats_server, fresh)
        assert used == runs > 0
    finally:
        restart_operator(stack_, AGENTRUN_LEDGER_LAYOUT=None)
        forget(stack_, single, *([fresh] if fresh else []))
