"""The built-in tool catalog: the tool port (`catalog`) and the tools the worker ships.

What belongs here: tool declarations (`ToolSpec`), the `Tool` protocol, and tool
implementations, each in its own module (`calculate`, `sleep`, `kubernetes_get`, `http_get`),
and remote MCP tools (`remote`). What does
not: deciding whether a call may run (schema validation, permissions, budgets, approval) and
turning results into history messages; the worker does that, and the kernel imports none of
this package.
"""

from __future__ import annotations

from typing import Any

from .calculate import Calculate
from .catalog import Catalog, Tool, ToolContext, ToolError, ToolSpec
from .http_get import HttpGet
from .kubernetes_get import KubernetesGet
from .sleep import Sleep

__all__ = [
    "Calculate",
    "Catalog",
    "HttpGet",
    "KubernetesGet",
    "Sleep",
    "Tool",
    "ToolContext",
    "ToolError",
    "ToolSpec",
    "default_catalog",
]


def default_catalog(*, kube: Any | None = None) -> Catalog:
    """The built-in tools: calculate, sleep, kubernetes_get, http_get.

    `kube` (a kubernetes_asyncio ApiClient) is the client kubernetes_get falls back to when
    a call's `ToolContext.kube` is None; with neither, its calls fail with a ToolError. The
    tool is listed either way, so every worker offers the same catalog. `http_get` here allows
    no URL: the worker gives each run one with its tenant's rules.
    """
    return Catalog([Calculate(), Sleep(), KubernetesGet(kube), HttpGet()])
