"""The CRD files themselves, without a cluster: names, field sets, descriptions, vocabularies.

The field sets are the contract of docs/contracts.md and docs/architecture.md; the terminal
reasons are the closed set of agentrun.kernel.terminal.TerminalReason.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from crd_support import (
    AGENT_CRD,
    AGENTEVAL_CRD,
    AGENTMODEL_CRD,
    AGENTRUN_CRD,
    AGENTTENANT_CRD,
    AGENTTOOLSERVER_CRD,
    CRD_DIR,
    CRON_CRD,
)

from agentrun.kernel import terminal
from agentrun.operator.schedules.plan import ConcurrencyPolicy

Schema = dict[str, Any]


def load_crd(path: Path) -> dict[str, Any]:
    docs = [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]
    assert len(docs) == 1, f"{path.name}: expected one document, found {len(docs)}"
    crd: dict[str, Any] = docs[0]
    return crd


def root_schema(path: Path) -> Schema:
    (version,) = load_crd(path)["spec"]["versions"]
    schema: Schema = version["schema"]["openAPIV3Schema"]
    return schema


def walk_fields(schema: Schema, path: str = "") -> Iterator[tuple[str, Schema]]:
    """Every named field below `schema` as (dotted path, its schema), through list items."""
    for name, child in schema.get("properties", {}).items():
        child_path = f"{path}.{name}" if path else name
        yield child_path, child
        yield from walk_fields(child, child_path)
    if "items" in schema:
        yield from walk_fields(schema["items"], f"{path}[]")


def at(schema: Schema, dotted_path: str) -> Schema:
    """The schema of a field; a JSONPath filter (``conditions[?(@.type=="Ready")]``) selects
    the list's items."""
    node = schema
    for name in re.sub(r"\[\?\(.*?\)\]", "[]", dotted_path).split("."):
        listed = name.endswith("[]")
        node = node["properties"][name.removesuffix("[]")]
        if listed:
            node = node["items"]
    return node


CRD_FILES = pytest.mark.parametrize(
    "path",
    [
        AGENTRUN_CRD,
        AGENTMODEL_CRD,
        AGENTTENANT_CRD,
        AGENTTOOLSERVER_CRD,
        AGENT_CRD,
        CRON_CRD,
        AGENTEVAL_CRD,
    ],
    ids=lambda path: path.name.split("_")[1],
)


def test_crd_directory_holds_exactly_the_agentrun_crds() -> None:
    assert sorted(path.name for path in CRD_DIR.iterdir()) == [
        "agentrun.dev_agentevals.yaml",
        "agentrun.dev_agentmodels.yaml",
        "agentrun.dev_agentruns.yaml",
        "agentrun.dev_agents.yaml",
        "agentrun.dev_agenttenants.yaml",
        "agentrun.dev_agenttoolservers.yaml",
        "agentrun.dev_cronagentruns.yaml",
    ]


@pytest.mark.parametrize(
    ("path", "scope", "kind", "plural", "short_name"),
    [
        pytest.param(AGENTRUN_CRD, "Namespaced", "AgentRun", "agentruns", "ar", id="agentruns"),
        pytest.param(
            AGENTMODEL_CRD, "Cluster", "AgentModel", "agentmodels", "am", id="agentmodels"
        ),
        pytest.param(
            AGENTTENANT_CRD, "Cluster", "AgentTenant", "agenttenants", "at", id="agenttenants"
        ),
        pytest.param(
            AGENTTOOLSERVER_CRD,
            "Namespaced",
            "AgentToolServer",
            "agenttoolservers",
            "ats",
            id="agenttoolservers",
        ),
        pytest.param(
            CRON_CRD, "Namespaced", "CronAgentRun", "cronagentruns", "car", id="cronagentruns"
        ),
    ],
)
def test_crd_names_group_and_version(
    path: Path, scope: str, kind: str, plural: str, short_name: str
) -> None:
    crd = load_crd(path)
    assert crd["apiVersion"] == "apiextensions.k8s.io/v1"
    assert crd["metadata"]["name"] == f"{plural}.agentrun.dev"
    spec = crd["spec"]
    assert (spec["group"], spec["scope"]) == ("agentrun.dev", scope)
    assert spec["names"]["kind"] == kind
    assert spec["names"]["listKind"] == f"{kind}List"
    assert spec["names"]["singular"] == kind.lower()
    assert spec["names"]["plural"] == plural
    assert spec["names"]["shortNames"] == [short_name]
    assert spec["names"]["categories"] == ["agentrun-all"]
    (version,) = spec["versions"]
    assert (version["name"], version["served"], version["storage"]) == ("v1alpha1", True, True)
    assert version["subresources"] == {"status": {}}


def test_no_category_shadows_a_resource_name() -> None:
    """`kubectl get agents` must list Agents: a category that equals any kind's plural,
    singular or short name makes kubectl expand it to every kind of the category instead."""
    crds = [load_crd(path) for path in sorted(CRD_DIR.glob("*.yaml"))]
    resource_names = {
        name
        for crd in crds
        for name in [
            crd["spec"]["names"]["plural"],
            crd["spec"]["names"]["singular"],
            *crd["spec"]["names"].get("shortNames", []),
        ]
    }
    categories = {
        category for crd in crds for category in crd["spec"]["names"].get("categories", [])
    }
    assert categories == {"agentrun-all"}
    assert categories & resource_names == set()


@CRD_FILES
def test_every_field_has_a_description(path: Path) -> None:
    # metadata is the one exception: the API server forbids describing it in a CRD schema.
    undescribed = [
        field
        for field, schema in walk_fields(root_schema(path))
        if not field.startswith("metadata") and not schema.get("description", "").strip()
    ]
    assert undescribed == []


@CRD_FILES
def test_status_declares_no_defaults(path: Path) -> None:
    status = root_schema(path)["properties"]["status"]
    assert [field for field, schema in walk_fields(status) if "default" in schema] == []


def test_agentrun_spec_fields_are_the_contract() -> None:
    spec = at(root_schema(AGENTRUN_CRD), "spec")
    assert set(spec["properties"]) == {
        "model",
        "instructions",
        "goal",
        "tools",
        "output",
        "budget",
        "approval",
        "ttlSecondsAfterFinished",
        "agentRef",  # a run of an Agent: exactly one of model and agentRef (CEL)
    }
    assert set(spec["required"]) == {"goal"}
    assert set(at(spec, "output")["properties"]) == {"schema"}
    assert set(at(spec, "budget")["properties"]) == {
        "maxSteps",
        "maxToolCalls",
        "maxTokens",
        "maxCostUSD",
        "timeout",
        "noProgress",
        "onExhausted",  # summarize | stop at a step, token or cost cap
    }
    assert set(at(spec, "budget.noProgress")["properties"]) == {"window", "pollable"}
    assert set(at(spec, "approval")["properties"]) == {"tools"}


def test_agentrun_status_fields_are_the_contract() -> None:
    status = at(root_schema(AGENTRUN_CRD), "status")
    assert set(status["properties"]) == {
        "phase",
        "tenant",  # the AgentTenant the run is charged to
        "queuePosition",  # 1-based place in the tenant's admission queue while Queued
        "terminalReason",
        "outcome",
        "message",
        "answer",
        "usage",
        "budget",  # the caps it was admitted with (defaults and the tenant's runBudget applied)
        "pendingApproval",
        "agent",  # a run of an Agent: its name, generation and the resolved spec's digest
        "resolvedSpec",  # a run of an Agent: the spec it executes
        "conditions",
        "observedGeneration",
        "startTime",
        "completionTime",
        "lastEventSequence",
        "reruns",  # the run's life: times started again from turn 0 (its admission seals it)
    }
    assert set(at(status, "budget")["properties"]) == {  # spec.budget's caps, by its names
        "maxSteps",
        "maxToolCalls",
        "maxTokens",
        "maxCostUSD",
        "timeout",
    }
    assert set(at(status, "usage")["properties"]) == {
        "steps",
        "toolCalls",
        "toolFailures",
        "toolCallsNotRun",  # valid calls a budget cut or a reviewer denied: neither ran nor failed
        "corrections",
        "inputTokens",
        "outputTokens",
        "cachedInputTokens",
        "reasoningTokens",
        "totalTokens",
        "costUSD",
        "wallSeconds",
        "estimated",
        "eventBytes",
    }


def test_agentrun_status_vocabularies_match_the_kernel_enums() -> None:
    status = at(root_schema(AGENTRUN_CRD), "status")
    assert at(status, "terminalReason")["enum"] == [r.value for r in terminal.TerminalReason]
    assert at(status, "phase")["enum"] == [p.value for p in terminal.ResourcePhase]
    assert at(status, "outcome")["enum"] == [o.value for o in terminal.Outcome]


def test_terminal_reason_description_explains_every_reason() -> None:
    description = at(root_schema(AGENTRUN_CRD), "status.terminalReason")["description"]
    unexplained = [r.value for r in terminal.TerminalReason if f"{r.value}:" not in description]
    assert unexplained == []


@pytest.mark.parametrize(
    ("field", "reason"),
    [
        ("maxSteps", "max_steps"),
        ("maxToolCalls", "tool_budget_exhausted"),
        ("maxTokens", "token_budget_exhausted"),
        ("maxCostUSD", "cost_budget_exhausted"),
        ("timeout", "deadline_exceeded"),
        ("noProgress.window", "no_progress"),
    ],
)
def test_each_budget_field_names_the_terminal_reason_it_ends_a_run_with(
    field: str, reason: str
) -> None:
    budget = at(root_schema(AGENTRUN_CRD), "spec.budget")
    assert reason in at(budget, field)["description"]


def test_agentmodel_spec_fields_are_the_contract() -> None:
    spec = at(root_schema(AGENTMODEL_CRD), "spec")
    assert set(spec["properties"]) == {
        "baseURL",
        "model",
        "credentials",
        "pricing",
        "contextWindow",
        "maxOutputTokens",
    }
    assert set(spec["required"]) == {"baseURL", "model"}
    assert set(at(spec, "credentials.secretRef")["properties"]) == {"name", "namespace", "key"}
    assert set(at(spec, "pricing")["properties"]) == {
        "inputPerMillionUSD",
        "cachedInputPerMillionUSD",
        "outputPerMillionUSD",
        "free",
    }


@CRD_FILES
def test_printer_columns_point_at_declared_fields(path: Path) -> None:
    (version,) = load_crd(path)["spec"]["versions"]
    schema = root_schema(path)
    for column in version["additionalPrinterColumns"]:
        json_path = column["jsonPath"]
        if json_path == ".metadata.creationTimestamp":
            continue
        field = at(schema, json_path.removeprefix("."))
        if column["type"] == "date":  # a date column shows the age of an RFC 3339 time
            assert field.get("format") == "date-time", column["name"]
        else:
            assert field["type"] == column["type"], column["name"]


def printer_columns(path: Path) -> list[tuple[str, str, str, int]]:
    (version,) = load_crd(path)["spec"]["versions"]
    return [
        (column["name"], column["type"], column["jsonPath"], column.get("priority", 0))
        for column in version["additionalPrinterColumns"]
    ]


def test_agentrun_shows_its_tenant_in_the_wide_output() -> None:
    assert ("Tenant", "string", ".status.tenant", 1) in printer_columns(AGENTRUN_CRD)


def test_agentrun_shows_its_outcome_in_the_wide_output() -> None:
    assert ("Outcome", "string", ".status.outcome", 1) in printer_columns(AGENTRUN_CRD)


def test_agenttenant_printer_columns() -> None:
    assert printer_columns(AGENTTENANT_CRD) == [
        ("Active", "integer", ".status.activeRuns", 0),
        ("Queued", "integer", ".status.queuedRuns", 0),
        ("Tokens", "integer", ".status.budget.tokens.used", 0),
        ("Cost", "string", ".status.budget.costUSD.used", 0),
        # string: a date column prints <invalid> for a time in the future
        ("Reset", "string", ".status.resetTime", 0),
        ("Age", "date", ".metadata.creationTimestamp", 0),
    ]


RUN_BUDGET_FIELDS = {"maxSteps", "maxToolCalls", "maxTokens", "maxCostUSD", "timeout"}


def test_agenttenant_spec_fields_are_the_contract() -> None:
    spec = at(root_schema(AGENTTENANT_CRD), "spec")
    assert set(spec["properties"]) == {
        "namespaces",
        "namespaceSelector",
        "window",
        "budget",
        "whenExhausted",
        "maxConcurrentRuns",
        "maxConcurrentTurns",
        "runBudget",
        "allowedModels",
        "allowedTools",
        "httpGet",
        "toolServers",
        "ttlSecondsAfterFinished",
    }
    assert "required" not in spec  # one of namespaces / namespaceSelector, checked in CEL
    assert set(at(spec, "namespaceSelector")["properties"]) == {"matchLabels", "matchExpressions"}
    expression = at(spec, "namespaceSelector.matchExpressions")["items"]
    assert set(expression["properties"]) == {"key", "operator", "values"}
    assert set(expression["required"]) == {"key", "operator"}
    assert at(spec, "window")["default"] == "24h"
    assert set(at(spec, "budget")["properties"]) == {"tokens", "costUSD", "wallClockSeconds"}
    assert at(spec, "whenExhausted")["enum"] == ["Queue", "Fail"]
    assert at(spec, "whenExhausted")["default"] == "Queue"
    assert set(at(spec, "runBudget")["properties"]) == {"max", "default", "overMax"}
    assert set(at(spec, "runBudget.max")["properties"]) == RUN_BUDGET_FIELDS
    assert set(at(spec, "runBudget.default")["properties"]) == RUN_BUDGET_FIELDS
    assert at(spec, "runBudget.overMax")["enum"] == ["Clamp", "Reject"]
    assert at(spec, "runBudget.overMax")["default"] == "Reject"
    for field in ["namespaces", "allowedModels", "allowedTools"]:
        assert at(spec, field)["x-kubernetes-list-type"] == "set", field


def test_agenttenant_spec_is_mutable() -> None:
    # Platform teams edit tenants in place; no field carries a self == oldSelf rule.
    spec = at(root_schema(AGENTTENANT_CRD), "spec")
    rules = [
        rule["rule"]
        for _, schema in [("spec", spec), *walk_fields(spec)]
        for rule in schema.get("x-kubernetes-validations", [])
    ]
    assert [rule for rule in rules if "oldSelf" in rule] == []


@pytest.mark.parametrize("bound", ["max", "default"])
@pytest.mark.parametrize("field", sorted(RUN_BUDGET_FIELDS))
def test_agenttenant_run_budget_fields_copy_the_agentrun_constraints(
    bound: str, field: str
) -> None:
    # Same bounds and patterns as AgentRun spec.budget, without its defaults: an unset cap
    # or default means none.
    run_field = at(root_schema(AGENTRUN_CRD), f"spec.budget.{field}")
    tenant_field = at(root_schema(AGENTTENANT_CRD), f"spec.runBudget.{bound}.{field}")
    constraints = ["type", "format", "minimum", "maximum", "pattern", "maxLength"]
    assert {key: tenant_field.get(key) for key in constraints} == {
        key: run_field.get(key) for key in constraints
    }
    assert "default" not in tenant_field
    run_rules = [rule["rule"] for rule in run_field.get("x-kubernetes-validations", [])]
    tenant_rules = [rule["rule"] for rule in tenant_field.get("x-kubernetes-validations", [])]
    assert tenant_rules == run_rules


def test_agenttenant_budget_patterns_match_the_agentrun_ones() -> None:
    spec = at(root_schema(AGENTTENANT_CRD), "spec")
    run_budget = at(root_schema(AGENTRUN_CRD), "spec.budget")
    window = at(spec, "window")["x-kubernetes-validations"][0]
    assert window == at(run_budget, "timeout")["x-kubernetes-validations"][0]
    assert at(spec, "budget.costUSD")["pattern"] == at(run_budget, "maxCostUSD")["pattern"]


def test_agenttenant_status_fields_are_the_contract() -> None:
    status = at(root_schema(AGENTTENANT_CRD), "status")
    assert "x-kubernetes-preserve-unknown-fields" not in status  # unknown fields are pruned
    assert set(status["properties"]) == {
        "observedGeneration",
        "windowStart",
        "resetTime",
        "activeRuns",
        "queuedRuns",
        "budget",
        "conditions",
    }
    budget = at(status, "budget")
    assert set(budget["properties"]) == {"tokens", "costUSD", "wallClockSeconds"}
    for name, value_type in [
        ("tokens", "integer"),
        ("costUSD", "string"),
        ("wallClockSeconds", "number"),
    ]:
        usage = at(budget, name)
        fields = {"used", "reserved", "limit", "remaining"}
        if name != "wallClockSeconds":  # a model call can be abandoned; wall time cannot
            fields.add("abandoned")
        assert set(usage["properties"]) == fields
        assert {field["type"] for field in usage["properties"].values()} == {value_type}


def test_agenttenant_conditions_are_declared_like_the_agentruns() -> None:
    run_conditions = at(root_schema(AGENTRUN_CRD), "status.conditions")
    tenant_conditions = at(root_schema(AGENTTENANT_CRD), "status.conditions")

    def shape(conditions: Schema) -> Any:
        without_descriptions = {
            key: value for key, value in conditions.items() if key != "description"
        }
        items = without_descriptions["items"]
        return {
            **without_descriptions,
            "items": {
                **items,
                "properties": {
                    name: {k: v for k, v in field.items() if k != "description"}
                    for name, field in items["properties"].items()
                },
            },
        }

    assert shape(tenant_conditions) == shape(run_conditions)


def test_agenteval_expected_reasons_are_the_terminal_vocabulary() -> None:
    expect = at(root_schema(AGENTEVAL_CRD), "spec.cases[].expect")
    reasons = expect["properties"]["reason"]["enum"]
    assert reasons == [reason.value for reason in terminal.TerminalReason]
    assert expect["properties"]["outcome"]["enum"] == [o.value for o in terminal.Outcome]


def test_agenteval_printer_columns() -> None:
    (version,) = load_crd(AGENTEVAL_CRD)["spec"]["versions"]
    columns = [column["name"] for column in version["additionalPrinterColumns"]]
    assert columns == ["Agent", "Passed", "Failed", "Total", "Phase", "Age"]


def test_cronagentrun_printer_columns_are_a_cronjobs() -> None:
    assert printer_columns(CRON_CRD) == [
        ("Schedule", "string", ".spec.schedule", 0),
        ("Timezone", "string", ".spec.timeZone", 0),
        ("Suspend", "boolean", ".spec.suspend", 0),
        ("Active", "integer", ".status.activeRuns", 0),
        ("Last Schedule", "date", ".status.lastScheduleTime", 0),
        ("Ready", "string", '.status.conditions[?(@.type=="Ready")].status', 0),
        ("Reason", "string", '.status.conditions[?(@.type=="Ready")].reason', 0),
        ("Age", "date", ".metadata.creationTimestamp", 0),
        # string: a date column prints <invalid> for a time in the future
        ("Next", "string", ".status.nextScheduleTime", 1),
    ]


def test_cronagentrun_run_template_is_checked_by_the_agentrun_spec_schema() -> None:
    """The same fields, constraints and CEL rules as an AgentRun's spec, but mutable."""
    template = copy.deepcopy(at(root_schema(CRON_CRD), "spec.runTemplate.spec"))
    run = copy.deepcopy(at(root_schema(AGENTRUN_CRD), "spec"))
    rules = run.pop("x-kubernetes-validations")
    assert rules[0]["rule"] == "self == oldSelf"
    assert template.pop("x-kubernetes-validations") == rules[1:]
    template.pop("description"), run.pop("description")
    assert template == run, (
        "the AgentRun spec schema changed: copy it (without its `self == oldSelf` rule) into "
        "spec.runTemplate.spec of crds/agentrun.dev_cronagentruns.yaml and the chart's copy"
    )


def test_cronagentrun_spec_fields_and_defaults_are_a_cronjobs() -> None:
    spec = at(root_schema(CRON_CRD), "spec")
    assert set(spec["properties"]) == {
        "schedule",
        "timeZone",
        "concurrencyPolicy",
        "startingDeadlineSeconds",
        "suspend",
        "successfulRunsHistoryLimit",
        "failedRunsHistoryLimit",
        "runTemplate",
    }
    assert spec["properties"]["concurrencyPolicy"]["enum"] == [p.value for p in ConcurrencyPolicy]
    assert spec["properties"]["successfulRunsHistoryLimit"]["default"] == 3
    assert spec["properties"]["failedRunsHistoryLimit"]["default"] == 1
    assert set(spec["required"]) == {"schedule", "runTemplate"}


def test_terminal_reason_invalid_spec_names_the_agent_ref_cases() -> None:
    """`kubectl explain agentrun.status.terminalReason` must cover every way a spec is
    rejected after admission, including a run of an Agent."""
    text = " ".join(at(root_schema(AGENTRUN_CRD), "status.terminalReason")["description"].split())
    invalid_spec = text[text.index("invalid_spec:") :]
    for case in ["unknown Agent", "does not declare", "required parameter missing"]:
        assert case in invalid_spec


DURATION_RULE = "self.matches('^([0-9]+([.][0-9]+)?(ms|s|m|h))+$')"
DURATION_FIELDS = {"agentruns": 1, "agents": 1, "agenttenants": 3, "agenttoolservers": 3}
"""Duration fields per CRD (the CronAgentRun's is its run template's spec.budget.timeout)."""


@CRD_FILES
def test_every_duration_field_refuses_with_examples_not_a_regex(path: Path) -> None:
    """``kubectl apply`` of a bad duration says what one looks like, not the pattern."""
    assert "(ms|s|m|h))+$'\n" not in path.read_text()
    found = 0
    for where, field in walk_fields(root_schema(path)):
        rules = field.get("x-kubernetes-validations", [])
        if field.get("type") != "string" or not any("(ms|s|m|h)" in r["rule"] for r in rules):
            continue
        found += 1
        assert "pattern" not in field, where
        assert rules[0]["rule"] == DURATION_RULE, where
        assert "a duration such as 90s, 2m or 1h30m" in rules[0]["message"], where
    kind = path.name.split("_")[1].removesuffix(".yaml")
    assert found == DURATION_FIELDS.get(kind, 1 if kind == "cronagentruns" else 0)
