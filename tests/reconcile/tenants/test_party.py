"""Whose share a namespace's objects take (``Tenants.party``) before any run of theirs was
admitted: an AgentTenant's namespaces shared out the AgentEval reconciles, the CronAgentRuns'
turns, the check threads and the Events each on its own until one of its runs was resolved,
so a tenant whose suites fail their (costly) check, and so create no run, had a share for
each namespace. A namespace listed by name is its tenant's at once; one selected by label is
once its AgentEval or CronAgentRun handler has learnt it (``Tenants.learn``)."""

from __future__ import annotations

from typing import Any

from kube_support import FakeKube

from agentrun.operator.tenants.registry import Tenants


def tenant(name: str, **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "generation": 1}, "spec": spec}


def test_a_namespace_listed_by_name_is_its_tenants_share_before_any_run() -> None:
    tenants = Tenants(FakeKube())
    tenants.put(tenant("a", namespaces=["a-0", "a-1"]))
    tenants.put(tenant("b", namespaces=["b"]))
    assert [tenants.party(ns) for ns in ("a-0", "a-1", "b")] == ["tenant/a", "tenant/a", "tenant/b"]
    assert tenants.party("unbound") == "unbound"


def test_a_namespace_several_list_or_the_default_tenant_takes_is_its_own_share() -> None:
    tenants = Tenants(FakeKube(), default="shared")
    tenants.put(tenant("a", namespaces=["both"]))
    tenants.put(tenant("c", namespaces=["both"]))
    tenants.put(tenant("shared", namespaces=["listed-by-default"]))
    assert tenants.party("both") == "both"
    assert tenants.party("listed-by-default") == "listed-by-default"


async def test_a_namespace_selected_by_label_is_its_tenants_share_once_learnt() -> None:
    api = FakeKube()
    api.labels["s-0"] = {"team": "s"}
    tenants = Tenants(api)
    tenants.put(tenant("s", namespaceSelector={"matchLabels": {"team": "s"}}))
    assert tenants.party("s-0") == "s-0"  # its labels not read yet
    await tenants.learn("s-0")
    await tenants.learn("nobodys")  # bound by none: no error, its own share
    assert (tenants.party("s-0"), tenants.party("nobodys")) == ("tenant/s", "nobodys")
    await tenants.learn("s-0")
    assert [what for verb, what in api.calls if verb == "namespace_labels"] == ["s-0", "nobodys"]


async def test_a_namespace_moved_to_another_tenant_takes_the_new_ones_share() -> None:
    """Namespace "moving" was resolved to tenant A; A's spec drops it and B's lists it. Its
    objects kept taking A's share (beside A's other namespaces), and ``learn`` never resolved
    it again (resolved before), until one of its runs was admitted; a tenant deleted kept its
    namespaces' share the same way. A changed or deleted tenant's resolutions are forgotten."""
    api = FakeKube()
    api.labels["labelled"] = {"team": "a"}
    tenants = Tenants(api)
    tenants.put(tenant("a", namespaces=["moving", "staying"]))
    tenants.put(tenant("b", namespaces=["b"]))
    await tenants.learn("moving")
    assert tenants.party("moving") == "tenant/a"
    tenants.put(tenant("a", namespaces=["staying"]))
    tenants.put(tenant("b", namespaces=["b", "moving"]))
    assert tenants.party("moving") == "tenant/b"
    tenants.put(tenant("s", namespaceSelector={"matchLabels": {"team": "a"}}))
    await tenants.learn("labelled")
    assert tenants.party("labelled") == "tenant/s"
    tenants.put(tenant("s", namespaceSelector={"matchLabels": {"team": "a"}}))  # status only
    assert tenants.party("labelled") == "tenant/s"  # an unchanged spec forgets nothing
    tenants.remove("s")
    assert tenants.party("labelled") == "labelled"


async def test_a_namespace_no_tenant_binds_is_read_once_not_at_each_event() -> None:
    """Each AgentEval or CronAgentRun event of a namespace no tenant binds (its own status
    writes among them) read its labels again: 100 events, 100 GETs of the Namespace. It is
    read once, and again after an AgentTenant's binding changed (it may bind it now)."""
    api = FakeKube()
    api.labels["nobodys"] = {"team": "n"}
    tenants = Tenants(api)
    tenants.put(tenant("s", namespaceSelector={"matchLabels": {"team": "s"}}))
    for _ in range(100):
        await tenants.learn("nobodys")
    assert [what for verb, what in api.calls if verb == "namespace_labels"] == ["nobodys"]
    tenants.put(tenant("n", namespaceSelector={"matchLabels": {"team": "n"}}))
    await tenants.learn("nobodys")
    assert tenants.party("nobodys") == "tenant/n"


class CountedPolicies(dict[str, Any]):
    """The tenants' policies, counting the looks over all of them."""

    looks = 0

    def values(self) -> Any:
        CountedPolicies.looks += 1
        return super().values()


def test_party_of_a_namespace_not_resolved_does_not_look_over_every_tenant() -> None:
    """Each ``party`` of a namespace not resolved yet (every one after a start, asked once a
    namespace by every status-write pass) looked over every AgentTenant: 2,000 namespaces of
    2,000 tenants, 4,000,000 membership tests a pass. The namespaces listed by name are indexed
    once after a binding changed."""
    tenants = Tenants(FakeKube())
    for n in range(2000):
        tenants.put(tenant(f"t{n}", namespaces=[f"ns-{n}"]))
    tenants.policies = CountedPolicies(tenants.policies)
    CountedPolicies.looks = 0
    for _ in range(3):  # three passes
        parties = [tenants.party(f"ns-{n}") for n in range(2000)]
        assert parties == [f"tenant/t{n}" for n in range(2000)]
    assert CountedPolicies.looks <= 1, f"{CountedPolicies.looks} looks over 2,000 tenants"
    tenants.put(tenant("t0", namespaces=["ns-0", "elsewhere"]))
    assert tenants.party("elsewhere") == "tenant/t0"
