"""Day-2 budget changes as a platform engineer makes them, with kubectl on a live AgentTenant
whose window has usage: editing ``spec.window``, limits or ``whenExhausted`` never zeroes or
inflates the usage, and RESET follows the rule of ``kubectl explain agenttenant.spec.window``.
And the tenant's usage survives the loss of its ledger book: the operator, restarted, rebuilds
it from the runs charged to the tenant (docs/operations.md)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import nats
import pytest

from agentrun.ledger import LedgerStore
from agentrun.ledger.store import book_key
from agentrun_dev import components, stack
from agentrun_dev.natsserver import NatsServer

from .conftest import E2EStack, run_manifest
from .events import read_book
from .test_tenants import SPEND_TOKENS, conditions, day_tenant, epoch, list_runs, wait_tenant

pytestmark = pytest.mark.e2e

DAY = 86_400.0


@pytest.fixture
def tenant(stack_: E2EStack, test_namespace: str) -> Iterator[str]:
    """An AgentTenant binding ``test_namespace``: 24h windows, 100 000 tokens, runs queue when
    exhausted; read by the operator before the test starts, deleted after it."""
    with day_tenant(stack_, f"t-{test_namespace}", test_namespace, outlive=300) as name:
        yield name


def patch_tenant(stack_: E2EStack, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    """``kubectl patch`` the AgentTenant's spec; returns its status once the operator acted on
    the new generation."""
    stack_.kubectl("patch", "agenttenant", name, "--type=merge", "-p", json.dumps({"spec": spec}))
    generation = json.loads(stack_.kubectl("get", "agenttenant", name, "-o", "json").stdout)[
        "metadata"
    ]["generation"]
    return wait_tenant(stack_, name, lambda s: s.get("observedGeneration") == generation)


def spend(stack_: E2EStack, namespace: str, name: str, *, steps: int) -> int:
    """Run ``steps`` turns of 500 tokens each in ``namespace`` (then its summary call); the
    run's total tokens."""
    stack_.apply(
        namespace,
        run_manifest(name, f"E2E-TENANT-SPEND {namespace}", budget={"maxSteps": steps}),
    )
    status = stack_.wait_terminal(namespace, name, timeout=60)
    total = int(status["usage"]["totalTokens"])
    assert total >= steps * SPEND_TOKENS, status  # and the summary call at maxSteps
    return total


def used_tokens(status: dict[str, Any]) -> int:
    return int(status["budget"]["tokens"]["used"])


def exhausted(status: dict[str, Any]) -> str:
    """The status of the AgentTenant's ``BudgetExhausted`` condition ("" if none yet)."""
    return str(conditions(status).get("BudgetExhausted", {}).get("status", ""))


def test_editing_a_live_tenant_keeps_its_usage_and_its_reset_time(
    stack_: E2EStack, test_namespace: str, tenant: str
) -> None:
    charged = spend(stack_, test_namespace, "spender", steps=4)  # 2000 tokens and a summary
    before = wait_tenant(
        stack_, tenant, lambda s: s.get("activeRuns") == 0 and used_tokens(s) == charged
    )
    midnight = epoch(before["resetTime"])
    assert midnight % DAY == 0 and epoch(before["windowStart"]) == midnight - DAY

    # 24h → 1h: the day's window keeps its usage and its end (it used to restart at once)
    shortened = patch_tenant(stack_, tenant, {"window": "1h"})
    assert (used_tokens(shortened), shortened["resetTime"], shortened["windowStart"]) == (
        charged,
        before["resetTime"],
        before["windowStart"],
    )
    shown = stack_.kubectl("get", "agenttenant", tenant).stdout  # the RESET column
    assert before["resetTime"] in shown, shown

    # a limit below what the window used: exhausted, usage kept; a new run waits
    patch_tenant(stack_, tenant, {"budget": {"tokens": charged - 100}})
    lowered = wait_tenant(stack_, tenant, lambda s: exhausted(s) == "True")
    assert (used_tokens(lowered), lowered["resetTime"]) == (charged, before["resetTime"])
    stack_.apply(test_namespace, run_manifest("waiter", f"E2E-TENANT-SPEND {test_namespace}"))
    stack_.wait_for(test_namespace, "waiter", lambda s: s.get("phase") == "Queued", timeout=20)

    # whenExhausted changes nothing charged
    failing = patch_tenant(stack_, tenant, {"whenExhausted": "Fail"})
    assert (used_tokens(failing), failing["resetTime"]) == (charged, before["resetTime"])
    stack_.kubectl("delete", "agentrun", "waiter", "-n", test_namespace)

    # raised: room at once, in the same window
    raised = patch_tenant(stack_, tenant, {"budget": {"tokens": 100_000}, "whenExhausted": "Queue"})
    assert (used_tokens(raised), raised["resetTime"]) == (charged, before["resetTime"])
    freed = wait_tenant(stack_, tenant, lambda s: exhausted(s) == "False")
    assert used_tokens(freed) == charged
    more = spend(stack_, test_namespace, "after-raise", steps=1)
    after = wait_tenant(
        stack_, tenant, lambda s: s.get("activeRuns") == 0 and used_tokens(s) == charged + more
    )
    assert after["resetTime"] == before["resetTime"]


def delete_book(server: NatsServer, tenant: str) -> None:
    """What losing the ledger does to one tenant: its book is gone (with the operator's
    NATS identity, which may write the bucket)."""

    async def delete() -> None:
        client = await nats.connect(**server.client_options("operator"))
        try:
            store = await LedgerStore.open(client.jetstream(), create=False)
            await store.kv.delete(book_key(tenant))
        finally:
            await client.close()

    asyncio.run(delete())


def test_a_lost_book_is_rebuilt_from_the_runs_when_the_operator_restarts(
    stack_: E2EStack, test_namespace: str, tenant: str, nats_server: NatsServer
) -> None:
    charged = spend(stack_, test_namespace, "first", steps=2) + spend(
        stack_, test_namespace, "second", steps=1
    )
    runs = list_runs(stack_, test_namespace)
    assert sum(int(s["usage"]["totalTokens"]) for s in runs.values()) == charged
    wait_tenant(stack_, tenant, lambda s: s.get("activeRuns") == 0 and used_tokens(s) == charged)

    components.stop_component(stack_.operator)
    delete_book(nats_server, tenant)
    assert read_book(nats_server, tenant) is None
    # the status forgotten too (as after a restore without status): only the runs remain
    stack_.kubectl(
        "patch",
        "agenttenant",
        tenant,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps({"status": {"budget": None, "windowStart": None, "resetTime": None}}),
    )
    stack_.operator = stack.start_operator(stack_.env, launch=stack_.launch)

    status = wait_tenant(
        stack_, tenant, lambda s: used_tokens(s) > 0 if s.get("budget") else False, timeout=60
    )
    assert used_tokens(status) >= charged
    book = read_book(nats_server, tenant)
    assert book is not None and book.used_tokens >= charged
    assert book.used_tokens == charged  # these runs ended in this window: no more, no less
