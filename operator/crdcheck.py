"""Start-up check of the installed CustomResourceDefinitions against what this operator needs.

Helm installs a chart's ``crds/`` once and never upgrades them: after an upgrade the operator
can be newer than its CRDs, and the API server then prunes status fields it does not know
(silently) or answers 404 for a kind it does not serve. So before it touches anything the
operator reads the CRD objects and compares them with ``REQUIRED``: every kind of the CRDs it
ships with served at ``v1alpha1`` with a status subresource, and every ``.spec`` and
``.status`` field of those CRDs (``crdfields``) present in the installed schema, and none of
the fields whose absence means something (``UNDEFAULTED``) defaulted. Until they
match the operator is not ready, says so once in its log and once as a Kubernetes Event on the
CRD, and checks again every few seconds; once they match it goes on without a restart.

What belongs here: the requirements, the pure comparison (``find_mismatches``) and the waiting
loop. What does not: the HTTP readiness endpoint (``platform.health``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from agentrun import kube

from .platform.conditions import rfc3339
from .platform.crdfields import SERVED
from .platform.kubeapi import ApiError, KubeApi

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, slots=True)
class KindRequirement:
    """What one CRD must serve."""

    kind: str
    plural: str
    status_fields: tuple[str, ...] = ()
    spec_fields: tuple[str, ...] = ()
    undefaulted: tuple[str, ...] = ()
    """``.spec`` fields the CRD must not default: the operator reads their absence as a
    meaning of its own, which a default written into every new object would take away."""

    @property
    def crd_name(self) -> str:
        """``<plural>.<group>``, the CRD object's name."""
        return f"{self.plural}.{kube.GROUP}"


UNDEFAULTED: Mapping[str, tuple[str, ...]] = {
    "AgentModel": ("pricing.cachedInputPerMillionUSD",),  # unset: the input price
}
"""By kind, the ``.spec`` fields whose absence means something (``KindRequirement.undefaulted``);
a release before this one defaulted them."""

REQUIRED = tuple(
    KindRequirement(
        kind, plural, status_fields=status, spec_fields=spec, undefaulted=UNDEFAULTED.get(kind, ())
    )
    for kind, (plural, spec, status) in SERVED.items()
)
"""The kinds this operator serves, as ``v1alpha1``, each with every field of the CRD it ships
with (``crdfields``)."""


def schema_paths(schema: Mapping[str, Any]) -> tuple[str, ...]:
    """Every field path (dotted) of an OpenAPI object ``schema``, in its order: a path ends at
    a field that is not an object with properties of its own (a list, a map, a scalar, an
    object that preserves unknown fields). How ``crdfields`` is made from ``crds/``."""
    paths: list[str] = []
    for name, field in (schema.get("properties") or {}).items():
        if field.get("properties") and not field.get("x-kubernetes-preserve-unknown-fields"):
            paths += [f"{name}.{path}" for path in schema_paths(field)]
        else:
            paths.append(name)
    return tuple(paths)


UPGRADE_HINT = "apply the chart's CRDs: kubectl apply --server-side -f charts/agentrun/crds/"


def _field(schema: Mapping[str, Any], path: str) -> Mapping[str, Any] | None:
    """The schema of field ``path`` (dotted); ``{}`` inside an object that preserves unknown
    fields; ``None`` when the schema has no such field."""
    node: Mapping[str, Any] = schema
    for part in path.split("."):
        if node.get("x-kubernetes-preserve-unknown-fields"):
            return {}
        properties: Mapping[str, Any] = node.get("properties") or {}
        if part not in properties:
            return None
        node = properties[part]
    return node


def _has_path(schema: Mapping[str, Any], path: str) -> bool:
    return _field(schema, path) is not None


def _version(crd: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for version in crd.get("spec", {}).get("versions") or []:
        if version.get("name") == kube.VERSION and version.get("served"):
            found: Mapping[str, Any] = version
            return found
    return None


def check_kind(need: KindRequirement, crd: Mapping[str, Any] | None) -> list[str]:
    """What ``crd`` (the CRD object as JSON, None when absent) lacks for ``need``; empty when
    it serves everything."""
    if crd is None:
        return [f"CRD {need.crd_name} is not installed"]
    kind = crd.get("spec", {}).get("names", {}).get("kind")
    if kind != need.kind:
        return [f"CRD {need.crd_name} serves kind {kind!r}, not {need.kind}"]
    version = _version(crd)
    if version is None:
        return [f"CRD {need.crd_name} does not serve {kube.VERSION}"]
    problems: list[str] = []
    if "status" not in (version.get("subresources") or {}):
        problems.append(f"CRD {need.crd_name} has no status subresource")
    root: Mapping[str, Any] = (version.get("schema") or {}).get("openAPIV3Schema") or {}
    properties: Mapping[str, Any] = root.get("properties") or {}
    for section, fields in (("status", need.status_fields), ("spec", need.spec_fields)):
        schema: Mapping[str, Any] = properties.get(section) or {}
        missing = [path for path in fields if not _has_path(schema, path)]
        if missing:
            problems.append(f"CRD {need.crd_name} lacks .{section} fields: {', '.join(missing)}")
    spec: Mapping[str, Any] = properties.get("spec") or {}
    defaulted = [p for p in need.undefaulted if "default" in (_field(spec, p) or {})]
    if defaulted:
        problems.append(
            f"CRD {need.crd_name} defaults .spec fields whose absence now means something "
            f"(an older release's CRD): {', '.join(defaulted)}"
        )
    return problems


def find_mismatches(
    crds: Mapping[str, Mapping[str, Any] | None],
    *,
    required: Sequence[KindRequirement] = REQUIRED,
) -> list[str]:
    """Every mismatch between the installed CRDs (by name; None: absent) and ``required``."""
    return [problem for need in required for problem in check_kind(need, crds.get(need.crd_name))]


async def read_crds(api: KubeApi) -> dict[str, dict[str, Any] | None]:
    """The required CRD objects as JSON, by name (None: not installed); raises ``ApiError``
    on any other failure."""
    return {need.crd_name: await api.read_crd(need.crd_name) for need in REQUIRED}


async def post_event(api: KubeApi, *, crd_name: str, message: str, at: float) -> None:
    """One Warning Event ``CRDMismatch`` on the CRD (in ``default``, where Events of
    cluster-scoped objects live); raises ``ApiError``."""
    stamp = rfc3339(at)
    body = {
        "metadata": {"generateName": "agentrun-operator-crds."},
        "involvedObject": {
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "name": crd_name,
        },
        "type": "Warning",
        "reason": "CRDMismatch",
        "message": message[:1024],
        "source": {"component": "agentrun-operator"},
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }
    await api.create_event("default", body)


async def wait_until_served(
    api: KubeApi,
    *,
    interval: float,
    on_ready: Callable[[bool], None],
    clock: Callable[[], float],
) -> None:
    """Return once the installed CRDs serve ``REQUIRED``; until then re-check every
    ``interval`` seconds. ``on_ready(False)`` is called on the first mismatch (with one error
    log line and one Event), ``on_ready(True)`` at the end. API errors are retried."""
    reported = False
    while True:
        try:
            problems = find_mismatches(await read_crds(api))
        except ApiError as err:
            problems = [f"cannot read the CRDs: HTTP {err.status} {err.reason}"]
        if not problems:
            if reported:
                log.info("the installed CRDs now serve what this operator writes; starting")
            on_ready(True)
            return
        if not reported:
            reported = True
            on_ready(False)
            message = f"not ready: {'; '.join(problems)}; {UPGRADE_HINT}"
            log.error("%s", message)
            first = next((n.crd_name for n in REQUIRED if n.crd_name in message), None)
            try:
                await post_event(
                    api, crd_name=first or REQUIRED[0].crd_name, message=message, at=clock()
                )
            except ApiError as err:
                log.warning("could not post the CRD mismatch Event: HTTP %s", err.status)
        await asyncio.sleep(interval)
