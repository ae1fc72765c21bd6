"""The start-up CRD check: the chart's CRDs pass; an older or missing CRD is named precisely;
the fields the check requires are the ones the status projection writes."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from typing import Any

import kopf
import pytest
import yaml

from agentrun import kernel
from agentrun.operator import crdcheck
from agentrun.operator.platform import crdfields, health
from agentrun.operator.runs import status

ROOT = Path(__file__).resolve().parents[2]
CRD_DIRS = (ROOT / "crds", ROOT / "charts" / "agentrun" / "crds")


def installed(directory: Path) -> dict[str, dict[str, Any] | None]:
    found: dict[str, dict[str, Any] | None] = {}
    for path in sorted(directory.glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        found[crd["metadata"]["name"]] = crd
    return found


def run_schema(crds: dict[str, dict[str, Any] | None]) -> dict[str, Any]:
    crd = crds["agentruns.agentrun.dev"]
    assert crd is not None
    schema: dict[str, Any] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


@pytest.mark.parametrize("directory", CRD_DIRS, ids=lambda d: str(d.relative_to(ROOT)))
def test_the_shipped_crds_serve_everything_the_operator_writes(directory: Path) -> None:
    assert crdcheck.find_mismatches(installed(directory)) == []


def test_an_older_agentrun_crd_is_named_with_the_fields_it_lacks() -> None:
    """An AgentRun CRD from before lastEventSequence and ttlSecondsAfterFinished."""
    crds = copy.deepcopy(installed(CRD_DIRS[0]))
    schema = run_schema(crds)
    del schema["properties"]["status"]["properties"]["lastEventSequence"]
    del schema["properties"]["status"]["properties"]["usage"]["properties"]["totalTokens"]
    del schema["properties"]["spec"]["properties"]["ttlSecondsAfterFinished"]
    problems = crdcheck.find_mismatches(crds)
    assert problems == [
        "CRD agentruns.agentrun.dev lacks .status fields: usage.totalTokens, lastEventSequence",
        "CRD agentruns.agentrun.dev lacks .spec fields: ttlSecondsAfterFinished",
    ]


def test_an_older_agentmodel_crd_that_defaults_the_cached_price_is_named() -> None:
    """An unset cached price is the input price: the CRD of a release before, which defaulted
    it to "0", would write a free "0" into every new AgentModel."""
    crds = copy.deepcopy(installed(CRD_DIRS[0]))
    crd = crds["agentmodels.agentrun.dev"]
    assert crd is not None
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    cached = spec["properties"]["pricing"]["properties"]["cachedInputPerMillionUSD"]
    assert "default" not in cached
    cached["default"] = "0"
    assert crdcheck.find_mismatches(crds) == [
        "CRD agentmodels.agentrun.dev defaults .spec fields whose absence now means something "
        "(an older release's CRD): pricing.cachedInputPerMillionUSD"
    ]


def test_a_missing_crd_an_unserved_version_and_no_status_subresource_are_each_named() -> None:
    crds = copy.deepcopy(installed(CRD_DIRS[0]))
    crds["agenttenants.agentrun.dev"] = None
    model = crds["agentmodels.agentrun.dev"]
    assert model is not None
    model["spec"]["versions"][0]["served"] = False
    run = crds["agentruns.agentrun.dev"]
    assert run is not None
    del run["spec"]["versions"][0]["subresources"]["status"]
    assert crdcheck.find_mismatches(crds) == [
        "CRD agentmodels.agentrun.dev does not serve v1alpha1",
        "CRD agentruns.agentrun.dev has no status subresource",
        "CRD agenttenants.agentrun.dev is not installed",
    ]


def test_a_crd_of_another_kind_under_the_name_is_refused() -> None:
    crds = copy.deepcopy(installed(CRD_DIRS[0]))
    run = crds["agentruns.agentrun.dev"]
    assert run is not None
    run["spec"]["names"]["kind"] = "Workflow"
    assert crdcheck.find_mismatches(crds)[0].endswith("serves kind 'Workflow', not AgentRun")


def test_a_status_that_preserves_unknown_fields_serves_every_field() -> None:
    crds = copy.deepcopy(installed(CRD_DIRS[0]))
    run_schema(crds)["properties"]["status"] = {
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": True,
    }
    assert crdcheck.find_mismatches(crds) == []


def paths(body: dict[str, Any], prefix: str = "") -> set[str]:
    found: set[str] = set()
    for key, value in body.items():
        if key == "usage" and isinstance(value, dict):
            found |= paths(value, prefix=f"{prefix}{key}.")
        else:
            found.add(f"{prefix}{key}")
    return found


def test_every_status_field_the_projection_writes_is_required_of_the_crd() -> None:
    state = kernel.initial_state(goal="g")
    ended = dataclasses.replace(state, phase=kernel.Phase.COMPLETED, answer="42").summary()
    written = paths(
        status.project(ended, seq=3, start_time=1.0, event_time=2.0, generation=1, tenant="t")
    )
    written |= paths(status.rejected("no", at=1.0, generation=1, tenant="t"))
    written |= paths(
        status.queued(tenant="t", reason="Waiting", message="m", position=1, at=1.0, generation=1)
    )
    run = next(need for need in crdcheck.REQUIRED if need.kind == "AgentRun")
    assert written <= set(run.status_fields)


def served_by(directory: Path) -> dict[str, tuple[str, tuple[str, ...], tuple[str, ...]]]:
    served = {}
    for crd in installed(directory).values():
        assert crd is not None
        properties = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]
        names = crd["spec"]["names"]
        served[names["kind"]] = (
            names["plural"],
            crdcheck.schema_paths(properties.get("spec") or {}),
            crdcheck.schema_paths(properties.get("status") or {}),
        )
    return served


@pytest.mark.parametrize("directory", CRD_DIRS, ids=lambda d: str(d.relative_to(ROOT)))
def test_the_check_requires_every_field_of_every_crd_the_operator_ships(directory: Path) -> None:
    """``crdfields`` is ``crds/`` as the check reads it: a field added to a CRD is required of
    the installed one from then on, so an older CRD that would prune it is named at start."""
    served = served_by(directory)
    assert served == crdfields.SERVED, (
        f"operator/platform/crdfields.py should read: SERVED = {served!r}"
    )


def test_every_kind_the_operator_handles_is_checked() -> None:
    """A kind the operator watches whose CRD is missing would fail its watch for ever instead
    of the operator saying so at start."""
    from agentrun.operator import handlers as registered

    assert registered.REGISTERED
    registry = kopf.get_default_registry()
    handlers = [
        *registry._changing.get_all_handlers(),
        *registry._watching.get_all_handlers(),
        *registry._spawning.get_all_handlers(),
    ]
    watched = {h.selector.any_name for h in handlers if h.selector is not None}
    assert watched == {need.plural for need in crdcheck.REQUIRED}


@pytest.mark.parametrize(
    ("kind", "section", "path"),
    [
        ("Agent", None, None),
        ("AgentToolServer", None, None),
        ("AgentRun", "spec", ("approval", "tools")),
        ("AgentRun", "status", ("resolvedSpec",)),
        ("AgentTenant", "spec", ("runBudget", "max", "maxCostUSD")),
        ("AgentToolServer", "spec", ("timeouts", "discovery")),
    ],
)
def test_a_missing_kind_or_any_older_field_is_named(
    kind: str, section: str | None, path: tuple[str, ...] | None
) -> None:
    crds = copy.deepcopy(installed(CRD_DIRS[0]))
    need = next(n for n in crdcheck.REQUIRED if n.kind == kind)
    if section is None or path is None:
        crds[need.crd_name] = None
        assert crdcheck.find_mismatches(crds) == [f"CRD {need.crd_name} is not installed"]
        return
    crd = crds[need.crd_name]
    assert crd is not None
    node = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"][section]
    for part in path[:-1]:
        node = node["properties"][part]
    del node["properties"][path[-1]]
    assert crdcheck.find_mismatches(crds) == [
        f"CRD {need.crd_name} lacks .{section} fields: {'.'.join(path)}"
    ]


def test_readiness_answers_503_until_the_crds_match_and_liveness_always_200() -> None:
    probes = health.Health()
    assert probes.answer("/readyz")[0] == 503
    assert probes.answer("/healthz")[0] == 200
    probes.set_ready(False)
    code, body = probes.answer("/readyz")
    assert (code, body) == (503, "not ready: " + probes.reason + "\n")
    probes.set_ready(True)
    assert probes.answer("/readyz") == (200, "ready standby\n")
    probes.role = "leader"
    assert probes.answer("/readyz") == (200, "ready leader\n")
    assert probes.answer("/metrics")[0] == 404
