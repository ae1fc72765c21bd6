"""The AgentTenant handler pumps a changed tenant's queue, and every queue when a binding
moved (made, deleted, its namespaces edited): runs queued elsewhere may belong to it now, or
runs queued in it to another tenant (``admission.rebinding``). A budget edit moves nothing."""

from __future__ import annotations

import types
from typing import Any

from kube_support import FakeKube

from agentrun.operator.admission.queue import QueueBoard
from agentrun.operator.handlers import tenants as handlers
from agentrun.operator.tenants import Tenants


def tenant(name: str, namespaces: list[str], tokens: int = 1000) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "generation": 1},
        "spec": {"namespaces": namespaces, "budget": {"tokens": tokens}},
    }


async def kicked_by(
    event: str, body: dict[str, Any], known: Tenants, board: QueueBoard
) -> set[str]:
    """The tenants whose queues the handler asks to pump for ``event`` of ``body``."""
    parts = types.SimpleNamespace(tenants=known, board=board)
    memo: Any = types.SimpleNamespace(running=lambda: types.SimpleNamespace(tenants=parts))
    name = body["metadata"]["name"]
    await handlers.tenant_changed(type=event, body=body, name=name, memo=memo)
    return await board.take_kicks() if board._wake.is_set() else set()


async def test_a_binding_change_pumps_every_queue_and_a_budget_edit_only_its_tenants() -> None:
    known, board = Tenants(FakeKube()), QueueBoard()  # type: ignore[arg-type]
    for name in ("a", "b"):
        known.put(tenant(name, [f"ns-{name}"]))
        board.record_pass(name, waiting=1, blocked=None)
    assert await kicked_by("MODIFIED", tenant("a", ["ns-a"], tokens=5), known, board) == {"a"}
    assert await kicked_by("MODIFIED", tenant("a", ["ns-a", "ns-x"]), known, board) == {"a", "b"}
    assert await kicked_by("ADDED", tenant("c", ["ns-c"]), known, board) == {"a", "b", "c"}
    assert await kicked_by("DELETED", tenant("a", ["ns-a"]), known, board) == {"a", "b"}
