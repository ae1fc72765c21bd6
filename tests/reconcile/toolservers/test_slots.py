"""Discovery: one namespace's or one tenant's hanging servers hold its own share of the slots,
never every slot; a status the API server refuses is replaced by a failed one, logged once."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

import pytest
from kube_support import FakeKube

from agentrun.operator.platform.kubeapi import ApiError
from agentrun.operator.tenants.registry import Tenants
from agentrun.operator.toolservers import refresher
from agentrun.operator.toolservers.refresher import DiscoverySlots
from agentrun.operator.toolservers.spec import TOOL_SERVERS
from agentrun.operator.toolservers.store import ToolServerCache
from agentrun.protocol import UrlRule
from agentrun.tools import remote


async def hold(
    slots: DiscoverySlots,
    namespace: str,
    release: asyncio.Event,
    held: list[str],
    tenant: str | None = None,
) -> None:
    """Hold a discovery's slots as the refresher does: its namespace's, then its tenant's
    (``tenant``; the namespace's own name by default) and one of all."""
    async with slots.of_namespace(namespace), slots.of_tenant(tenant or namespace):
        held.append(namespace)
        await release.wait()


async def test_sixteen_hanging_discoveries_of_one_namespace_leave_slots_for_another() -> None:
    slots = DiscoverySlots(16, per_namespace=4)
    release, held = asyncio.Event(), []
    hanging = [asyncio.create_task(hold(slots, "a", release, held)) for _ in range(16)]
    await asyncio.sleep(0.01)
    assert held == ["a"] * 4 and slots.users("a") == 16  # 12 wait for a's own slots
    async with asyncio.timeout(1):  # b is not behind a's twelve
        async with slots.of_namespace("b"), slots.of_tenant("b"):
            assert slots.users("b") == 1
    assert slots.users("b") == 0  # forgotten once nobody holds or waits
    release.set()
    await asyncio.gather(*hanging)
    assert held == ["a"] * 16 and slots.users("a") == 0


async def test_the_total_bounds_every_namespace_together() -> None:
    slots = DiscoverySlots(4, per_namespace=2)
    release, held = asyncio.Event(), []
    tasks = [asyncio.create_task(hold(slots, ns, release, held)) for ns in "aabbcc"]
    await asyncio.sleep(0.01)
    assert len(held) == 4 and held.count("c") == 0  # c waits for a shared slot, first in line
    release.set()
    await asyncio.gather(*tasks)
    assert sorted(held) == sorted("aabbcc")


async def test_a_cancelled_waiter_gives_its_place_back() -> None:
    slots = DiscoverySlots(1, per_namespace=1)
    release, held = asyncio.Event(), []
    first = asyncio.create_task(hold(slots, "a", release, held))
    await asyncio.sleep(0.01)
    waiting = asyncio.create_task(hold(slots, "a", release, held))
    await asyncio.sleep(0.01)
    waiting.cancel()
    await asyncio.gather(waiting, return_exceptions=True)
    assert slots.users("a") == 1
    release.set()
    await first
    assert slots.users("a") == 0


def test_a_share_above_the_total_is_refused() -> None:
    with pytest.raises(ValueError, match="per_namespace"):
        DiscoverySlots(4, per_namespace=5)
    with pytest.raises(ValueError, match="per_tenant"):
        DiscoverySlots(4, per_namespace=2, per_tenant=5)
    with pytest.raises(ValueError, match="per_tenant"):
        DiscoverySlots(4, per_namespace=3, per_tenant=2)


SERVER = {
    "metadata": {"name": "big", "namespace": "ns", "generation": 1},
    "spec": {"url": "http://127.0.0.1:1/mcp", "tools": [{"name": "add"}]},
}


async def allow_the_server(namespace: str) -> tuple[str, tuple[UrlRule, ...]]:
    """The namespace's tenant and its ``spec.toolServers.allow``: the server's loopback URL."""
    return "t", (UrlRule("127.0.0.1:1", "/", private_network=True),)


async def discovered_huge(endpoint: object) -> list[remote.Discovered]:
    schema = {"type": "object", "description": "x" * 100_000}
    return [remote.Discovered("add", "adds", schema)]


async def test_a_status_the_api_server_refuses_is_replaced_by_a_failed_one_logged_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(refresher.remote, "discover", discovered_huge)
    api = FakeKube()
    api.put(TOOL_SERVERS, SERVER)
    watcher = refresher.ToolServerRefresher(api, reach=allow_the_server)
    with caplog.at_level(logging.INFO, logger="agentrun.operator.toolservers.refresher"):
        for _ in range(3):  # each refresh: the discovered list refused, the failure written
            api.fail("patch_status", 413, "Request Entity Too Large")
            await watcher.refresh(SERVER)
    stored = api.find(TOOL_SERVERS, "big", "ns")
    assert stored is not None
    (ready,) = stored["status"]["conditions"]
    assert (ready["status"], ready["reason"]) == ("False", "DiscoveryFailed")
    assert "could not be written to the status (HTTP 413" in ready["message"]
    assert stored["status"]["tools"] == []
    assert len([r for r in caplog.records if "HTTP 413" in r.getMessage()]) == 1


@pytest.mark.parametrize(
    ("ready", "reads"), [("True", 1), ("False", 3)], ids=["ready", "refused-or-failed"]
)
async def test_admission_reuses_a_ready_server_read_and_rereads_one_not_ready(
    ready: str, reads: int
) -> None:
    """A ready server is read once per burst; one not ready (refused, failed) is read again each
    time, so a run is never refused on a copy older than the rule that now allows it."""
    api = FakeKube()
    status = {"conditions": [{"type": "Ready", "status": ready, "reason": "x", "message": "m"}]}
    api.put(TOOL_SERVERS, {**SERVER, "status": status})
    cache = ToolServerCache(api, clock=lambda: 0.0)
    for _ in range(3):
        assert await cache.get("ns", "big") is not None
    assert [verb for verb, _ in api.calls].count("get") == reads


@contextlib.asynccontextmanager
async def silent_server() -> AsyncIterator[tuple[asyncio.Server, int]]:
    """A TCP server that accepts and never answers; every connection it accepted is closed at
    the end (a transport left to the garbage collector warns in whichever test it runs)."""
    accepted: list[asyncio.StreamWriter] = []

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    try:
        yield server, server.sockets[0].getsockname()[1]
    finally:
        server.close()
        for writer in accepted:
            writer.close()
        await server.wait_closed()


async def test_a_discovery_asking_longer_than_the_platforms_most_is_clamped() -> None:
    """A tenant's ``spec.timeouts.discovery: 20s`` on a server that accepts and never
    answers holds a shared discovery slot only ``max_timeout``; the failure says so."""
    async with silent_server() as (_, port):
        await clamped(port)


async def clamped(port: int) -> None:
    server = {
        "metadata": {"name": "slow", "namespace": "ns", "generation": 1},
        "spec": {
            "url": f"http://127.0.0.1:{port}/mcp",
            "tools": [{"name": "add"}],
            "timeouts": {"discovery": "20s"},
        },
    }

    async def allow(namespace: str) -> tuple[str, tuple[UrlRule, ...]]:
        return "t", (UrlRule(f"127.0.0.1:{port}", "/", private_network=True),)

    api = FakeKube()
    api.put(TOOL_SERVERS, server)
    watcher = refresher.ToolServerRefresher(api, reach=allow, max_timeout=0.5)
    async with asyncio.timeout(5):
        await watcher.refresh(server)
    stored = api.find(TOOL_SERVERS, "slow", "ns")
    assert stored is not None
    (ready,) = stored["status"]["conditions"]
    assert (ready["status"], ready["reason"]) == ("False", "DiscoveryFailed")
    assert "clamped" in ready["message"]


async def test_a_tenants_hanging_servers_over_many_namespaces_hold_its_share() -> None:
    """Sixteen servers that never answer, spread over four namespaces of one tenant, hold the
    tenant's eight slots, not sixteen; another tenant's server, and a namespace counted on its
    own, are discovered at once beside them."""
    async with silent_server() as (silent, port):
        await tenant_share(silent, port)


async def tenant_share(silent: asyncio.Server, port: int) -> None:
    tenant_of = {f"big-{i}": "big" for i in range(4)} | {"small": "small", "free": "free"}

    async def allow(namespace: str) -> tuple[str, tuple[UrlRule, ...]]:
        return tenant_of[namespace], (UrlRule(f"127.0.0.1:{port}", "/", private_network=True),)

    def server(namespace: str, name: str) -> dict[str, object]:
        spec = {"url": f"http://127.0.0.1:{port}/mcp", "tools": [{"name": "add"}]}
        return {"metadata": {"name": name, "namespace": namespace, "generation": 1}, "spec": spec}

    api = FakeKube()
    slots = DiscoverySlots(16, per_namespace=4, per_tenant=8)
    watcher = refresher.ToolServerRefresher(api, reach=allow, slots=slots, max_timeout=3.0)
    hanging = [server(f"big-{i % 4}", f"s{i}") for i in range(16)]
    for body in hanging:
        api.put(TOOL_SERVERS, body)
    tasks = [asyncio.create_task(watcher.refresh(body)) for body in hanging]
    await asyncio.sleep(0.2)
    assert slots.tenant_users("big") == 16 and slots.users("big-0") == 4  # eight hold them
    assert [slots.users(f"big-{i}") for i in range(4)] == [4, 4, 4, 4]
    silent.close()  # the others' servers now refuse at once: no wait for a slot either
    for namespace in ("small", "free"):
        quick = server(namespace, "quick")
        api.put(TOOL_SERVERS, quick)
        async with asyncio.timeout(2.0):
            await watcher.refresh(quick)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    assert slots.tenant_users("big") == 0


async def test_a_tenant_read_that_fails_lets_no_discovery_past_the_tenants_share() -> None:
    """Reading the namespaces' tenant fails for a while (HTTP 503): their servers are not
    contacted meanwhile (``DiscoveryFailed`` naming the read), and once it reads they are
    discovered within that tenant's share: the one read gives both the URL rules and the
    share, so no discovery runs outside its tenant's share, whichever read fails."""
    async with silent_server() as (_, port):
        failing = {"left": 16}

        async def flaky(namespace: str) -> tuple[str, tuple[UrlRule, ...]]:
            if failing["left"] > 0:
                failing["left"] -= 1
                raise ApiError(503, "Service Unavailable")
            return "big", (UrlRule(f"127.0.0.1:{port}", "/", private_network=True),)

        api = FakeKube()
        slots = DiscoverySlots(16, per_namespace=4, per_tenant=8)
        watcher = refresher.ToolServerRefresher(api, reach=flaky, slots=slots, max_timeout=3.0)
        servers = [
            {
                "metadata": {"name": f"s{i}", "namespace": f"big-{i % 4}", "generation": 1},
                "spec": {"url": f"http://127.0.0.1:{port}/mcp", "tools": [{"name": "add"}]},
            }
            for i in range(16)
        ]
        for body in servers:
            api.put(TOOL_SERVERS, body)
        async with asyncio.timeout(2.0):  # not contacted: no wait for the silent server
            await asyncio.gather(*(watcher.refresh(body) for body in servers))
        stored = api.find(TOOL_SERVERS, "s0", "big-0")
        assert stored is not None
        (ready,) = stored["status"]["conditions"]
        assert (
            ready["reason"] == "DiscoveryFailed" and "cannot be read: HTTP 503" in ready["message"]
        )
        tasks = [asyncio.create_task(watcher.refresh(body)) for body in servers]
        await asyncio.sleep(0.2)
        held = sum(slots.users(f"big-{i}") for i in range(4))
        assert held == 16 and slots.tenant_users("big") == 16  # 8 hold, 8 wait: its share
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def test_a_tenants_share_bounds_its_namespaces_together() -> None:
    slots = DiscoverySlots(16, per_namespace=4, per_tenant=8)
    release, held = asyncio.Event(), []
    tasks = [asyncio.create_task(hold(slots, f"t{i % 4}", release, held, "t")) for i in range(16)]
    tasks += [asyncio.create_task(hold(slots, f"d{i % 2}", release, held)) for i in range(8)]
    await asyncio.sleep(0.01)
    assert sum(ns.startswith("t") for ns in held) == 8  # the tenant's share
    assert sum(ns.startswith("d") for ns in held) == 8  # each namespace on its own: 4 + 4
    release.set()
    await asyncio.gather(*tasks)
    assert len(held) == 24


@contextlib.asynccontextmanager
async def hold_briefly(slots: DiscoverySlots, namespace: str, tenant: str) -> AsyncIterator[None]:
    async with slots.of_namespace(namespace), slots.of_tenant(tenant):
        yield


@pytest.mark.parametrize("hogs", ["four-default-namespaces", "two-tenants"])
async def test_another_tenants_discovery_is_not_behind_hanging_servers(hogs: str) -> None:
    """One party's four namespaces that fall to the default tenant, or two AgentTenants with
    two namespaces each, put 24 servers that never answer in discovery: the operator's slots
    (as the wiring makes them) still discover another tenant's server at once (and, beside
    two hostile tenants, a default namespace's); the default tenant's namespaces hold its
    share together, no more."""
    tenants = Tenants(FakeKube(), default="fallback")
    tenants.put({"metadata": {"name": "fallback"}, "spec": {}})
    tenants.put({"metadata": {"name": "acme"}, "spec": {"namespaces": ["acme-ns"]}})
    tenants.put({"metadata": {"name": "x"}, "spec": {"namespaces": ["x0", "x1"]}})
    tenants.put({"metadata": {"name": "y"}, "spec": {"namespaces": ["y0", "y1"]}})
    namespaces = ["x0", "x1", "y0", "y1"] if hogs == "two-tenants" else ["p0", "p1", "p2", "p3"]
    slots = DiscoverySlots.standard()
    release, held = asyncio.Event(), []
    tenant = {ns: (await tenants.tool_server_rules(ns))[0] for ns in [*namespaces, "acme-ns", "p9"]}
    hanging = [
        asyncio.create_task(hold(slots, ns, release, held, tenant[ns]))
        for ns in (namespaces[i % 4] for i in range(24))
    ]
    await asyncio.sleep(0.05)
    try:
        for other in ("acme-ns", "p9") if hogs == "two-tenants" else ("acme-ns",):
            async with asyncio.timeout(1.0), hold_briefly(slots, other, tenant[other]):
                pass
        if hogs != "two-tenants":
            assert len(held) == refresher.PER_TENANT  # the default tenant's share, no more
    finally:
        release.set()
        await asyncio.gather(*hanging)
