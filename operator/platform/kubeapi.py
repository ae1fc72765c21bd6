"""The operator's one way to the Kubernetes API server: the ``KubeApi`` port and its adapter.

Every read, create, patch, status write and deletion the operator makes goes through
``KubeApi``; ``Kube`` is its only implementation over ``kubernetes_asyncio`` (and the only
module of the operator that imports that client), tests use an in-memory fake of the port. The
port speaks JSON objects (``dict``), names objects by ``Ref`` (the plural of an
``agentrun.dev`` kind, the name, the namespace), and raises ``ApiError`` for a request the API
server refused or failed, with its HTTP status.

What belongs here: the verbs, ``patch_status`` (the one status write: a JSON merge patch, RFC
7386, of ``.status``, with the object's ``resourceVersion`` as a precondition when given), the
answers every caller treats alike (a missing object read is ``None``; a delete or metadata
patch of an object already gone is done), and the translation of the client's errors. What does
not: deciding what to write (the kinds).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Callable, Collection, Iterator, Mapping
from typing import Any, Protocol, TypeVar, cast

import aiohttp
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from agentrun import kube

MERGE_PATCH: dict[str, Any] = {"_content_type": "application/merge-patch+json"}
"""kubernetes_asyncio picks JSON Patch for list bodies only; force RFC 7386 merge patch."""
NOT_FOUND = 404
LIST_PAGE = 500
"""Objects per page of a list (``limit``/``continue``): ``list_objects``'s, and kopf's initial
list of each watched kind (``handlers.startup``). A response is decoded in one piece while the
interpreter's lock is held: with every one of 50,000 AgentRuns in one response the operator
lost its Lease 16 s after starting (no renewal within the deadline) and exited
(``bench/bench_objects.py``); in pages it starts on 50,000 and settles in about 75 s."""
CONFLICT = 409
"""A precondition (uid, resourceVersion) failed, or the object to create exists."""
GONE = 410
"""A list's continue token expired."""
LIST_RESTARTS = 2
"""Times ``list_objects`` starts a list over after its continue token expired."""

T = TypeVar("T")


SAID_MAX = 1000
"""Characters of the API server's own message an ``ApiError`` repeats, at most (a 422 lists
every invalid field; a condition's message holds 32768)."""


def server_said(body: str | None) -> str:
    """The ``message`` of the API server's ``Status`` in an error answer's ``body`` (JSON):
    what it refused and why, e.g. ``AgentRun.agentrun.dev "r" is invalid:
    metadata.labels: Invalid value: "a b": ...``; cut to ``SAID_MAX`` characters; "" when
    ``body`` is none, not JSON or says nothing."""
    try:
        found = json.loads(body or "")
    except ValueError:
        return ""
    said = found.get("message") if isinstance(found, dict) else None
    if not isinstance(said, str) or not said.strip():
        return ""
    said = " ".join(said.split())
    return said if len(said) <= SAID_MAX else said[: SAID_MAX - 3] + "..."


class ApiError(Exception):
    """The API server refused or failed a request, or did not answer it (status 0: the
    connection could not be opened or was lost). Its text is ``HTTP <status>: <reason>``,
    then what the API server said (``server_said``), so a status, Event or log quoting it
    names the field a refused request got wrong."""

    def __init__(self, status: int, reason: str = "", body: str | None = None) -> None:
        said = server_said(body)
        text = f"HTTP {status}: {reason}" if status else f"no answer: {reason}"
        super().__init__(f"{text}: {said}" if said else text)
        self.status = status
        """The HTTP status (0: no answer)."""
        self.reason = reason
        self.body = body
        """The answer's body as text, if any (the API server's ``Status`` as JSON)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Ref:
    """An ``agentrun.dev/v1alpha1`` object: its kind's plural, its name, its namespace (empty
    for a cluster-scoped kind)."""

    plural: str
    name: str
    namespace: str = ""


class KubeApi(Protocol):
    """The Kubernetes API as the operator uses it. Every method raises ``ApiError`` on a
    refused or failed request, except the answers named in its docstring."""

    async def get(self, ref: Ref) -> dict[str, Any] | None:
        """The object, or ``None`` when it does not exist (404)."""

    async def list_objects(
        self, plural: str, *, namespace: str = "", label_selector: str = ""
    ) -> list[dict[str, Any]]:
        """The objects of ``plural`` in ``namespace`` (empty: every namespace, or a
        cluster-scoped kind), matching ``label_selector`` (empty: all)."""

    async def list_kept(
        self,
        plural: str,
        keep: Callable[[dict[str, Any]], T | None],
        *,
        namespace: str = "",
        label_selector: str = "",
    ) -> list[T]:
        """``keep`` of each object ``list_objects`` would list, in its order, where it is not
        ``None``: what a caller needs of every object (their names, one tenant's runs) without
        holding all of them decoded at once (each page's objects go once kept). A list started
        over (an expired continue token) calls ``keep`` again on the objects it reads again:
        ``keep`` has no effect but its answer."""

    async def create(self, plural: str, manifest: Mapping[str, Any]) -> bool:
        """Create ``manifest`` (in its ``metadata.namespace``); ``False`` when an object of
        its name exists already (409)."""

    async def delete(self, ref: Ref, *, uid: str = "") -> None:
        """Delete the object (propagation as the API server defaults), only while it has
        ``uid`` when given; done when it is gone already (404) or is another object (409)."""

    async def patch(self, ref: Ref, body: Mapping[str, Any]) -> bool:
        """Merge-patch ``body`` into the object (its metadata: annotations); ``False`` when
        the object is gone (404)."""

    async def patch_status(
        self, ref: Ref, status: Mapping[str, Any], *, uid: str = "", version: str = ""
    ) -> dict[str, Any]:
        """Merge-patch ``status`` into the object's ``.status`` subresource, only while the
        object is at ``resourceVersion`` ``version`` (when given); the object as patched.
        404: gone; 409: the version moved on.

        ``uid`` (when given) is sent as ``metadata.uid``, but the API server does not check it
        on the status subresource (kube-apiserver 1.34 resets the patch's metadata to the
        object's before validating): a patch of a name whose object was replaced lands on the
        new object unless ``version`` says otherwise. A caller that must not write to another
        object of the name compares the uid itself (the run status writer does)."""

    async def namespace_labels(self, name: str) -> dict[str, str]:
        """The labels of Namespace ``name``."""

    async def secret_values(
        self, namespace: str, name: str, *, keys: Collection[str]
    ) -> dict[str, str]:
        """The ``keys`` of Secret ``namespace/name`` with their decoded values (no other key
        is read out); ``ValueError`` naming a key that is missing or not UTF-8 text."""

    async def create_event(self, namespace: str, event: Mapping[str, Any]) -> None:
        """Create the core/v1 Event ``event`` (as JSON) in ``namespace``."""

    async def patch_event(self, namespace: str, name: str, body: Mapping[str, Any]) -> None:
        """Merge-patch ``body`` into the core/v1 Event ``namespace/name``."""

    async def read_crd(self, name: str) -> dict[str, Any] | None:
        """The CustomResourceDefinition ``name``, or ``None`` when it is not installed."""

    async def read_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The ``coordination.k8s.io/v1`` Lease, or ``None`` when it does not exist."""

    async def create_lease(self, namespace: str, lease: Mapping[str, Any]) -> dict[str, Any]:
        """Create the Lease ``lease``; the Lease as stored (409: it exists)."""

    async def replace_lease(
        self, namespace: str, name: str, lease: Mapping[str, Any]
    ) -> dict[str, Any]:
        """Replace the Lease (at the ``resourceVersion`` in ``lease``); the Lease as stored
        (409: it moved on; 404: it is gone)."""

    async def close(self) -> None:
        """Release the connections (the port is unusable afterwards)."""


@contextlib.contextmanager
def _translated() -> Iterator[None]:
    """Raise the client's ``ApiException`` as ``ApiError``, and a connection that could not be
    opened or was lost (aiohttp's ``ClientError``) as ``ApiError`` with status 0."""
    try:
        yield
    except ApiException as err:
        body = err.body if isinstance(err.body, str) or err.body is None else str(err.body)
        raise ApiError(int(err.status or 0), str(err.reason or ""), body) from err
    except aiohttp.ClientError as err:
        raise ApiError(0, f"{type(err).__name__}: {err}") from err


def _status_patch(status: Mapping[str, Any], *, uid: str, version: str) -> dict[str, Any]:
    """The merge patch of a status write: the preconditions in ``metadata``, then ``status``."""
    meta = {k: v for k, v in (("uid", uid), ("resourceVersion", version)) if v}
    return {"metadata": meta, "status": dict(status)} if meta else {"status": dict(status)}


def _whole(obj: dict[str, Any]) -> dict[str, Any]:
    """``list_kept``'s ``keep`` of ``list_objects``: the whole object."""
    return obj


class _Expired(Exception):
    """A list's continue token expired (410): the list starts over."""

    def __init__(self, error: ApiError) -> None:
        super().__init__(str(error))
        self.error = error


class Kube:
    """``KubeApi`` over a ``kubernetes_asyncio`` ``ApiClient`` (its connection pool reused by
    every call)."""

    def __init__(self, api: client.ApiClient, *, list_page: int = LIST_PAGE) -> None:
        self.api = api
        self.list_page = list_page
        """Objects per page of ``list_objects``."""
        self._objects = client.CustomObjectsApi(api)
        self._core = client.CoreV1Api(api)
        self._leases = client.CoordinationV1Api(api)
        self._crds = client.ApiextensionsV1Api(api)

    @classmethod
    async def connect(cls) -> Kube:
        """From the kubeconfig, else the in-cluster service account (``kube.api_client``),
        each request bounded by ``kube.REQUEST_TIMEOUT`` (its timeout is an ``ApiError`` with
        status 0, as a lost connection is)."""
        return cls(await kube.api_client(trust_env=False, request_timeout=kube.REQUEST_TIMEOUT))

    async def close(self) -> None:
        """See ``KubeApi.close``: close the connection pool."""
        await self.api.close()

    async def get(self, ref: Ref) -> dict[str, Any] | None:
        """See ``KubeApi.get``."""
        try:
            with _translated():
                if ref.namespace:
                    found: dict[str, Any] = await self._objects.get_namespaced_custom_object(
                        kube.GROUP, kube.VERSION, ref.namespace, ref.plural, ref.name
                    )
                else:
                    found = await self._objects.get_cluster_custom_object(
                        kube.GROUP, kube.VERSION, ref.plural, ref.name
                    )
        except ApiError as err:
            if err.status == NOT_FOUND:
                return None
            raise
        return found

    async def list_objects(
        self, plural: str, *, namespace: str = "", label_selector: str = ""
    ) -> list[dict[str, Any]]:
        """See ``KubeApi.list_objects``: read in pages of ``list_page`` objects (``limit`` and
        ``continue``), so that no one response holds every object of a large cluster. A
        continue token that expired before the last page (410 Gone: the API server keeps a
        list's snapshot for about five minutes) starts the list over, up to ``LIST_RESTARTS``
        times, then raises that ``ApiError``."""
        return await self.list_kept(
            plural, _whole, namespace=namespace, label_selector=label_selector
        )

    async def list_kept(
        self,
        plural: str,
        keep: Callable[[dict[str, Any]], T | None],
        *,
        namespace: str = "",
        label_selector: str = "",
    ) -> list[T]:
        """See ``KubeApi.list_kept``: paged, and started over on an expired continue token,
        as ``list_objects``."""
        for restart in range(LIST_RESTARTS + 1):
            try:
                return await self._list_pages(plural, keep, namespace, label_selector)
            except _Expired as expired:
                if restart == LIST_RESTARTS:
                    raise expired.error from None
        raise AssertionError("unreachable")

    async def _list_pages(
        self,
        plural: str,
        keep: Callable[[dict[str, Any]], T | None],
        namespace: str,
        label_selector: str,
    ) -> list[T]:
        params: dict[str, Any] = {"limit": self.list_page}
        if label_selector:
            params["label_selector"] = label_selector
        items: list[T] = []
        while True:
            try:
                with _translated():
                    if namespace:
                        listed: dict[str, Any] = await self._objects.list_namespaced_custom_object(
                            kube.GROUP, kube.VERSION, namespace, plural, **params
                        )
                    else:
                        listed = await self._objects.list_cluster_custom_object(
                            kube.GROUP, kube.VERSION, plural, **params
                        )
            except ApiError as err:
                if err.status == GONE and "_continue" in params:
                    raise _Expired(err) from err
                raise
            token = str((listed.get("metadata") or {}).get("continue") or "")
            for item in listed.pop("items", None) or []:
                kept = keep(item)
                if kept is not None:
                    items.append(kept)
            if not token:
                return items
            params["_continue"] = token

    async def create(self, plural: str, manifest: Mapping[str, Any]) -> bool:
        """See ``KubeApi.create``."""
        namespace = str((manifest.get("metadata") or {}).get("namespace") or "")
        try:
            with _translated():
                if namespace:
                    await self._objects.create_namespaced_custom_object(
                        kube.GROUP, kube.VERSION, namespace, plural, manifest
                    )
                else:
                    await self._objects.create_cluster_custom_object(
                        kube.GROUP, kube.VERSION, plural, manifest
                    )
        except ApiError as err:
            if err.status == CONFLICT:
                return False
            raise
        return True

    async def delete(self, ref: Ref, *, uid: str = "") -> None:
        """See ``KubeApi.delete``."""
        options: dict[str, Any] = {}
        if uid:
            options["body"] = client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=uid))
        try:
            with _translated():
                if ref.namespace:
                    await self._objects.delete_namespaced_custom_object(
                        kube.GROUP, kube.VERSION, ref.namespace, ref.plural, ref.name, **options
                    )
                else:
                    await self._objects.delete_cluster_custom_object(
                        kube.GROUP, kube.VERSION, ref.plural, ref.name, **options
                    )
        except ApiError as err:
            if err.status not in (NOT_FOUND, CONFLICT):  # gone, or a newer object of the name
                raise

    async def patch(self, ref: Ref, body: Mapping[str, Any]) -> bool:
        """See ``KubeApi.patch``."""
        try:
            with _translated():
                if ref.namespace:
                    await self._objects.patch_namespaced_custom_object(
                        kube.GROUP,
                        kube.VERSION,
                        ref.namespace,
                        ref.plural,
                        ref.name,
                        body,
                        **MERGE_PATCH,
                    )
                else:
                    await self._objects.patch_cluster_custom_object(
                        kube.GROUP, kube.VERSION, ref.plural, ref.name, body, **MERGE_PATCH
                    )
        except ApiError as err:
            if err.status == NOT_FOUND:
                return False
            raise
        return True

    async def patch_status(
        self, ref: Ref, status: Mapping[str, Any], *, uid: str = "", version: str = ""
    ) -> dict[str, Any]:
        """See ``KubeApi.patch_status``."""
        body = _status_patch(status, uid=uid, version=version)
        with _translated():
            if ref.namespace:
                patched: dict[str, Any] = await self._objects.patch_namespaced_custom_object_status(
                    kube.GROUP,
                    kube.VERSION,
                    ref.namespace,
                    ref.plural,
                    ref.name,
                    body,
                    **MERGE_PATCH,
                )
            else:
                patched = await self._objects.patch_cluster_custom_object_status(
                    kube.GROUP, kube.VERSION, ref.plural, ref.name, body, **MERGE_PATCH
                )
        return patched

    async def namespace_labels(self, name: str) -> dict[str, str]:
        """See ``KubeApi.namespace_labels``."""
        with _translated():
            found = await self._core.read_namespace(name)
        return dict(found.metadata.labels or {})

    async def secret_values(
        self, namespace: str, name: str, *, keys: Collection[str]
    ) -> dict[str, str]:
        """See ``KubeApi.secret_values``."""
        with _translated():
            return await kube.secret_values(self._core, namespace=namespace, name=name, keys=keys)

    async def create_event(self, namespace: str, event: Mapping[str, Any]) -> None:
        """See ``KubeApi.create_event`` (the answer is not decoded into the client's models)."""
        with _translated():
            await kube.raw_json(
                self._core.create_namespaced_event(
                    namespace, cast(client.CoreV1Event, event), _preload_content=False
                )
            )

    async def patch_event(self, namespace: str, name: str, body: Mapping[str, Any]) -> None:
        """See ``KubeApi.patch_event``."""
        with _translated():
            await kube.raw_json(
                self._core.patch_namespaced_event(
                    name, namespace, body, _preload_content=False, **MERGE_PATCH
                )
            )

    async def read_crd(self, name: str) -> dict[str, Any] | None:
        """See ``KubeApi.read_crd``."""
        try:
            with _translated():
                found = await self._crds.read_custom_resource_definition(name)
        except ApiError as err:
            if err.status == NOT_FOUND:
                return None
            raise
        crd: dict[str, Any] = self.api.sanitize_for_serialization(found)
        return crd

    async def read_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        """See ``KubeApi.read_lease``."""
        try:
            with _translated():
                return await kube.raw_json(
                    self._leases.read_namespaced_lease(name, namespace, _preload_content=False)
                )
        except ApiError as err:
            if err.status == NOT_FOUND:
                return None
            raise

    async def create_lease(self, namespace: str, lease: Mapping[str, Any]) -> dict[str, Any]:
        """See ``KubeApi.create_lease``."""
        with _translated():
            return await kube.raw_json(
                self._leases.create_namespaced_lease(
                    namespace, cast(client.V1Lease, lease), _preload_content=False
                )
            )

    async def replace_lease(
        self, namespace: str, name: str, lease: Mapping[str, Any]
    ) -> dict[str, Any]:
        """See ``KubeApi.replace_lease``."""
        with _translated():
            return await kube.raw_json(
                self._leases.replace_namespaced_lease(
                    name, namespace, cast(client.V1Lease, lease), _preload_content=False
                )
            )
