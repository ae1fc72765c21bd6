"""Every size is bounded where it enters: each string, list and map of every CRD has a bound
the API server checks (maxLength or an enum, maxItems, maxProperties), so no single field can
make an object larger than an event, a Kubernetes Event or a status can carry. The few fields
the API server cannot bound (``x-kubernetes-preserve-unknown-fields`` subtrees: CEL cannot
measure their serialized size) are listed below with the operator-side bound that covers
each, and that bound is checked to exist."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from crd_support import CHART_DIR, CRD_DIR

from agentrun.kernel import schemas
from agentrun.operator.runs import status as run_status
from agentrun.operator.toolservers import status as server_status

SERVER_SET = {".apiVersion", ".kind"}
"""Type meta: set by the API server from the request's URL and checked against the kind."""


def _schema_bytes_bound() -> str:
    return f"{schemas.MAX_SCHEMA_BYTES} bytes as JSON (agentrun.kernel.schemas.schema_problem)"


EXCEPTIONS: dict[tuple[str, str], str] = {
    ("AgentRun", ".spec.output.schema"): "admission ends the run invalid_spec naming the field "
    "past " + _schema_bytes_bound(),
    ("Agent", ".spec.output.schema"): "the Agent's Ready=False InvalidSpec, and a run of it "
    "ends invalid_spec naming the Agent's field, past " + _schema_bytes_bound(),
    ("CronAgentRun", ".spec.runTemplate.spec.output.schema"): "the runs it creates are "
    "AgentRuns: admission refuses them past " + _schema_bytes_bound(),
    ("AgentEval", ".spec.cases[].expect.answer.jsonSchema"): "the suite fails InvalidSpec "
    "naming the case and field past " + _schema_bytes_bound(),
    ("AgentRun", ".status.pendingApproval"): "written by the operator, at most "
    f"{run_status.MAX_PENDING_BYTES} bytes (operator.runs.status.bounded_pending)",
    ("AgentRun", ".status.resolvedSpec"): "written by the operator from bounded fields: goal and "
    "instructions rendered to at most 65536 characters (operator.agents.resolve), the Agent's "
    "output schema at most " + _schema_bytes_bound(),
    ("AgentToolServer", ".status.tools[].inputSchema"): "written by the operator: each at most "
    f"{_schema_bytes_bound()}, all of one status at most {server_status.MAX_SCHEMAS_BYTES} "
    "bytes (operator.toolservers.status)",
}


def _crds(folder: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    for path in sorted(folder.glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        for version in crd["spec"]["versions"]:
            yield crd["spec"]["names"]["kind"], version["schema"]["openAPIV3Schema"]


def unbounded(node: dict[str, Any], path: str = "") -> Iterator[str]:
    """The paths (``.spec.tools[]``, ``.metadata.labels{}``) of ``node``'s fields without a
    bound the API server checks."""
    kind = node.get("type")
    if node.get("x-kubernetes-preserve-unknown-fields"):
        yield path
        return
    if kind == "string" and "maxLength" not in node and "enum" not in node:
        yield path
    if kind == "array":
        if "maxItems" not in node:
            yield path
        yield from unbounded(node.get("items") or {}, path + "[]")
    values = node.get("additionalProperties")
    if isinstance(values, dict):
        if "maxProperties" not in node:
            yield path
        yield from unbounded(values, path + "{}")
    for name, child in (node.get("properties") or {}).items():
        yield from unbounded(child, f"{path}.{name}")


@pytest.mark.parametrize("folder", [CRD_DIR, CHART_DIR / "crds"], ids=["crds", "chart"])
def test_every_crd_field_is_bounded_or_a_listed_exception(folder: Path) -> None:
    found = {(kind, path) for kind, schema in _crds(folder) for path in unbounded(schema)}
    found = {(kind, path) for kind, path in found if path not in SERVER_SET}
    assert sorted(found - EXCEPTIONS.keys()) == [], "give these a bound (or list why not)"
    assert sorted(EXCEPTIONS.keys() - found) == [], "listed exceptions that are bounded now"


def test_the_walk_finds_each_kind_of_unbounded_field() -> None:
    schema = {
        "type": "object",
        "properties": {
            "s": {"type": "string"},
            "e": {"type": "string", "enum": ["a"]},
            "a": {"type": "array", "items": {"type": "string", "maxLength": 3}},
            "m": {"type": "object", "additionalProperties": {"type": "string"}},
            "p": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
            "ok": {"type": "array", "maxItems": 2, "items": {"type": "integer"}},
        },
    }
    assert sorted(unbounded(schema)) == [".a", ".m", ".m{}", ".p", ".s"]


def test_the_operator_bounds_of_the_exceptions_hold() -> None:
    large = {"description": "x" * schemas.MAX_SCHEMA_BYTES}
    assert "over the 65536-byte limit" in str(schemas.schema_problem(large))
    held = [
        {"toolCallID": f"c{i}", "tool": "t", "arguments": "y" * 65_536, "digest": "d"}
        for i in range(40)
    ]
    pending = {**held[0], "call": 1, "of": 40, "heldCalls": held}
    bounded = run_status.bounded_pending(pending)
    size = len(json.dumps(bounded, separators=(",", ":")).encode())
    assert size <= run_status.MAX_PENDING_BYTES
    assert bounded is not None and bounded["arguments"] == "y" * 65_536  # the call decided now
    assert bounded["heldCalls"][1]["arguments"].startswith("(arguments of 65536 bytes elided")
