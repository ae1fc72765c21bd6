"""The operator's one way to the API server, against the real kube-apiserver: missing objects
read as ``None``, a second create of a name is refused, deletes and status patches honour their
preconditions (a delete its uid; a status patch its resourceVersion, not its uid: the API
server resets a status patch's metadata before checking it), and refusals arrive as ``ApiError``
with their status.
The fake the unit tests use (``kube_support.FakeKube``) answers the same way, checked here on
the same script."""

from __future__ import annotations

import gc
import json
import weakref
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from kube_support import FakeKube
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from agentrun.operator.platform import kubeapi
from agentrun.operator.platform.kubeapi import ApiError, Kube, KubeApi, Ref

pytestmark = pytest.mark.usefixtures("crds")

Script = Callable[[KubeApi, str], Awaitable[None]]


def agent(name: str, namespace: str, **labels: str) -> dict[str, Any]:
    return {
        "apiVersion": "agentrun.dev/v1alpha1",
        "kind": "Agent",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {"model": "m", "instructions": "i"},
    }


async def the_port_contract(api: KubeApi, ns: str) -> None:
    """What every caller of the port relies on, in one script."""
    ref = Ref("agents", "a", ns)
    assert await api.get(ref) is None
    assert await api.create("agents", agent("a", ns, team="x")) is True
    assert await api.create("agents", agent("a", ns)) is False  # exists: refused, no error
    await api.create("agents", agent("b", ns, team="y"))
    found = await api.get(ref)
    assert found is not None and found["metadata"]["name"] == "a"
    uid, version = found["metadata"]["uid"], found["metadata"]["resourceVersion"]
    listed = await api.list_objects("agents", namespace=ns, label_selector="team=x")
    assert [o["metadata"]["name"] for o in listed] == ["a"]
    team = await api.list_kept(  # what keep returns, none where it returns None
        "agents",
        lambda o: o["metadata"]["labels"]["team"] if o["metadata"]["name"] == "b" else None,
        namespace=ns,
    )
    assert team == ["y"]

    patched = await api.patch_status(ref, {"observedGeneration": 1}, uid=uid, version=version)
    assert patched["status"] == {"observedGeneration": 1}
    with pytest.raises(ApiError) as stale:  # the version moved on with that patch
        await api.patch_status(ref, {"observedGeneration": 2}, uid=uid, version=version)
    assert stale.value.status == 409
    unchecked = await api.patch_status(ref, {"observedGeneration": 2}, uid="not-its-uid")
    assert unchecked["status"] == {"observedGeneration": 2}  # the uid is not a precondition
    assert unchecked["metadata"]["uid"] == uid
    with pytest.raises(ApiError) as gone:
        await api.patch_status(Ref("agents", "nobody", ns), {"observedGeneration": 2})
    assert gone.value.status == 404

    assert await api.patch(ref, {"metadata": {"annotations": {"k": "v"}}}) is True
    again = await api.get(ref)
    assert again is not None and again["metadata"]["annotations"] == {"k": "v"}
    assert again["status"] == {"observedGeneration": 2}  # a metadata patch leaves status alone
    assert await api.patch(Ref("agents", "nobody", ns), {"metadata": {}}) is False

    await api.delete(ref, uid="not-its-uid")  # another object of the name: left alone
    assert await api.get(ref) is not None
    await api.delete(ref, uid=uid)
    await api.delete(ref, uid=uid)  # gone already: done
    await api.delete(Ref("agents", "b", ns))
    assert await api.list_objects("agents", namespace=ns) == []


async def test_the_adapter_keeps_the_port_contract_on_the_real_api_server(
    kube: Kube, test_namespace: str
) -> None:
    await the_port_contract(kube, test_namespace)


async def test_a_refusal_says_what_the_api_server_refused_and_why(
    kube: Kube, test_namespace: str
) -> None:
    with pytest.raises(ApiError) as refused:
        await kube.create("agents", agent("a", test_namespace, team="search team"))
    said = str(refused.value)
    assert said.startswith("HTTP 422: Unprocessable Entity: ") and refused.value.status == 422
    assert "metadata.labels" in said and "search team" in said, said


def test_an_error_quotes_the_api_servers_message_cut_and_on_one_line() -> None:
    status = {"kind": "Status", "message": 'Agent.agentrun.dev "a" is invalid:\n' + "x" * 2000}
    said = str(ApiError(422, "Unprocessable Entity", json.dumps(status)))
    assert said.startswith('HTTP 422: Unprocessable Entity: Agent.agentrun.dev "a" is invalid: x')
    assert "\n" not in said and len(said) <= kubeapi.SAID_MAX + 40 and said.endswith("...")
    for body in (None, "", "not json", "[1]", json.dumps({"message": " "})):
        assert str(ApiError(422, "Unprocessable Entity", body)) == "HTTP 422: Unprocessable Entity"
    unanswered = ApiError(0, "ClientConnectorError: refused")
    assert str(unanswered) == "no answer: ClientConnectorError: refused"


async def test_a_list_reads_every_page(kube: Kube, test_namespace: str) -> None:
    """A list longer than a page is read to its end through the continue token, with the
    label selector kept on every page."""
    paged = Kube(kube.api, list_page=2)
    pages: list[int] = []
    read = paged._objects.list_namespaced_custom_object

    async def counted(*args: Any, **kwargs: Any) -> Any:
        listed = await read(*args, **kwargs)
        pages.append(len(listed["items"]))
        return listed

    paged._objects.list_namespaced_custom_object = counted  # type: ignore[method-assign]
    for i in range(5):
        assert await kube.create("agents", agent(f"p{i}", test_namespace, team="x"))
    assert await kube.create("agents", agent("other", test_namespace, team="y"))
    every = await paged.list_objects("agents", namespace=test_namespace)
    assert sorted(o["metadata"]["name"] for o in every) == ["other", *(f"p{i}" for i in range(5))]
    assert pages == [2, 2, 2]
    selected = await paged.list_objects("agents", namespace=test_namespace, label_selector="team=x")
    assert sorted(o["metadata"]["name"] for o in selected) == [f"p{i}" for i in range(5)]
    cluster_wide = await paged.list_objects("agents", label_selector="team=x")
    assert {o["metadata"]["name"] for o in cluster_wide} >= {f"p{i}" for i in range(5)}


class ExpiringPages:
    """``list_cluster_custom_object`` serving pages of two from ``names``, answering 410 Gone
    to the first ``expire`` requests that carry a continue token."""

    def __init__(self, names: list[str], expire: int) -> None:
        self.names, self.expire, self.calls = names, expire, 0

    async def list_cluster_custom_object(self, *_: Any, **params: Any) -> dict[str, Any]:
        self.calls += 1
        start = int(params.get("_continue") or 0)
        if "_continue" in params and self.expire > 0:
            self.expire -= 1
            raise ApiException(status=410, reason="Gone")
        page = self.names[start : start + int(params["limit"])]
        end = start + len(page)
        token = str(end) if end < len(self.names) else ""
        return {"items": [{"metadata": {"name": n}} for n in page], "metadata": {"continue": token}}


class Listed(dict[str, Any]):
    """A listed object that a weak reference can follow (a ``dict`` cannot)."""


class WatchedPages(ExpiringPages):
    """``ExpiringPages`` that never expire, serving objects it follows by weak reference."""

    def __init__(self, names: list[str]) -> None:
        super().__init__(names, expire=0)
        self.served: list[weakref.ref[Listed]] = []

    async def list_cluster_custom_object(self, *args: Any, **params: Any) -> dict[str, Any]:
        listed = await super().list_cluster_custom_object(*args, **params)
        items = [Listed(item) for item in listed["items"]]
        self.served += [weakref.ref(item) for item in items]
        return {**listed, "items": items}


async def test_a_kept_list_holds_no_page_once_kept() -> None:
    """``list_kept`` keeps what ``keep`` returns and lets each page's objects go: by the time
    the last page is read, not one object of the earlier pages is alive."""
    paged = Kube(client.ApiClient(), list_page=2)
    pages = WatchedPages(["a", "b", "c", "d", "e"])
    paged._objects = pages  # type: ignore[assignment]
    alive_at_last_page: list[int] = []

    def keep(obj: dict[str, Any]) -> str | None:
        if obj["metadata"]["name"] == "e":  # the last page's one object
            gc.collect()
            alive_at_last_page.append(sum(ref() is not None for ref in pages.served[:-1]))
        return None if obj["metadata"]["name"] == "c" else obj["metadata"]["name"].upper()

    try:
        assert await paged.list_kept("agentruns", keep) == ["A", "B", "D", "E"]
    finally:
        await paged.close()
    assert alive_at_last_page == [0]


@pytest.mark.parametrize("expire", [1, 2])
async def test_an_expired_continue_token_starts_the_list_over(expire: int) -> None:
    paged = Kube(client.ApiClient(), list_page=2)
    paged._objects = ExpiringPages(["a", "b", "c", "d", "e"], expire)  # type: ignore[assignment]
    try:
        listed = await paged.list_objects("agentruns")
    finally:
        await paged.close()
    assert [o["metadata"]["name"] for o in listed] == ["a", "b", "c", "d", "e"]  # once each


async def test_a_list_whose_token_keeps_expiring_raises_gone() -> None:
    paged = Kube(client.ApiClient(), list_page=2)
    paged._objects = ExpiringPages(["a", "b", "c"], 99)  # type: ignore[assignment]
    try:
        with pytest.raises(ApiError) as gone:
            await paged.list_objects("agentruns")
    finally:
        await paged.close()
    assert gone.value.status == 410
    assert paged._objects.calls == 2 * (kubeapi.LIST_RESTARTS + 1)  # type: ignore[attr-defined]


async def test_the_fake_keeps_the_same_contract() -> None:
    await the_port_contract(FakeKube(), "ns")


async def test_events_and_crds_go_through_the_port(
    kube: Kube, kubectl: Any, test_namespace: str
) -> None:
    event = {
        "metadata": {"name": "probe.1", "namespace": test_namespace},
        "involvedObject": {"kind": "Agent", "name": "a", "namespace": test_namespace},
        "type": "Normal",
        "reason": "Probe",
        "message": "one",
        "count": 1,
        "source": {"component": "agentrun-operator"},
    }
    await kube.create_event(test_namespace, event)
    await kube.patch_event(test_namespace, "probe.1", {"count": 2, "message": "two"})
    got = kubectl("get", "event", "probe.1", "-n", test_namespace, "-o", "json")
    shown = json.loads(got.stdout)
    assert (shown["count"], shown["message"]) == (2, "two")
    crd = await kube.read_crd("agentruns.agentrun.dev")
    assert crd is not None and crd["spec"]["names"]["kind"] == "AgentRun"
    assert await kube.read_crd("nothings.agentrun.dev") is None
