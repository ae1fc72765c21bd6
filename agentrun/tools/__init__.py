"""The built-in tool catalog: the tool port (`catalog`) and the tools the worker ships.

What belongs here: tool declarations (`ToolSpec`), the `Tool` protocol, and tool
implementations, each in its own module (`calculate`, `sleep`, `kubernetes_get`, `http_get`,
`prometheus_query`),
and remote MCP tools (`remote`; a server's `endpoint` and how a session is opened on it; the
worker's reused MCP sessions in `sessions`), and the bound on the informational heads a
peer's answer opens with (`heads`, which the worker's model client uses too). What does
not: deciding whether a call may run (schema validation, permissions, budgets, approval) and
turning results into history messages; the worker does that, and the kernel imports none of
this package.
"""

from __future__ import annotations

from typing import Any

from . import prometheus_query
from .calculate import Calculate
from .catalog import Catalog, Tool, ToolContext, ToolError, ToolSpec
from .http_get import HttpGet
from .kubernetes_get import KubernetesGet
from .prometheus_query import PrometheusQuery
from .sleep import Sleep

__all__ = [
    "Calculate",
    "Catalog",
    "HttpGet",
    "KubernetesGet",
    "PrometheusQuery",
    "Sleep",
    "Tool",
    "ToolContext",
    "ToolError",
    "ToolSpec",
    "default_catalog",
]


def default_catalog(
    *,
    kube: Any | None = None,
    prometheus_url: str | None = None,
    prometheus_scope_label: str = prometheus_query.DEFAULT_SCOPE_LABEL,
) -> Catalog:
    """The built-in tools: calculate, sleep, kubernetes_get, http_get, prometheus_query.

    `kube` (a kubernetes_asyncio ApiClient) is the client kubernetes_get falls back to when
    a call's `ToolContext.kube` is None; with neither, its calls fail with a ToolError. The
    tool is listed either way, so every worker offers the same catalog. `http_get` here allows
    no URL: the worker gives each run one with its tenant's rules. `prometheus_query` queries
    `prometheus_url` (None: its calls fail saying none is configured), only for series whose
    `prometheus_scope_label` is the run's namespace.
    """
    prometheus = PrometheusQuery(prometheus_url, scope_label=prometheus_scope_label)
    return Catalog([Calculate(), Sleep(), KubernetesGet(kube), HttpGet(), prometheus])
