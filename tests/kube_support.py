"""An in-memory fake of the operator's API server port (``platform.kubeapi.KubeApi``).

``FakeKube`` keeps ``agentrun.dev`` objects by (plural, namespace, name) and answers the port's
verbs the way the API server does where the operator relies on it: reads of a missing object
are ``None``, a create of an existing name is refused, ``delete`` honours its ``uid``
precondition and ``patch_status`` its ``resourceVersion`` one (409) but, like kube-apiserver on
a status subresource, not its ``uid``; every write moves the object's ``resourceVersion``,
patches are JSON merge patches (RFC 7386: ``None`` removes a key). Core objects the operator
touches (Events, Namespaces' labels, Secrets, Leases) are kept just enough to assert on.
``fail`` makes the next call of a verb raise ``ApiError``.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable, Collection, Mapping
from typing import Any

from agentrun.operator.platform.kubeapi import ApiError, Ref

Key = tuple[str, str, str]
"""(plural, namespace, name); namespace empty for cluster-scoped kinds."""


def merge(target: dict[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    """RFC 7386 JSON merge patch of ``patch`` into ``target`` (in place); ``target``."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(target.get(key), dict):
            merge(target[key], value)
        else:
            target[key] = copy.deepcopy(value) if isinstance(value, Mapping | list) else value
    return target


class FakeKube:
    """``KubeApi`` in memory (see the module)."""

    def __init__(self) -> None:
        self.objects: dict[Key, dict[str, Any]] = {}
        self.labels: dict[str, dict[str, str]] = {}
        """Namespace → its labels."""
        self.secrets: dict[tuple[str, str], dict[str, str]] = {}
        self.events: list[dict[str, Any]] = []
        """core/v1 Events as created (patched in place by ``patch_event``)."""
        self.calls: list[tuple[str, Any]] = []
        """(verb, what) of every call, in order."""
        self.failures: dict[str, list[ApiError]] = {}
        self._versions = itertools.count(1)
        self._uids = itertools.count(1)

    # --- test helpers ------------------------------------------------------------------------

    def fail(self, verb: str, status: int, reason: str = "test") -> None:
        """The next call of ``verb`` raises ``ApiError(status)``."""
        self.failures.setdefault(verb, []).append(ApiError(status, reason))

    def put(self, plural: str, obj: Mapping[str, Any]) -> dict[str, Any]:
        """Store ``obj`` as if created (a uid and a resourceVersion assigned if missing)."""
        stored = copy.deepcopy(dict(obj))
        meta = stored.setdefault("metadata", {})
        meta.setdefault("uid", f"uid-{next(self._uids)}")
        meta["resourceVersion"] = str(next(self._versions))
        self.objects[(plural, meta.get("namespace", ""), meta["name"])] = stored
        return copy.deepcopy(stored)

    def find(self, plural: str, name: str, namespace: str = "") -> dict[str, Any] | None:
        """The stored object (not a copy), or ``None``."""
        return self.objects.get((plural, namespace, name))

    def _called(self, verb: str, what: Any) -> None:
        self.calls.append((verb, what))
        pending = self.failures.get(verb)
        if pending:
            raise pending.pop(0)

    def _key(self, ref: Ref) -> Key:
        return (ref.plural, ref.namespace, ref.name)

    def _bump(self, obj: dict[str, Any]) -> dict[str, Any]:
        obj["metadata"]["resourceVersion"] = str(next(self._versions))
        return copy.deepcopy(obj)

    # --- KubeApi -------------------------------------------------------------------------------

    async def get(self, ref: Ref) -> dict[str, Any] | None:
        self._called("get", ref)
        found = self.objects.get(self._key(ref))
        return copy.deepcopy(found) if found is not None else None

    async def list_objects(
        self, plural: str, *, namespace: str = "", label_selector: str = ""
    ) -> list[dict[str, Any]]:
        self._called("list", (plural, namespace, label_selector))
        wanted = dict(part.split("=", 1) for part in label_selector.split(",") if part)
        return [
            copy.deepcopy(obj)
            for (kind, ns, _), obj in sorted(self.objects.items())
            if kind == plural
            and (not namespace or ns == namespace)
            and all((obj["metadata"].get("labels") or {}).get(k) == v for k, v in wanted.items())
        ]

    async def list_kept(
        self,
        plural: str,
        keep: Callable[[dict[str, Any]], Any],
        *,
        namespace: str = "",
        label_selector: str = "",
    ) -> list[Any]:
        listed = await self.list_objects(plural, namespace=namespace, label_selector=label_selector)
        return [kept for obj in listed if (kept := keep(obj)) is not None]

    async def create(self, plural: str, manifest: Mapping[str, Any]) -> bool:
        self._called("create", (plural, manifest))
        meta = manifest.get("metadata") or {}
        if (plural, meta.get("namespace", ""), meta.get("name")) in self.objects:
            return False
        self.put(plural, manifest)
        return True

    async def delete(self, ref: Ref, *, uid: str = "") -> None:
        self._called("delete", (ref, uid))
        found = self.objects.get(self._key(ref))
        if found is None or (uid and found["metadata"].get("uid") != uid):
            return  # gone, or another object of the name: done, as the port says
        del self.objects[self._key(ref)]

    async def patch(self, ref: Ref, body: Mapping[str, Any]) -> bool:
        self._called("patch", (ref, body))
        found = self.objects.get(self._key(ref))
        if found is None:
            return False
        merge(found, {k: v for k, v in body.items() if k != "status"})
        self._bump(found)
        return True

    async def patch_status(
        self, ref: Ref, status: Mapping[str, Any], *, uid: str = "", version: str = ""
    ) -> dict[str, Any]:
        self._called("patch_status", (ref, dict(status), uid, version))
        found = self.objects.get(self._key(ref))
        if found is None:
            raise ApiError(404, "NotFound")
        if version and found["metadata"]["resourceVersion"] != version:
            raise ApiError(409, "Conflict")  # the uid is not checked (see KubeApi.patch_status)
        merge(found.setdefault("status", {}), status)
        return self._bump(found)

    async def namespace_labels(self, name: str) -> dict[str, str]:
        self._called("namespace_labels", name)
        return dict(self.labels.get(name, {}))

    async def secret_values(
        self, namespace: str, name: str, *, keys: Collection[str]
    ) -> dict[str, str]:
        self._called("secret_values", (namespace, name, tuple(keys)))
        found = self.secrets.get((namespace, name))
        if found is None:
            raise ApiError(404, "NotFound")
        missing = sorted(set(keys) - set(found))
        if missing:
            raise ValueError(f"Secret {namespace}/{name} has no key {missing[0]!r}")
        return {key: found[key] for key in keys}

    async def create_event(self, namespace: str, event: Mapping[str, Any]) -> None:
        """Refused as the API server refuses it (core/v1 Event validation, an Event without
        ``eventTime``): its ``involvedObject.namespace`` must be its own, or empty in
        ``default``."""
        self._called("create_event", (namespace, event))
        involved = str(event.get("involvedObject", {}).get("namespace", ""))
        if involved != namespace and not (involved == "" and namespace in ("", "default")):
            raise ApiError(422, "Invalid", "involvedObject.namespace: does not match")
        self.events.append(copy.deepcopy(dict(event)))

    async def patch_event(self, namespace: str, name: str, body: Mapping[str, Any]) -> None:
        self._called("patch_event", (namespace, name, body))
        for event in self.events:
            if event["metadata"]["name"] == name and event["metadata"]["namespace"] == namespace:
                merge(event, body)
                return
        raise ApiError(404, "NotFound")

    async def read_crd(self, name: str) -> dict[str, Any] | None:
        self._called("read_crd", name)
        found = self.objects.get(("customresourcedefinitions", "", name))
        return copy.deepcopy(found) if found is not None else None

    async def read_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        self._called("read_lease", (namespace, name))
        found = self.objects.get(("leases", namespace, name))
        return copy.deepcopy(found) if found is not None else None

    async def create_lease(self, namespace: str, lease: Mapping[str, Any]) -> dict[str, Any]:
        self._called("create_lease", (namespace, lease))
        if ("leases", namespace, lease["metadata"]["name"]) in self.objects:
            raise ApiError(409, "AlreadyExists")
        return self.put("leases", lease)

    async def replace_lease(
        self, namespace: str, name: str, lease: Mapping[str, Any]
    ) -> dict[str, Any]:
        self._called("replace_lease", (namespace, name, lease))
        found = self.objects.get(("leases", namespace, name))
        if found is None:
            raise ApiError(404, "NotFound")
        if lease["metadata"].get("resourceVersion") != found["metadata"]["resourceVersion"]:
            raise ApiError(409, "Conflict")
        replaced = copy.deepcopy(dict(lease))
        replaced["metadata"]["uid"] = found["metadata"].get("uid")
        self.objects[("leases", namespace, name)] = replaced
        return self._bump(replaced)

    async def close(self) -> None:
        self._called("close", None)
