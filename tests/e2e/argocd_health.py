"""Runs the Argo CD health checks in docs/argocd the way Argo CD does: the Lua script with the
object as the global ``obj`` (a Lua table), in Lua 5.1 (Argo CD's gopher-lua is 5.1), through
lupa; the returned table is the health ``{status, message}``."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import yaml
from lupa import lua51

ROOT = Path(__file__).resolve().parents[2] / "docs/argocd/resource_customizations/agentrun.dev"
KINDS = ("AgentRun", "AgentTenant", "Agent", "CronAgentRun", "AgentEval")
STATUSES = {"Healthy", "Progressing", "Degraded", "Suspended", "Missing", "Unknown"}
WRITE = os.environ.get("AGENTRUN_WRITE_ARGOCD_TESTDATA") == "1"
"""Whether the e2e tests rewrite the Kinds' testdata/ and health_test.yaml from live objects."""


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


def anonymous(obj: dict[str, Any], namespace: str, tenant: str | None) -> dict[str, Any]:
    """The object with the test's random namespace and tenant names made stable."""
    text = json.dumps(obj).replace(namespace, "team-a")
    if tenant:
        text = text.replace(tenant, "team-a")
    loaded: dict[str, Any] = json.loads(text)
    return loaded


class Samples:
    """Live objects checked against their Kind's ``health.lua``, kept (made anonymous) to be
    written as its testdata when ``WRITE`` is set."""

    def __init__(self, namespace: str, tenant: str | None = None) -> None:
        self.namespace = namespace
        self.tenant = tenant
        self.by_kind: dict[str, list[tuple[str, dict[str, Any]]]] = {}

    def check(self, kind: str, case: str, obj: dict[str, Any], status: str) -> dict[str, str]:
        """Assert ``obj``'s health is ``status``; keep it as the sample ``case``; the health."""
        found = health(kind, obj)
        assert found["status"] == status, (case, found)
        anon = anonymous(obj, self.namespace, self.tenant)
        self.by_kind.setdefault(kind, []).append((case, anon))
        return found

    def write(self) -> None:
        """Rewrite each sampled Kind's testdata/ and health_test.yaml (only with ``WRITE``)."""
        if not WRITE:
            return
        for kind, cases in self.by_kind.items():
            folder = ROOT / kind
            tests = []
            for case, obj in cases:
                text = yaml.safe_dump(obj, sort_keys=False)
                (folder / "testdata" / f"{case}.yaml").write_text(text)
                tests.append(
                    {"healthStatus": health(kind, obj), "inputPath": f"testdata/{case}.yaml"}
                )
            (folder / "health_test.yaml").write_text(
                yaml.safe_dump({"tests": tests}, sort_keys=False, width=100)
            )
