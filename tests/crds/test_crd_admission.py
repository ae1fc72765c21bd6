"""What the real kube-apiserver accepts, rejects, defaults and shows for the agentrun CRDs.

Each rejection must name the offending field, so a user reading `kubectl apply`'s error knows
what to fix.
"""

from __future__ import annotations

import json
import subprocess
import zoneinfo
from decimal import Decimal
from typing import Any

import pytest
from crd_support import (
    Apply,
    Kubectl,
    Manifest,
    explain,
    get_json,
    make_agentmodel,
    make_agentrun,
    without,
)

from agentrun import kernel, protocol
from agentrun.operator.runs import status as operator_status
from agentrun.operator.schedules import spec as cronspec

pytestmark = pytest.mark.usefixtures("crds")


def with_budget(**budget: Any) -> Manifest:
    return make_agentrun(budget=budget)


REJECTED_AGENTRUNS = [
    pytest.param(
        without(make_agentrun(), "spec.goal"), ["spec.goal", "Required value"], id="missing-goal"
    ),
    pytest.param(
        without(make_agentrun(), "spec.model"), ["spec.model", "Required value"], id="missing-model"
    ),
    pytest.param(
        without(make_agentrun(), "spec.model"),
        ["spec.model: Required value: set one of spec.model", "spec.agentRef"],
        id="neither-model-nor-agent-ref",
    ),
    pytest.param(
        make_agentrun(agentRef={"name": "geometry"}),
        ["spec.model: Forbidden: set exactly one of spec.model", "not both"],
        id="both-model-and-agent-ref",
    ),
    pytest.param(make_agentrun(goal=""), ["spec.goal", "at least 1 chars"], id="empty-goal"),
    pytest.param(
        make_agentrun(ttlSecondsAfterFinished=-1),
        ["spec.ttlSecondsAfterFinished", "greater than or equal to 0"],
        id="negative-ttl",
    ),
    pytest.param(
        make_agentrun(model="GPT_4o"), ["spec.model", "should match"], id="model-not-a-dns-name"
    ),
    pytest.param(
        with_budget(maxSteps=0),
        ["spec.budget.maxSteps", "greater than or equal to 1"],
        id="max-steps-zero",
    ),
    pytest.param(
        with_budget(maxSteps=1001),
        ["spec.budget.maxSteps", "less than or equal to 1000"],
        id="max-steps-over-1000",
    ),
    pytest.param(
        with_budget(maxToolCalls=-1),
        ["spec.budget.maxToolCalls", "greater than or equal to 1"],
        id="negative-max-tool-calls",
    ),
    pytest.param(
        with_budget(maxTokens=0),
        ["spec.budget.maxTokens", "greater than or equal to 1"],
        id="max-tokens-zero",
    ),
    pytest.param(
        with_budget(maxCostUSD="abc"),
        ["spec.budget.maxCostUSD", "should match"],
        id="max-cost-not-a-decimal",
    ),
    pytest.param(
        with_budget(maxCostUSD="0"),
        ["spec.budget.maxCostUSD must be greater than 0"],
        id="max-cost-zero",
    ),
    pytest.param(
        with_budget(maxCostUSD="0.000"),
        ["spec.budget.maxCostUSD must be greater than 0"],
        id="max-cost-zero-with-decimals",
    ),
    pytest.param(
        with_budget(maxCostUSD="1.1234567"),
        ["spec.budget.maxCostUSD", "should match"],
        id="max-cost-too-many-decimals",
    ),
    pytest.param(
        with_budget(timeout="5 minutes"),
        ["spec.budget.timeout", "must be a duration such as 90s, 2m or 1h30m"],
        id="timeout-not-a-duration",
    ),
    pytest.param(
        with_budget(timeout="0s"),
        ["spec.budget.timeout must be greater than 0s and at most 24h"],
        id="timeout-zero",
    ),
    pytest.param(
        with_budget(timeout="48h"),
        ["spec.budget.timeout must be greater than 0s and at most 24h"],
        id="timeout-over-24h",
    ),
    pytest.param(
        with_budget(noProgress={"window": 0}),
        ["spec.budget.noProgress.window", "greater than or equal to 1"],
        id="no-progress-window-zero",
    ),
    pytest.param(
        make_agentrun(tools=["calculate", "rm -rf /"]),
        ["spec.tools[1]", "should match"],
        id="tool-name-with-bad-characters",
    ),
    pytest.param(
        make_agentrun(tools=["calculate", "calculate"]),
        ["spec.tools[1]", "Duplicate value"],
        id="duplicate-tool",
    ),
    pytest.param(
        make_agentrun(tools=["calculate"], approval={"tools": ["sleep"]}),
        [
            "spec.approval.tools",
            "every tool in spec.approval.tools must also be listed in spec.tools",
        ],
        id="approval-tool-not-in-tools",
    ),
    pytest.param(
        without(make_agentrun(approval={"tools": ["sleep"]}), "spec.tools"),
        ["spec.approval.tools", "must also be listed in spec.tools"],
        id="approval-tool-without-any-tools",
    ),
    pytest.param(
        make_agentrun(tools=["calculate"], budget={"noProgress": {"pollable": ["sleep"]}}),
        ["spec.budget.noProgress.pollable", "must also be listed in spec.tools"],
        id="pollable-tool-not-in-tools",
    ),
    pytest.param(
        make_agentrun(colour="red"), ['unknown field "spec.colour"'], id="unknown-spec-field"
    ),
    pytest.param(
        with_budget(maxSteps=5, retries=3),
        ['unknown field "spec.budget.retries"'],
        id="unknown-budget-field",
    ),
    pytest.param(
        make_agentrun(output={}),
        ["spec.output.schema", "Required value"],
        id="output-without-schema",
    ),
    pytest.param(
        make_agentrun(name="run.v2"), ["metadata.name", "should match"], id="dotted-run-name"
    ),
]


@pytest.mark.parametrize(("manifest", "expected"), REJECTED_AGENTRUNS)
def test_api_server_rejects_invalid_agentrun_naming_the_field(
    apply: Apply, test_namespace: str, manifest: Manifest, expected: list[str]
) -> None:
    result = apply(manifest, namespace=test_namespace)
    assert result.returncode != 0, f"accepted: {result.stdout}"
    for fragment in expected:
        assert fragment in result.stderr


def make_cronagentrun(**spec: Any) -> Manifest:
    """A valid CronAgentRun; keyword arguments replace top-level spec fields."""
    body: dict[str, Any] = {
        "schedule": "30 6 * * 1-5",
        "runTemplate": {"spec": {"model": "mock", "goal": "add 2 and 3"}},
    }
    body.update(spec)
    return {
        "apiVersion": "agentrun.dev/v1alpha1",
        "kind": "CronAgentRun",
        "metadata": {"name": "nightly"},
        "spec": body,
    }


def template_meta(**metadata: dict[str, str]) -> dict[str, Any]:
    """CronAgentRun spec fields whose run template carries ``metadata``."""
    return {"runTemplate": {"metadata": metadata, "spec": {"model": "mock", "goal": "add"}}}


SCHEDULE_SHAPE = "must be five cron fields"
TEMPLATE_META = "spec.runTemplate.metadata"
REJECTED_CRONAGENTRUNS = [
    pytest.param({"schedule": "every 5 minutes"}, ["spec.schedule", SCHEDULE_SHAPE], id="words"),
    pytest.param({"schedule": "0 * * *"}, ["spec.schedule", SCHEDULE_SHAPE], id="four-fields"),
    pytest.param(
        {"schedule": "0 0 * * * * 2026"}, ["spec.schedule", SCHEDULE_SHAPE], id="seven-fields"
    ),
    pytest.param({"schedule": "@every 5m"}, ["spec.schedule", SCHEDULE_SHAPE], id="every-macro"),
    pytest.param(
        {"timeZone": "Europe Berlin"}, ["spec.timeZone", "should match"], id="zone-with-space"
    ),
    pytest.param({"timeZone": "../etc/passwd"}, ["spec.timeZone", "should match"], id="zone-path"),
    pytest.param(
        {"runTemplate": {"spec": {"model": "mock", "agentRef": {"name": "a"}, "goal": "g"}}},
        ["spec.runTemplate.spec.model: Forbidden", "not both"],
        id="template-with-model-and-agent-ref",
    ),
    pytest.param(
        {"runTemplate": {"spec": {"goal": "g"}}},
        ["spec.runTemplate.spec.model: Required value: set one of"],
        id="template-with-neither",
    ),
    pytest.param({"timeZone": "Europe/"}, ["spec.timeZone", "should match"], id="zone-slash"),
    pytest.param(
        {"timeZone": "Mars/Phobos City!"}, ["spec.timeZone", "should match"], id="zone-garbage"
    ),
    pytest.param({"timeZone": "UTC+25"}, ["spec.timeZone", "should match"], id="zone-utc-offset"),
    pytest.param({"timeZone": "Etc/GMT+15"}, ["spec.timeZone", "should match"], id="zone-gmt-15"),
    pytest.param({"timeZone": "Europe//Berlin"}, ["spec.timeZone", "should match"], id="zone-2-/"),
    pytest.param(
        {"timeZone": "Europe/Berlin_"}, ["spec.timeZone", "should match"], id="zone-end-_"
    ),
    pytest.param(
        {"timeZone": "Europe/Berlin2"}, ["spec.timeZone", "should match"], id="zone-digit"
    ),
    *(
        pytest.param(template_meta(**{part: meta}), [f"{TEMPLATE_META}.{field}", said], id=name)
        for name, part, meta, field, said in [
            ("label-value", "labels", {"team": "a b"}, "labels.team", "should match"),
            ("label-key", "labels", {"my team!": "x"}, "labels", "qualified name"),
            ("label-prefix", "labels", {"Example.com/x": "x"}, "labels", "qualified name"),
            ("annotation-key", "annotations", {"bad key": "x"}, "annotations", "qualified name"),
        ]
    ),
]


@pytest.mark.parametrize(("spec", "expected"), REJECTED_CRONAGENTRUNS)
def test_api_server_rejects_a_malformed_schedule_zone_or_template_metadata_naming_the_field(
    apply: Apply, test_namespace: str, spec: dict[str, Any], expected: list[str]
) -> None:
    result = apply(make_cronagentrun(**spec), namespace=test_namespace)
    assert result.returncode != 0, f"accepted: {result.stdout}"
    for fragment in expected:
        assert fragment in result.stderr


@pytest.mark.parametrize(
    "spec",
    [
        pytest.param({"schedule": "*/10 * * * * *"}, id="six-fields"),
        pytest.param({"schedule": " @Hourly "}, id="macro-any-case"),
        pytest.param({"schedule": "0 9 ? JAN-MAR MON#1"}, id="names-and-specials"),
        pytest.param({"timeZone": "America/Argentina/Buenos_Aires"}, id="three-part-zone"),
        pytest.param({"timeZone": "Etc/GMT+5"}, id="offset-zone"),
        # well-formed but unknown: the operator's Ready condition says InvalidTimeZone
        pytest.param({"timeZone": "Europe/Berlinn"}, id="unknown-zone"),
        pytest.param(
            template_meta(
                labels={"example.com/team": "", "a.b_c-D": "A.b_c", "x": "y" * 63},
                annotations={"example.com/note": "any text, spaces and all", "n": "x" * 9000},
            ),
            id="template-metadata",
        ),
    ],
)
def test_api_server_accepts_well_formed_schedules_and_time_zones(
    apply: Apply, kubectl: Kubectl, test_namespace: str, spec: dict[str, Any]
) -> None:
    result = apply(make_cronagentrun(**spec), namespace=test_namespace)
    assert result.returncode == 0, result.stderr
    assert kubectl("delete", "car", "nightly", "-n", test_namespace).returncode == 0


REAL_WORLD_KEYS = {"app.kubernetes.io/name": "web", "example.com/x-y_z.1": "v"}


def test_a_template_carries_every_annotation_key_the_api_server_accepts_on_a_run(
    apply: Apply, kubectl: Kubectl, test_namespace: str
) -> None:
    """Kubernetes checks an annotation key lower-cased (apimachinery's
    ``ValidateAnnotations``): ``Example.com/Note`` is a run's annotation, so a template
    holding it is no invalid one (a label key's prefix is checked as written)."""
    folded = {"example.com/\u212aey": "x", "\u0130d": "x"}  # Go's ToLower: 'k', 'i'
    annotations = {**REAL_WORLD_KEYS, "Example.COM/Note": "x", **folded}
    run = make_agentrun()
    run["metadata"] = {**run["metadata"], "labels": REAL_WORLD_KEYS, "annotations": annotations}
    result = apply(run, namespace=test_namespace)
    assert result.returncode == 0, result.stderr  # the API server's own rules
    spec = template_meta(labels=REAL_WORLD_KEYS, annotations=annotations)
    result = apply(make_cronagentrun(**spec), namespace=test_namespace)
    assert result.returncode == 0, result.stderr
    assert kubectl("delete", "car", "nightly", "-n", test_namespace).returncode == 0


def test_a_run_created_with_full_annotations_can_be_given_none_later(
    kubectl: Kubectl, test_namespace: str
) -> None:
    """Why a template leaves ``RUN_ANNOTATIONS_ROOM``: the API server checks the 262,144
    bytes on every update too, so a run created full is refused its admission's record, a
    cancel, an approval."""
    run = make_agentrun()
    full = cronspec.ANNOTATIONS_MAX_BYTES - len("n") - 10
    run["metadata"] = {**run["metadata"], "annotations": {"n": "x" * full}}
    created = kubectl("create", "-f", "-", "-n", test_namespace, input=json.dumps(run))
    assert created.returncode == 0, created.stderr  # not apply: its own annotation copies it
    cancel = ("annotate", "agentrun", "run", "agentrun.dev/cancel=true", "-n", test_namespace)
    refused = kubectl(*cancel, check=False)
    assert refused.returncode != 0 and "metadata.annotations: Too long" in refused.stderr


def test_api_server_accepts_every_iana_time_zone_name(
    kubectl: Kubectl, test_namespace: str
) -> None:
    """Every name the tz database ships (``zoneinfo.available_timezones()``, with the ``tzdata``
    wheel: about 600) passes the API server's check, each a CronAgentRun of its own in one
    server-side dry run."""
    zones = sorted(zoneinfo.available_timezones())
    assert len(zones) > 500
    items = []
    for index, zone in enumerate(zones):
        manifest = make_cronagentrun(timeZone=zone)
        manifest["metadata"] = {"name": f"zone-{index}", "annotations": {"zone": zone}}
        items.append(manifest)
    listed = {"apiVersion": "v1", "kind": "List", "items": items}
    result = kubectl(
        *("create", "--dry-run=server", "-o", "name", "-n", test_namespace, "-f", "-"),
        input=json.dumps(listed),
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert len(result.stdout.splitlines()) == len(zones)


def test_get_cronagentruns_shows_ready_and_reason(
    apply: Apply, kubectl: Kubectl, test_namespace: str
) -> None:
    assert apply(make_cronagentrun(), namespace=test_namespace).returncode == 0
    not_ready = {
        "conditions": [
            {
                "type": "Ready",
                "status": "False",
                "reason": "InvalidTimeZone",
                "message": "spec.timeZone: 'Europe/Berlinn' is not a time zone",
                "lastTransitionTime": "2026-01-01T00:00:00Z",
            }
        ]
    }
    kubectl(
        *("patch", "car", "nightly", "-n", test_namespace, "--subresource=status"),
        *("--type=merge", "-p", json.dumps({"status": not_ready})),
    )
    header, row = kubectl("get", "car", "nightly", "-n", test_namespace).stdout.splitlines()
    ready, reason, age = (header.index(name) for name in ("READY", "REASON", "AGE"))
    assert header.index("LAST SCHEDULE") < ready
    assert (row[ready:reason].strip(), row[reason:age].strip()) == ("False", "InvalidTimeZone")


REJECTED_AGENTMODELS = [
    pytest.param({"baseURL": "ftp://x"}, ["spec.baseURL", "should match"], id="ftp-base-url"),
    pytest.param(
        {"baseURL": "https://gateway:s3cret-key@llm.example.com/v1"},
        ["spec.baseURL must not carry credentials"],
        id="credentials-in-base-url",
    ),
    pytest.param(
        {"baseURL": "http://sk-123@llm.example.com"},
        ["spec.baseURL must not carry credentials"],
        id="user-alone-in-base-url",
    ),
    pytest.param(
        {"maxOutputTokens": 8192, "contextWindow": 8192},
        ["spec.maxOutputTokens must be smaller than spec.contextWindow"],
        id="max-output-equals-context-window",
    ),
    pytest.param(
        {"contextWindow": 4096},
        ["spec.maxOutputTokens must be smaller than spec.contextWindow"],
        id="default-max-output-not-below-context-window",
    ),
    pytest.param(
        {"credentials": {"secretRef": {"name": "openai"}}},
        ["spec.credentials.secretRef.namespace", "Required value"],
        id="secret-ref-without-namespace",
    ),
    pytest.param(
        {"pricing": {"outputPerMillionUSD": "-0.6"}},
        ["spec.pricing.outputPerMillionUSD", "should match"],
        id="negative-price",
    ),
    pytest.param({"temperature": 0.2}, ['unknown field "spec.temperature"'], id="unknown-field"),
]


@pytest.mark.parametrize(("spec", "expected"), REJECTED_AGENTMODELS)
def test_api_server_rejects_invalid_agentmodel_naming_the_field(
    apply: Apply, agentmodel_name: str, spec: dict[str, Any], expected: list[str]
) -> None:
    result = apply(make_agentmodel(agentmodel_name, **spec))
    assert result.returncode != 0, f"accepted: {result.stdout}"
    for fragment in expected:
        assert fragment in result.stderr


ACCEPTED_AGENTRUNS = [
    pytest.param(without(make_agentrun(), "spec.tools"), id="minimal-no-tools"),
    pytest.param(make_agentrun(ttlSecondsAfterFinished=0), id="ttl-zero-like-a-job"),
    pytest.param(
        with_budget(
            maxSteps=1000,
            maxToolCalls=1,
            maxTokens=9_000_000_000,
            maxCostUSD="0.000001",
            timeout="24h",
            noProgress={"window": 1, "pollable": ["sleep"]},
        ),
        id="budget-at-its-bounds",
    ),
    pytest.param(with_budget(maxCostUSD="12.50", timeout="1h30m"), id="compound-duration"),
    pytest.param(with_budget(timeout="1.5h"), id="fractional-duration"),
    pytest.param(with_budget(timeout="500ms"), id="millisecond-duration"),
    pytest.param(
        make_agentrun(
            instructions="You are terse.",
            approval={"tools": ["sleep"]},
            output={
                "schema": {
                    "type": "object",
                    "required": ["area"],
                    "properties": {"area": {"type": "number"}},
                }
            },
        ),
        id="approval-and-output-schema",
    ),
]


@pytest.mark.parametrize("manifest", ACCEPTED_AGENTRUNS)
def test_api_server_accepts_valid_agentrun(
    apply: Apply, test_namespace: str, manifest: Manifest
) -> None:
    result = apply(manifest, namespace=test_namespace)
    assert result.returncode == 0, result.stderr


def test_agentrun_budget_defaults_are_filled_in(
    apply: Apply, kubectl: Kubectl, test_namespace: str
) -> None:
    """maxSteps, maxToolCalls and timeout stay unset: the run's AgentTenant may default them
    (runBudget.default), so the API server must not (the operator falls back to 20, 50, 10m)."""
    assert apply(make_agentrun("defaults"), namespace=test_namespace).returncode == 0
    spec = get_json(kubectl, "agentrun", "defaults", "-n", test_namespace)["spec"]
    assert spec["budget"] == {"noProgress": {"window": 3}, "onExhausted": "summarize"}


def test_agentrun_defaults_leave_given_budget_fields_alone(
    apply: Apply, kubectl: Kubectl, test_namespace: str
) -> None:
    manifest = make_agentrun("partly", budget={"maxSteps": 7, "maxCostUSD": "0.25"})
    assert apply(manifest, namespace=test_namespace).returncode == 0
    budget = get_json(kubectl, "agentrun", "partly", "-n", test_namespace)["spec"]["budget"]
    assert (budget["maxSteps"], budget["maxCostUSD"]) == (7, "0.25")
    assert "maxToolCalls" not in budget and "timeout" not in budget


@pytest.mark.parametrize(
    "change",
    [
        pytest.param({"goal": "something else entirely"}, id="goal"),
        pytest.param({"budget": {"maxSteps": 40}}, id="budget-max-steps"),
        pytest.param({"tools": ["calculate"]}, id="tools"),
    ],
)
def test_agentrun_spec_is_immutable(
    apply: Apply, test_namespace: str, change: dict[str, Any]
) -> None:
    assert apply(make_agentrun("frozen"), namespace=test_namespace).returncode == 0
    result = apply(make_agentrun("frozen", **change), namespace=test_namespace)
    assert result.returncode != 0, f"accepted: {result.stdout}"
    assert "spec is immutable once the run is created" in result.stderr
    assert "agentrun.dev/cancel" in result.stderr


def test_agentrun_can_be_cancelled_by_annotation_despite_immutable_spec(
    apply: Apply, kubectl: Kubectl, test_namespace: str
) -> None:
    assert apply(make_agentrun("to-cancel"), namespace=test_namespace).returncode == 0
    kubectl("annotate", "agentrun", "to-cancel", "-n", test_namespace, "agentrun.dev/cancel=true")
    annotations = get_json(kubectl, "agentrun", "to-cancel", "-n", test_namespace)["metadata"][
        "annotations"
    ]
    assert annotations["agentrun.dev/cancel"] == "true"


FINISHED_STATUS = {
    "phase": "Succeeded",
    "terminalReason": "completed",
    "outcome": "ok",
    "message": "the model gave a final answer",
    "answer": "5",
    "usage": {
        "steps": 2,
        "toolCalls": 1,
        "toolFailures": 0,
        "corrections": 0,
        "inputTokens": 1200,
        "outputTokens": 80,
        "cachedInputTokens": 1000,
        "totalTokens": 1280,
        "costUSD": "0.000412",
        "wallSeconds": 4.25,
        "estimated": False,
    },
    "conditions": [
        {
            "type": "Ready",
            "status": "True",
            "reason": "Completed",
            "message": "",
            "lastTransitionTime": "2026-01-01T00:00:04Z",
            "observedGeneration": 1,
        }
    ],
    "observedGeneration": 1,
    "startTime": "2026-01-01T00:00:00Z",
    "completionTime": "2026-01-01T00:00:04Z",
    "lastEventSequence": 17,
}


def patch_status(
    kubectl: Kubectl, namespace: str, name: str, status: dict[str, Any]
) -> subprocess.CompletedProcess[str]:
    return kubectl(
        "patch",
        "agentrun",
        name,
        "-n",
        namespace,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps({"status": status}),
        check=False,
    )


def test_status_subresource_stores_the_operators_projection(
    apply: Apply, kubectl: Kubectl, test_namespace: str
) -> None:
    assert apply(make_agentrun("done"), namespace=test_namespace).returncode == 0
    result = patch_status(kubectl, test_namespace, "done", FINISHED_STATUS)
    assert result.returncode == 0, result.stderr
    stored = get_json(kubectl, "agentrun", "done", "-n", test_namespace)
    assert stored["status"] == FINISHED_STATUS
    assert stored["metadata"]["generation"] == 1


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        pytest.param(
            {"terminalReason": "timeout"},
            ["status.terminalReason", "Unsupported value"],
            id="reason-outside-the-closed-set",
        ),
        pytest.param({"phase": "Done"}, ["status.phase", "Unsupported value"], id="unknown-phase"),
        pytest.param(
            {"outcome": "failed"}, ["status.outcome", "Unsupported value"], id="unknown-outcome"
        ),
        pytest.param(
            {"usage": {"costUSD": "-1"}},
            ["status.usage.costUSD", "should match"],
            id="negative-cost",
        ),
    ],
)
def test_status_rejects_values_outside_its_vocabulary(
    apply: Apply,
    kubectl: Kubectl,
    test_namespace: str,
    status: dict[str, Any],
    expected: list[str],
) -> None:
    assert apply(make_agentrun("strict"), namespace=test_namespace).returncode == 0
    result = patch_status(kubectl, test_namespace, "strict", status)
    assert result.returncode != 0, f"accepted: {result.stdout}"
    for fragment in expected:
        assert fragment in result.stderr


def test_status_accepts_the_kernels_usage_shape_even_for_tiny_costs(
    apply: Apply, kubectl: Kubectl, test_namespace: str
) -> None:
    # str(Decimal) writes 1.5E-7; a rejected pattern would block the operator's whole patch.
    cost = kernel.Pricing(output_per_million=Decimal("0.15")).cost(
        input_tokens=0, cached_input_tokens=0, output_tokens=1
    )
    projected = protocol.usage_as_dict(kernel.Usage(input_tokens=3, output_tokens=1, cost_usd=cost))
    assert apply(make_agentrun("tiny"), namespace=test_namespace).returncode == 0
    result = patch_status(kubectl, test_namespace, "tiny", {"usage": projected})
    assert result.returncode == 0, result.stderr
    stored = get_json(kubectl, "agentrun", "tiny", "-n", test_namespace)["status"]["usage"]
    assert stored == projected


def operator_projection(phase: kernel.Phase) -> dict[str, Any]:
    state = kernel.RunState(
        messages=(),
        steps=3,
        tool_calls=2,
        tool_failures=1,
        corrections=1,
        usage=kernel.Usage(input_tokens=900, output_tokens=60, cached_input_tokens=512),
        phase=phase,
        answer="5" if phase is kernel.Phase.COMPLETED else None,
        message="turn 2 committed",
    )
    t0 = 1_767_225_600.0
    body: dict[str, Any] = operator_status.project(
        state.summary(), seq=9, start_time=t0, event_time=t0 + 4.5, generation=1
    )
    return body


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(operator_projection(kernel.Phase.RUNNING), id="running"),
        pytest.param(operator_projection(kernel.Phase.COMPLETED), id="completed"),
        pytest.param(operator_projection(kernel.Phase.MAX_STEPS), id="max-steps"),
        pytest.param(
            operator_status.rejected("no AgentModel 'mock'", at=1_767_225_600.0, generation=1),
            id="rejected-at-admission",
        ),
    ],
)
def test_status_stores_the_operators_projection_without_pruning(
    apply: Apply, kubectl: Kubectl, test_namespace: str, body: dict[str, Any]
) -> None:
    # A field the schema does not declare would be dropped silently; equality catches it.
    assert apply(make_agentrun("projected"), namespace=test_namespace).returncode == 0
    result = patch_status(kubectl, test_namespace, "projected", body)
    assert result.returncode == 0, result.stderr
    assert "unknown field" not in result.stderr
    # a None in a merge patch removes the field (how a cleared pendingApproval goes away)
    stored = {k: v for k, v in body.items() if v is not None}
    assert get_json(kubectl, "agentrun", "projected", "-n", test_namespace)["status"] == stored


def test_status_records_the_tenant_and_the_queue_position(
    apply: Apply, kubectl: Kubectl, test_namespace: str
) -> None:
    assert apply(make_agentrun("queued"), namespace=test_namespace).returncode == 0
    queued = {"phase": "Queued", "tenant": "team-a", "queuePosition": 3}
    result = patch_status(kubectl, test_namespace, "queued", queued)
    assert result.returncode == 0, result.stderr
    assert get_json(kubectl, "agentrun", "queued", "-n", test_namespace)["status"] == queued
    # admitted: the position goes away (None in a merge patch), the tenant stays
    result = patch_status(
        kubectl, test_namespace, "queued", {"phase": "Running", "queuePosition": None}
    )
    assert result.returncode == 0, result.stderr
    stored = get_json(kubectl, "agentrun", "queued", "-n", test_namespace)["status"]
    assert stored == {"phase": "Running", "tenant": "team-a"}


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        pytest.param(
            {"queuePosition": 0},
            ["status.queuePosition", "greater than or equal to 1"],
            id="queue-position-zero",
        ),
        pytest.param(
            {"tenant": 7}, ["status.tenant", "must be of type string"], id="tenant-not-a-string"
        ),
    ],
)
def test_status_rejects_invalid_tenant_fields(
    apply: Apply,
    kubectl: Kubectl,
    test_namespace: str,
    status: dict[str, Any],
    expected: list[str],
) -> None:
    assert apply(make_agentrun("tenanted"), namespace=test_namespace).returncode == 0
    result = patch_status(kubectl, test_namespace, "tenanted", status)
    assert result.returncode != 0, f"accepted: {result.stdout}"
    for fragment in expected:
        assert fragment in result.stderr


def test_get_agentruns_wide_shows_model_and_tenant(
    apply: Apply, kubectl: Kubectl, test_namespace: str
) -> None:
    assert apply(make_agentrun("wide"), namespace=test_namespace).returncode == 0
    assert patch_status(kubectl, test_namespace, "wide", {"tenant": "team-a"}).returncode == 0
    header, row = kubectl(
        "get", "ar", "wide", "-n", test_namespace, "-o", "wide"
    ).stdout.splitlines()
    names = header.split()
    starts = [header.index(f" {name} ") + 1 if i else 0 for i, name in enumerate(names[:-1])]
    starts.append(header.rindex(f" {names[-1]}") + 1)
    ends = [*starts[1:], None]
    columns = {n: row[a:b].strip() for n, a, b in zip(names, starts, ends, strict=True)}
    assert columns["MODEL"] == "mock"
    assert columns["TENANT"] == "team-a"


def test_get_agentruns_shows_phase_reason_steps_tokens_cost(
    apply: Apply, kubectl: Kubectl, test_namespace: str
) -> None:
    assert apply(make_agentrun("shown"), namespace=test_namespace).returncode == 0
    assert patch_status(kubectl, test_namespace, "shown", FINISHED_STATUS).returncode == 0
    header, row = kubectl("get", "ar", "-n", test_namespace).stdout.splitlines()
    assert header.split() == ["NAME", "PHASE", "REASON", "STEPS", "TOKENS", "COST", "AGE"]
    assert row.split()[:6] == ["shown", "Succeeded", "completed", "2", "1280", "0.000412"]


def test_get_agentmodels_shows_model_and_base_url_and_fills_defaults(
    apply: Apply, kubectl: Kubectl, agentmodel_name: str
) -> None:
    manifest = make_agentmodel(
        agentmodel_name, credentials={"secretRef": {"name": "openai", "namespace": "llm-keys"}}
    )
    result = apply(manifest)
    assert result.returncode == 0, result.stderr
    spec = get_json(kubectl, "agentmodel", agentmodel_name)["spec"]
    assert spec["credentials"]["secretRef"]["key"] == "apiKey"
    assert spec["pricing"] == {  # no cached price: the input price, not "0"
        "inputPerMillionUSD": "0",
        "outputPerMillionUSD": "0",
        "free": False,  # unpriced, not declared free: refused where a cost budget applies
    }
    assert (spec["contextWindow"], spec["maxOutputTokens"]) == (128000, 4096)
    header, row = kubectl("get", "am", agentmodel_name).stdout.splitlines()
    assert header.split() == ["NAME", "MODEL", "BASEURL", "AGE"]
    assert row.split()[:3] == [agentmodel_name, "scripted", manifest["spec"]["baseURL"]]


def test_agentmodel_prices_can_be_changed_by_the_platform_team(
    apply: Apply, kubectl: Kubectl, agentmodel_name: str
) -> None:
    assert apply(make_agentmodel(agentmodel_name)).returncode == 0
    repriced = make_agentmodel(agentmodel_name, pricing={"outputPerMillionUSD": "0.60"})
    result = apply(repriced)
    assert result.returncode == 0, result.stderr
    pricing = get_json(kubectl, "agentmodel", agentmodel_name)["spec"]["pricing"]
    assert pricing["outputPerMillionUSD"] == "0.60"


def test_explain_budget_gives_units_defaults_and_terminal_reasons(kubectl: Kubectl) -> None:
    text = " ".join(explain(kubectl, "agentrun.spec.budget").split())
    for fragment in [
        "maxSteps",
        "else 20",
        "max_steps",
        "maxToolCalls",
        "else 50",
        "tool_budget_exhausted",
        "maxTokens",
        "token_budget_exhausted",
        "maxCostUSD",
        "US dollars",
        "cost_budget_exhausted",
        "timeout",
        "else 10m",
        "at most 24h",
        "deadline_exceeded",
        "noProgress",
    ]:
        assert fragment in text


def test_explain_status_usage_describes_every_counter(kubectl: Kubectl) -> None:
    text = " ".join(explain(kubectl, "agentrun.status.usage").split())
    for fragment in [
        "steps",
        "toolCalls",
        "toolFailures",
        "corrections",
        "inputTokens",
        "outputTokens",
        "cachedInputTokens",
        "totalTokens",
        "costUSD",
        "wallSeconds",
        "estimated",
        "omitted it",
    ]:
        assert fragment in text


def test_explain_agentmodel_pricing_gives_the_unit(kubectl: Kubectl) -> None:
    text = " ".join(explain(kubectl, "agentmodel.spec.pricing").split())
    assert "per 1,000,000 tokens" in text


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"timeouts": {"discovery": "ten seconds"}}, "spec.timeouts.discovery"),
        ({"timeouts": {"call": "30"}}, "spec.timeouts.call"),
        ({"refreshInterval": "1d"}, "spec.refreshInterval"),
    ],
    ids=["discovery", "call", "refresh-in-days"],
)
def test_a_tool_servers_bad_duration_is_refused_with_examples(
    apply: Apply, spec: dict[str, Any], field: str
) -> None:
    manifest = {
        "apiVersion": "agentrun.dev/v1alpha1",
        "kind": "AgentToolServer",
        "metadata": {"name": "tools", "namespace": "default"},
        "spec": {"url": "http://tools.example:8080/mcp", "tools": [{"name": "add"}], **spec},
    }
    result = apply(manifest)
    assert result.returncode != 0, f"accepted: {result.stdout}"
    assert field in result.stderr
    assert "must be a duration such as 90s, 2m or 1h30m" in result.stderr
    assert "should match" not in result.stderr
