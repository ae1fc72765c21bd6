"""Runs the Argo CD health checks in docs/argocd the way Argo CD does: the Lua script with the
object as the global ``obj`` (a Lua table), in Lua 5.1 (Argo CD's gopher-lua is 5.1), through
lupa; the returned table is the health ``{status, message}``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from lupa import lua51

ROOT = Path(__file__).resolve().parents[2] / "docs/argocd/resource_customizations/agentrun.dev"
KINDS = ("AgentRun", "AgentTenant", "Agent", "CronAgentRun", "AgentEval")
STATUSES = {"Healthy", "Progressing", "Degraded", "Suspended", "Missing", "Unknown"}


def _to_lua(lua: Any, value: Any) -> Any:
    if isinstance(value, dict):
        return lua.table_from({k: _to_lua(lua, v) for k, v in value.items()})
    if isinstance(value, list):
        return lua.table_from([_to_lua(lua, v) for v in value])
    return value


def health(kind: str, obj: dict[str, Any]) -> dict[str, str]:
    """The health ``{"status", "message"}`` Argo CD computes for ``obj`` with the Kind's
    ``health.lua``; raises ``lupa.LuaError`` if the script fails."""
    lua = lua51.LuaRuntime(unpack_returned_tuples=True)
    lua.globals().obj = _to_lua(lua, obj)
    result = lua.execute((ROOT / kind / "health.lua").read_text())
    found = {key: result[key] for key in ("status", "message") if result[key] is not None}
    assert found.get("status") in STATUSES, found
    return found


def test_cases(kind: str) -> list[tuple[dict[str, str], Path]]:
    """The Kind's ``health_test.yaml`` cases: (expected health, input object file)."""
    spec = yaml.safe_load((ROOT / kind / "health_test.yaml").read_text())
    return [(case["healthStatus"], ROOT / kind / case["inputPath"]) for case in spec["tests"]]


def clean(obj: dict[str, Any]) -> dict[str, Any]:
    """An object as read from the API server, without the fields that only add noise to test
    data (managedFields, the last-applied copy, kopf's bookkeeping)."""
    meta = dict(obj.get("metadata") or {})
    meta.pop("managedFields", None)
    annotations = {
        k: v
        for k, v in (meta.get("annotations") or {}).items()
        if not k.startswith("kopf.") and k != "kubectl.kubernetes.io/last-applied-configuration"
    }
    if annotations:
        meta["annotations"] = annotations
    else:
        meta.pop("annotations", None)
    return {**obj, "metadata": meta}
