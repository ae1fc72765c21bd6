"""Whose share a namespace's trajectory reads take: the AgentTenant binding it (by the
operator's rule, ``agentrun.tenancy``), else the namespace itself; the AgentTenants listed then
watched, a namespace's labels read only while some tenant selects by label."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import Any

import aiohttp

from agentrun import tenancy
from agentrun.trajectoryapi import tenants


def tenant(name: str, **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": spec}


class FakeSource:
    def __init__(self, *listed: Mapping[str, Any], labels: Mapping[str, Mapping[str, str]]) -> None:
        self.listed = list(listed)
        self.labels = labels
        self.events: asyncio.Queue[tuple[str, Mapping[str, Any]]] = asyncio.Queue()
        self.label_reads = 0
        self.fail_labels = False

    async def list_tenants(self) -> tuple[list[Mapping[str, Any]], str]:
        return self.listed, "7"

    async def watch_tenants(self, since: str) -> AsyncIterator[tuple[str, Mapping[str, Any]]]:
        assert since == "7"
        while True:
            yield await self.events.get()

    async def namespace_labels(self, namespace: str) -> Mapping[str, str]:
        self.label_reads += 1
        if self.fail_labels:
            raise aiohttp.ClientConnectionError("refused")
        return self.labels.get(namespace, {})


async def test_a_tenants_namespaces_share_one_party_and_others_are_their_own() -> None:
    source = FakeSource(
        tenant("acme", namespaces=["a-1", "a-2"]),
        tenant("labelled", namespaceSelector={"matchLabels": {"team": "l"}}),
        labels={"l-1": {"team": "l"}, "both": {"team": "l"}},
    )
    parties = tenants.Parties(source)
    following = asyncio.create_task(parties.follow())
    try:
        await asyncio.sleep(0.01)
        found = {ns: await parties.party(ns) for ns in ("a-1", "a-2", "l-1", "free")}
        assert found == {
            "a-1": "tenant:acme",
            "a-2": "tenant:acme",
            "l-1": "tenant:labelled",
            "free": "namespace:free",
        }
        await parties.party("l-1")
        assert source.label_reads == 4  # each namespace's labels read once, then kept
        source.events.put_nowait(("ADDED", tenant("other", namespaces=["a-1"])))
        source.events.put_nowait(("DELETED", tenant("labelled")))
        await asyncio.sleep(0.01)
        # two tenants list a-1: the operator refuses its runs; here it is its own party
        assert await parties.party("a-1") == "namespace:a-1"
        assert await parties.party("l-1") == "namespace:l-1"
    finally:
        following.cancel()


async def test_labels_that_cannot_be_read_make_the_namespace_its_own_party() -> None:
    source = FakeSource(tenant("l", namespaceSelector={}), labels={})
    parties = tenants.Parties(source)
    parties.put(source.listed[0])
    source.fail_labels = True
    assert await parties.party("x") == "namespace:x"
    source.fail_labels = False
    assert await parties.party("x") == "tenant:l"


async def test_without_a_source_every_namespace_is_its_own_party() -> None:
    assert await tenants.Parties(None).party("x") == "namespace:x"


def test_a_malformed_tenant_binds_only_what_it_reads_well() -> None:
    assert tenancy.Binding.of({"metadata": {"name": "t"}, "spec": {"namespaces": "a"}}) == (
        tenancy.Binding("t", frozenset(), None)
    )
    assert tenancy.Binding.of({"spec": None}) == tenancy.Binding("", frozenset(), None)
