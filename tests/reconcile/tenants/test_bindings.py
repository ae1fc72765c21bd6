"""``Tenants.bindings`` counts every change of which namespaces the AgentTenants bind — a
tenant made, deleted, its namespaces or selector edited, a namespace found relabelled by a
resolve — and nothing else, so the queue pump looks at its queued runs' namespaces again
exactly then (``admission.rebinding``)."""

from __future__ import annotations

from typing import Any

from kube_support import FakeKube

from agentrun.operator.tenants import Tenants


def tenant(name: str, tokens: int = 1000, **binding: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "generation": 1},
        "spec": {**binding, "budget": {"tokens": tokens}},
    }


def selecting(name: str, team: str) -> dict[str, Any]:
    return tenant(name, namespaceSelector={"matchLabels": {"team": team}})


async def test_binding_changes_are_counted_and_a_budget_edit_or_a_status_is_not() -> None:
    known = Tenants(FakeKube())  # type: ignore[arg-type]
    counts = [known.bindings]
    known.put(tenant("a", namespaces=["ns"]))
    counts.append(known.bindings)
    known.put(tenant("a", tokens=5, namespaces=["ns"]))  # its budget only
    counts.append(known.bindings)
    known.put(tenant("a", namespaces=["ns", "other"]))
    counts.append(known.bindings)
    known.remove("a")
    counts.append(known.bindings)
    assert counts == [0, 1, 1, 2, 3]


async def test_a_relabel_a_resolve_meets_counts_as_a_binding_change() -> None:
    api = FakeKube()
    known = Tenants(api)  # type: ignore[arg-type]
    known.put(selecting("a", "a"))
    known.put(selecting("b", "b"))
    api.labels["ns"] = {"team": "a"}
    assert (await known.resolve("ns")).name == "a"
    before = known.bindings
    assert (await known.resolve("ns")).name == "a"
    assert known.bindings == before  # the same tenant again: nothing moved
    api.labels["ns"] = {"team": "b"}
    assert (await known.resolve("ns")).name == "b"
    assert known.bindings == before + 1
    assert known.party("ns") == "tenant/b"
