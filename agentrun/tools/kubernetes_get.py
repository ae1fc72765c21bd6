"""`kubernetes_get`: read-only get/list of a few kinds in the run's own namespace.

The namespace is always `ToolContext.namespace` (the AgentRun's); the model cannot name
another. Secrets are deliberately not a kind. Objects are fetched with kubernetes_asyncio's
typed APIs (CoreV1Api, AppsV1Api, BatchV1Api, CustomObjectsApi for
agentruns.agentrun.dev/v1alpha1), turned into plain camelCase dicts with
`ApiClient.sanitize_for_serialization`, and summarised by the pure `summarize_*` functions
below into compact JSON of at most MAX_RESULT_CHARS characters.

The tool is `pollable`: watching a rollout by reading the same object again is progress,
not a loop, so the no-progress detector must not end the run for it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import aiohttp
from kubernetes_asyncio import client as k8s

from agentrun import kernel

from . import catalog

__all__ = ["KINDS", "SPEC", "KubernetesGet", "format_age", "render_list", "summarize"]

MAX_RESULT_CHARS = 8000
MAX_TEXT_CHARS = 300
EVENTS_FETCHED = 500
"""Events are fetched up to this many, sorted newest first, then cut to `limit`."""

Obj = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Route:
    """How to reach one kind: the typed API class and its method stem, or a custom resource."""

    api: str
    stem: str
    """`config_map` gives list_namespaced_config_map / read_namespaced_config_map."""
    custom: tuple[str, str, str] | None = None
    """(group, version, plural) for CustomObjectsApi."""


ROUTES: Mapping[str, Route] = {
    "pods": Route("CoreV1Api", "pod"),
    "services": Route("CoreV1Api", "service"),
    "configmaps": Route("CoreV1Api", "config_map"),
    "events": Route("CoreV1Api", "event"),
    "deployments": Route("AppsV1Api", "deployment"),
    "replicasets": Route("AppsV1Api", "replica_set"),
    "statefulsets": Route("AppsV1Api", "stateful_set"),
    "jobs": Route("BatchV1Api", "job"),
    "agentruns": Route("CustomObjectsApi", "", ("agentrun.dev", "v1alpha1", "agentruns")),
}
KINDS = tuple(ROUTES)

SPEC = catalog.ToolSpec(
    name="kubernetes_get",
    description=(
        "Read Kubernetes objects in this run's own namespace (read-only; no other namespace, "
        "and secrets are not available). With `name`, get that object in detail; without, "
        "list objects (optionally filtered by labelSelector) with name, status summary and "
        "age. Events are listed newest first with type, reason, object, message and count. "
        "Fails if the named object does not exist."
    ),
    parameters=catalog.object_schema(
        {
            "kind": {"type": "string", "enum": list(KINDS), "description": "Plural kind."},
            "name": {
                "type": "string",
                "minLength": 1,
                "maxLength": 253,
                # a DNS-1123 subdomain: no "/", no ".." (path traversal), no leading dot
                "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$",
                "description": "object name (DNS-1123 subdomain)",
            },
            "labelSelector": {
                "type": "string",
                "maxLength": 1000,
                "description": "e.g. app=web,tier!=cache (lists only)",
            },
            "limit": {"type": "integer", "minimum": 1, "maximum": 100, "default": 20},
        },
        required=["kind"],
    ),
    effect="read",
    pollable=True,
)


# --------------------------------------------------------------------------- pure summaries


def clip(text: Any, limit: int = MAX_TEXT_CHARS) -> str:
    """`text` as a string of at most `limit` characters (an ellipsis marks a cut)."""
    s = "" if text is None else str(text)
    return s if len(s) <= limit else s[: limit - 1] + "…"


def format_age(timestamp: str | None, *, now: datetime) -> str | None:
    """kubectl-like age of an RFC 3339 timestamp: 45s, 12m, 5h, 3d."""
    if not timestamp:
        return None
    seconds = max(0, int((now - datetime.fromisoformat(timestamp)).total_seconds()))
    for unit, size, below in (("s", 1, 120), ("m", 60, 120 * 60), ("h", 3600, 48 * 3600)):
        if seconds < below:
            return f"{seconds // size}{unit}"
    return f"{seconds // 86400}d"


def _pod(obj: Obj) -> dict[str, Any]:
    status = obj.get("status") or {}
    containers = status.get("containerStatuses") or []
    state = status.get("phase")
    for c in containers:
        c_state = c.get("state") or {}
        reason = (c_state.get("waiting") or c_state.get("terminated") or {}).get("reason")
        if reason and not c.get("ready"):
            state = reason
            break
    if (obj.get("metadata") or {}).get("deletionTimestamp"):
        state = "Terminating"
    ready = sum(1 for c in containers if c.get("ready"))
    total = len((obj.get("spec") or {}).get("containers") or containers)
    restarts = sum(int(c.get("restartCount") or 0) for c in containers)
    return {"status": state, "ready": f"{ready}/{total}", "restarts": restarts}


def _service(obj: Obj) -> dict[str, Any]:
    spec = obj.get("spec") or {}
    ports = [
        f"{p.get('port')}/{p.get('protocol', 'TCP')}"
        + (f"->{p['targetPort']}" if p.get("targetPort") is not None else "")
        for p in spec.get("ports") or []
    ]
    return {"type": spec.get("type"), "clusterIP": spec.get("clusterIP"), "ports": ports}


def _configmap(obj: Obj) -> dict[str, Any]:
    keys = [*(obj.get("data") or {}), *(obj.get("binaryData") or {})]
    return {"keys": keys}


def _replicas(obj: Obj) -> dict[str, Any]:
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    summary: dict[str, Any] = {
        "ready": f"{status.get('readyReplicas') or 0}/{spec.get('replicas', 1)}"
    }
    if "updatedReplicas" in status or "availableReplicas" in status:
        summary["upToDate"] = status.get("updatedReplicas") or 0
        summary["available"] = status.get("availableReplicas") or 0
    return summary


def _job(obj: Obj) -> dict[str, Any]:
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    done = [c["type"] for c in status.get("conditions") or [] if c.get("status") == "True"]
    state = next((t for t in ("Complete", "Failed", "Suspended") if t in done), "Running")
    return {
        "status": state,
        "completions": f"{status.get('succeeded') or 0}/{spec.get('completions', 1)}",
        "active": status.get("active") or 0,
        "failed": status.get("failed") or 0,
    }


def _agentrun(obj: Obj) -> dict[str, Any]:
    status = obj.get("status") or {}
    return {
        "phase": status.get("phase"),
        "terminalReason": status.get("terminalReason"),
        "steps": (status.get("usage") or {}).get("steps"),
    }


def _event(obj: Obj) -> dict[str, Any]:
    involved = obj.get("involvedObject") or {}
    return {
        "type": obj.get("type"),
        "reason": obj.get("reason"),
        "object": f"{involved.get('kind')}/{involved.get('name')}",
        "message": clip(obj.get("message")),
        "count": obj.get("count") or (obj.get("series") or {}).get("count") or 1,
        "lastTime": event_time(obj),
    }


def event_time(obj: Obj) -> str | None:
    """When an event last happened: lastTimestamp, series, eventTime or creation time."""
    return (
        obj.get("lastTimestamp")
        or (obj.get("series") or {}).get("lastObservedTime")
        or obj.get("eventTime")
        or (obj.get("metadata") or {}).get("creationTimestamp")
    )


SUMMARIES: Mapping[str, Callable[[Obj], dict[str, Any]]] = {
    "pods": _pod,
    "services": _service,
    "configmaps": _configmap,
    "events": _event,
    "deployments": _replicas,
    "replicasets": _replicas,
    "statefulsets": _replicas,
    "jobs": _job,
    "agentruns": _agentrun,
}


def summarize(kind: str, obj: Obj, *, now: datetime) -> dict[str, Any]:
    """One list row: name, the kind's status summary, age (events: their own fields)."""
    metadata = obj.get("metadata") or {}
    row: dict[str, Any] = {"name": metadata.get("name")}
    row.update(SUMMARIES[kind](obj))
    if kind != "events":
        row["age"] = format_age(metadata.get("creationTimestamp"), now=now)
    return row


def detail(kind: str, obj: Obj, *, now: datetime) -> dict[str, Any]:
    """A single object: the summary plus labels, conditions and kind-specific detail."""
    row = summarize(kind, obj, now=now)
    metadata, status = obj.get("metadata") or {}, obj.get("status") or {}
    if metadata.get("labels"):
        row["labels"] = metadata["labels"]
    conditions = [
        {k: clip(c[k]) for k in ("type", "status", "reason", "message") if c.get(k)}
        for c in status.get("conditions") or []
    ]
    if conditions:
        row["conditions"] = conditions
    if kind == "pods":
        row["containers"] = [_container(c) for c in status.get("containerStatuses") or []]
    elif kind == "configmaps":
        row["data"] = {k: clip(v) for k, v in (obj.get("data") or {}).items()}
    elif kind == "agentruns":
        row["message"] = clip(status.get("message"))
        row["usage"] = status.get("usage")
    return row


def _container(c: Obj) -> dict[str, Any]:
    state = c.get("state") or {}
    name = next((k for k in ("running", "waiting", "terminated") if state.get(k)), "unknown")
    info = state.get(name) or {}
    described = " ".join(
        str(x)
        for x in (name, info.get("reason"), info.get("exitCode"), clip(info.get("message")))
        if x not in (None, "")
    )
    return {
        "name": c.get("name"),
        "ready": bool(c.get("ready")),
        "restarts": c.get("restartCount") or 0,
        "state": described,
    }


def render_list(kind: str, rows: Sequence[dict[str, Any]], *, namespace: str, more: bool) -> str:
    """Compact JSON ``{"kind", "namespace", "items", "more"?, "truncated"?}``, at most
    MAX_RESULT_CHARS: rows are dropped from the end (and counted) until it fits."""
    shown = list(rows)
    while True:
        out: dict[str, Any] = {"kind": kind, "namespace": namespace, "items": shown}
        if more:
            out["more"] = "more objects exist; narrow with labelSelector or raise limit"
        if len(shown) < len(rows):
            out["truncated"] = f"{len(shown)} of {len(rows)} items shown"
        text = dumps(out)
        if len(text) <= MAX_RESULT_CHARS or not shown:
            return text
        shown = shown[: max(0, min(len(shown) - 1, len(shown) * MAX_RESULT_CHARS // len(text)))]


def dumps(value: Any) -> str:
    """Compact JSON (non-ASCII kept, which costs fewer tokens than escapes)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str)


# --------------------------------------------------------------------------- the tool


def _error_for(exc: k8s.ApiException, *, kind: str, name: str | None, ns: str) -> catalog.ToolError:
    try:
        message = json.loads(exc.body or "{}").get("message") or exc.reason
    except (ValueError, AttributeError):
        message = exc.reason
    if exc.status == 404 and name:
        return catalog.ToolError(f"{kind} {name!r} not found in namespace {ns}")
    if exc.status == 404:
        return catalog.ToolError(f"{kind} are not served by this cluster")
    if exc.status == 403:
        return catalog.ToolError(
            f"not allowed to read {kind} in namespace {ns} (the platform grants this tool a "
            "namespace in the chart's rbac.kubernetesGetNamespaces)"
        )
    fault = kernel.ToolFault.SERVER if exc.status >= 500 else kernel.ToolFault.REJECTED
    return catalog.ToolError(f"kubernetes API error {exc.status}: {clip(message)}", fault=fault)


class KubernetesGet:
    """The `kubernetes_get` tool; uses `ctx.kube`, else the client given here."""

    spec = SPEC

    def __init__(self, kube: Any | None = None) -> None:
        self._kube = kube

    async def run(self, arguments: Mapping[str, Any], ctx: catalog.ToolContext) -> str:
        """Get or list per SPEC in ctx.namespace; returns compact JSON.

        Raises ToolError when there is no cluster client, the object is not found, access is
        forbidden, or the API fails (with the API's message).
        """
        kube = ctx.kube if ctx.kube is not None else self._kube
        if kube is None:
            raise catalog.ToolError(
                "kubernetes_get is unavailable: no cluster connection",
                fault=kernel.ToolFault.CONNECTION,
            )
        kind, name = arguments["kind"], arguments.get("name")
        now = datetime.now(UTC)
        try:
            if name:
                obj = await _read(kube, ROUTES[kind], name=name, ns=ctx.namespace)
                return dumps(detail(kind, obj, now=now))
            items, more = await _list(kube, ROUTES[kind], arguments, ns=ctx.namespace)
        except k8s.ApiException as exc:
            raise _error_for(exc, kind=kind, name=name, ns=ctx.namespace) from None
        except (aiohttp.ClientError, TimeoutError) as exc:
            fault = (
                kernel.ToolFault.TIMEOUT
                if isinstance(exc, TimeoutError)
                else kernel.ToolFault.CONNECTION
            )
            raise catalog.ToolError(
                f"kubernetes API unreachable: {clip(exc)}", fault=fault
            ) from None
        if kind == "events":
            items.sort(key=lambda e: event_time(e) or "", reverse=True)
            more = more or len(items) > arguments.get("limit", 20)
            items = items[: arguments.get("limit", 20)]
        rows = [summarize(kind, obj, now=now) for obj in items]
        return render_list(kind, rows, namespace=ctx.namespace, more=more)


async def _read(kube: Any, route: Route, *, name: str, ns: str) -> Obj:
    api = getattr(k8s, route.api)(kube)
    if route.custom is not None:
        group, version, plural = route.custom
        result: Obj = await api.get_namespaced_custom_object(group, version, ns, plural, name)
        return result
    obj = await getattr(api, f"read_namespaced_{route.stem}")(name, ns)
    plain: Obj = kube.sanitize_for_serialization(obj)
    return plain


async def _list(
    kube: Any, route: Route, arguments: Mapping[str, Any], *, ns: str
) -> tuple[list[Obj], bool]:
    """Items (plain dicts) and whether the server has more (`metadata.continue`)."""
    api = getattr(k8s, route.api)(kube)
    limit = EVENTS_FETCHED if route.stem == "event" else arguments.get("limit", 20)
    query: dict[str, Any] = {"limit": limit}
    if arguments.get("labelSelector"):
        query["label_selector"] = arguments["labelSelector"]
    if route.custom is not None:
        group, version, plural = route.custom
        result = await api.list_namespaced_custom_object(group, version, ns, plural, **query)
    else:
        listed = await getattr(api, f"list_namespaced_{route.stem}")(ns, **query)
        result = kube.sanitize_for_serialization(listed)
    return list(result.get("items") or []), bool((result.get("metadata") or {}).get("continue"))
