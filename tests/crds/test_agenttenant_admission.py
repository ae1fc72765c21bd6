"""What the real kube-apiserver accepts, rejects, defaults and shows for AgentTenants.

Each rejection must name the offending field, so a platform engineer reading `kubectl apply`'s
error knows what to fix.
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest
from crd_support import Apply, Kubectl, Manifest, explain, get_json, make_agenttenant, without

pytestmark = pytest.mark.usefixtures("crds")

FULL_SPEC: dict[str, Any] = {
    "namespaces": ["team-a", "team-a-staging"],
    "namespaceSelector": {
        "matchLabels": {"agentrun.dev/tenant": "team-a"},
        "matchExpressions": [
            {"key": "environment", "operator": "In", "values": ["prod", "staging"]},
            {"key": "sandbox", "operator": "DoesNotExist"},
        ],
    },
    "budget": {"tokens": 5_000_000, "costUSD": "250.50", "wallClockSeconds": 86_400},
    "maxConcurrentRuns": 10,
    "runBudget": {
        "max": {
            "maxSteps": 100,
            "maxToolCalls": 500,
            "maxTokens": 400_000,
            "maxCostUSD": "5",
            "timeout": "2h",
        },
        "default": {
            "maxSteps": 30,
            "maxToolCalls": 60,
            "maxTokens": 100_000,
            "maxCostUSD": "0.50",
            "timeout": "15m",
        },
    },
    "allowedModels": ["gpt-4o-mini", "llama.vllm"],
    "allowedTools": ["calculate", "kubernetes_get"],
}


def full_tenant(name: str) -> Manifest:
    return make_agenttenant(name, **FULL_SPEC)


def test_full_agenttenant_is_accepted_and_defaults_are_filled_in(
    apply: Apply, kubectl: Kubectl, agenttenant_name: str
) -> None:
    result = apply(full_tenant(agenttenant_name))
    assert result.returncode == 0, result.stderr
    stored = get_json(kubectl, "agenttenant", agenttenant_name)
    assert "namespace" not in stored["metadata"]  # cluster-scoped
    expected = json.loads(json.dumps(FULL_SPEC))
    expected["window"] = "24h"
    expected["whenExhausted"] = "Queue"
    expected["runBudget"]["overMax"] = "Reject"
    assert stored["spec"] == expected


def test_minimal_agenttenant_gets_the_defaults(
    apply: Apply, kubectl: Kubectl, agenttenant_name: str
) -> None:
    manifest = without(make_agenttenant(agenttenant_name), "spec.namespaces")
    manifest["spec"]["namespaceSelector"] = {"matchLabels": {"team": "a"}}
    result = apply(manifest)
    assert result.returncode == 0, result.stderr
    assert get_json(kubectl, "agenttenant", agenttenant_name)["spec"] == {
        "namespaceSelector": {"matchLabels": {"team": "a"}},
        "window": "24h",
        "whenExhausted": "Queue",
        "runBudget": {"overMax": "Reject"},
    }


ACCEPTED_SPECS = [
    pytest.param(
        {"namespaceSelector": {"matchExpressions": [{"key": "team", "operator": "Exists"}]}},
        id="selector-by-expression-only",
    ),
    pytest.param(
        {
            "namespaceSelector": {
                "matchLabels": {"example.com/team": "A.b_c-1", "x": ""},
                "matchExpressions": [
                    {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["a", ""]}
                ],
            }
        },
        id="selector-of-prefixed-keys-and-empty-values",
    ),
    pytest.param(
        {"toolServers": {"allow": [{"host": "search.tools.svc", "privateNetwork": True}]}},
        id="tool-server-rules",
    ),
    pytest.param(
        {"budget": {"tokens": 0, "costUSD": "0", "wallClockSeconds": 0}}, id="zero-budgets"
    ),
    pytest.param({"window": "1h30m", "whenExhausted": "Fail"}, id="compound-window-and-fail"),
    pytest.param({"window": "168h"}, id="weekly-window"),
    pytest.param({"window": "1s"}, id="shortest-window"),
    pytest.param({"window": "8760h"}, id="longest-window"),
    pytest.param(
        {"maxConcurrentRuns": 1, "runBudget": {"max": {"timeout": "24h"}, "overMax": "Clamp"}},
        id="one-at-a-time-and-clamp",
    ),
    pytest.param({"allowedModels": [], "allowedTools": []}, id="nothing-allowed"),
    pytest.param(
        {
            "runBudget": {
                "max": {"maxSteps": 5, "maxCostUSD": "10", "timeout": "1h30m"},
                "default": {"maxSteps": 5, "maxCostUSD": "9.999999", "timeout": "90m"},
            }
        },
        id="defaults-equal-to-or-below-their-caps",
    ),
    pytest.param(
        {"runBudget": {"max": {"maxSteps": 5}, "default": {"maxToolCalls": 50, "timeout": "2h"}}},
        id="defaults-without-a-cap",
    ),
    pytest.param(
        {
            "namespaceSelector": {
                "matchExpressions": [{"key": "team", "operator": "Exists", "values": []}]
            }
        },
        id="exists-with-empty-values",
    ),
]


@pytest.mark.parametrize("spec", ACCEPTED_SPECS)
def test_api_server_accepts_valid_agenttenant(
    apply: Apply, agenttenant_name: str, spec: dict[str, Any]
) -> None:
    result = apply(make_agenttenant(agenttenant_name, **spec))
    assert result.returncode == 0, result.stderr


NOT_BOUND = "spec.namespaces or spec.namespaceSelector must be set"


def selector(*expressions: dict[str, Any]) -> dict[str, Any]:
    return {"namespaceSelector": {"matchExpressions": list(expressions)}}


def above_cap_message(field: str, value: int | str, most: int | str) -> str:
    """The API server's message for a runBudget default above its cap. String fields show
    both values; integer ones cannot (``string(int)`` in a message expression is too costly
    for the API server's CEL budget), so their message names the fields only."""
    if isinstance(value, str):
        return f"spec.runBudget.default.{field}: {value} is above spec.runBudget.max.{field} {most}"
    return f"spec.runBudget.default.{field} is above spec.runBudget.max.{field}"


REJECTED_SPECS = [
    pytest.param(None, [NOT_BOUND], id="no-namespaces-and-no-selector"),
    pytest.param({"namespaces": []}, [NOT_BOUND], id="empty-namespaces-and-no-selector"),
    pytest.param(
        {"namespaceSelector": {}},
        ["spec.namespaceSelector", "an empty selector matches every namespace"],
        id="empty-selector-would-match-every-namespace",
    ),
    pytest.param(
        {"namespaceSelector": {"matchLabels": {}, "matchExpressions": []}},
        ["spec.namespaceSelector", "an empty selector matches every namespace"],
        id="selector-of-empty-parts",
    ),
    pytest.param(
        {"namespaceSelector": {"matchLabels": {"team": "search team"}}},
        ["spec.namespaceSelector.matchLabels.team", "should match"],
        id="selector-value-no-namespace-can-carry",
    ),
    pytest.param(
        {"namespaceSelector": {"matchLabels": {"my team": "a"}}},
        ["spec.namespaceSelector.matchLabels", "must be a label key"],
        id="selector-key-no-namespace-can-carry",
    ),
    pytest.param(
        selector({"key": "Team.Example/x", "operator": "Exists"}),
        ["spec.namespaceSelector.matchExpressions[0].key", "should match"],
        id="expression-key-no-namespace-can-carry",
    ),
    pytest.param(
        selector({"key": "team", "operator": "In", "values": ["a", "b c"]}),
        ["spec.namespaceSelector.matchExpressions[0].values[1]", "should match"],
        id="expression-value-no-namespace-can-carry",
    ),
    pytest.param(
        {"toolServers": {"allow": [{"host": "http://x"}]}},
        ["spec.toolServers.allow[0].host", "should match"],
        id="tool-server-rule-with-a-scheme",
    ),
    pytest.param(
        {"namespaces": ["Team_A"]}, ["spec.namespaces[0]", "should match"], id="bad-namespace"
    ),
    pytest.param(
        {"namespaces": ["team-a", "team-a"]},
        ["spec.namespaces[1]", "Duplicate value"],
        id="duplicate-namespace",
    ),
    pytest.param(
        {"window": "1 day"},
        ["spec.window", "a duration such as 90s, 2m or 1h30m"],
        id="window-not-a-duration",
    ),
    pytest.param(
        {"window": "1d"},
        ["spec.window", "a duration such as 90s, 2m or 1h30m"],
        id="window-in-days",
    ),
    pytest.param(
        {"window": "0s"},
        ["spec.window must be at least 1s and at most 8760h"],
        id="zero-window",
    ),
    pytest.param(
        {"window": "9000h"},
        ["spec.window must be at least 1s and at most 8760h"],
        id="window-over-a-year",
    ),
    pytest.param(
        {"budget": {"tokens": -1}},
        ["spec.budget.tokens", "greater than or equal to 0"],
        id="negative-tokens",
    ),
    pytest.param(
        {"budget": {"costUSD": "abc"}},
        ["spec.budget.costUSD", "should match"],
        id="cost-not-a-decimal",
    ),
    pytest.param(
        {"budget": {"costUSD": "-5"}}, ["spec.budget.costUSD", "should match"], id="negative-cost"
    ),
    pytest.param(
        {"budget": {"wallClockSeconds": -1}},
        ["spec.budget.wallClockSeconds", "greater than or equal to 0"],
        id="negative-wall-clock",
    ),
    pytest.param(
        {"budget": {"requests": 10}},
        ['unknown field "spec.budget.requests"'],
        id="unknown-budget-field",
    ),
    pytest.param(
        {"whenExhausted": "Later"},
        ["spec.whenExhausted", "Unsupported value", '"Later"'],
        id="unknown-when-exhausted",
    ),
    pytest.param(
        {"maxConcurrentRuns": 0},
        ["spec.maxConcurrentRuns", "greater than or equal to 1"],
        id="zero-concurrent-runs",
    ),
    pytest.param(
        {"maxConcurrentTurns": 0},
        ["spec.maxConcurrentTurns", "greater than or equal to 1"],
        id="zero-concurrent-turns",
    ),
    pytest.param(
        {"runBudget": {"max": {"maxSteps": 0}}},
        ["spec.runBudget.max.maxSteps", "greater than or equal to 1"],
        id="run-budget-max-steps-zero",
    ),
    pytest.param(
        {"runBudget": {"max": {"maxSteps": 1001}}},
        ["spec.runBudget.max.maxSteps", "less than or equal to 1000"],
        id="run-budget-max-steps-over-1000",
    ),
    pytest.param(
        {"runBudget": {"default": {"maxTokens": 0}}},
        ["spec.runBudget.default.maxTokens", "greater than or equal to 1"],
        id="run-budget-default-tokens-zero",
    ),
    pytest.param(
        {"runBudget": {"max": {"maxCostUSD": "0"}}},
        ["spec.runBudget.max.maxCostUSD must be greater than 0"],
        id="run-budget-max-cost-zero",
    ),
    pytest.param(
        {"runBudget": {"default": {"maxCostUSD": "cheap"}}},
        ["spec.runBudget.default.maxCostUSD", "should match"],
        id="run-budget-default-cost-not-a-decimal",
    ),
    pytest.param(
        {"runBudget": {"default": {"timeout": "48h"}}},
        ["spec.runBudget.default.timeout must be greater than 0s and at most 24h"],
        id="run-budget-default-timeout-over-24h",
    ),
    pytest.param(
        {"runBudget": {"max": {"timeout": "ten minutes"}}},
        ["spec.runBudget.max.timeout", "a duration such as 90s, 2m or 1h30m"],
        id="run-budget-max-timeout-not-a-duration",
    ),
    pytest.param(
        {"runBudget": {"overMax": "Ignore"}},
        ["spec.runBudget.overMax", "Unsupported value"],
        id="unknown-over-max",
    ),
    pytest.param(
        {"runBudget": {"max": {"noProgress": {"window": 3}}}},
        ['unknown field "spec.runBudget.max.noProgress"'],
        id="run-budget-field-not-capped",
    ),
    pytest.param(
        selector({"key": "team", "operator": "Equals", "values": ["a"]}),
        ["spec.namespaceSelector.matchExpressions[0].operator", "Unsupported value"],
        id="bad-selector-operator",
    ),
    pytest.param(
        selector({"operator": "Exists"}),
        ["spec.namespaceSelector.matchExpressions[0].key", "Required value"],
        id="selector-expression-without-key",
    ),
    pytest.param(
        selector({"key": "team", "operator": "In"}),
        [
            "spec.namespaceSelector.matchExpressions[0].values",
            "values must be non-empty when operator is In or NotIn",
        ],
        id="selector-in-without-values",
    ),
    pytest.param(
        selector({"key": "team", "operator": "Exists", "values": ["a"]}),
        [
            "spec.namespaceSelector.matchExpressions[0].values",
            "empty when operator is Exists or DoesNotExist",
        ],
        id="selector-exists-with-values",
    ),
    pytest.param(
        {"namespaceSelector": {"matchLabels": {"team": 1}}},
        ["spec.namespaceSelector.matchLabels.team", "must be of type string"],
        id="selector-label-not-a-string",
    ),
    pytest.param(
        {"allowedModels": ["GPT_4o"]}, ["spec.allowedModels[0]", "should match"], id="bad-model"
    ),
    pytest.param(
        {"allowedTools": ["calculate", "calculate"]},
        ["spec.allowedTools[1]", "Duplicate value"],
        id="duplicate-tool",
    ),
    pytest.param(
        {"allowedTools": ["rm -rf /"]}, ["spec.allowedTools[0]", "should match"], id="bad-tool"
    ),
    pytest.param({"priority": "high"}, ['unknown field "spec.priority"'], id="unknown-field"),
    *[
        pytest.param(
            {"runBudget": {"max": {field: most}, "default": {field: value}}},
            [f"spec.runBudget.default.{field}", above_cap_message(field, value, most)],
            id=f"default-{field}-{value}-above-max-{most}",
        )
        for field, most, value in [
            ("maxSteps", 5, 50),
            ("maxToolCalls", 10, 11),
            ("maxTokens", 100_000, 100_001),
            ("maxCostUSD", "9.5", "10"),
            ("maxCostUSD", "2.50", "2.500001"),
            ("timeout", "1h", "61m"),
            ("timeout", "90s", "1m30s500ms"),
        ]
    ],
]


@pytest.mark.parametrize(("spec", "expected"), REJECTED_SPECS)
def test_api_server_rejects_invalid_agenttenant_naming_the_field(
    apply: Apply, agenttenant_name: str, spec: dict[str, Any] | None, expected: list[str]
) -> None:
    # None: a spec that binds no namespace at all
    if spec is None:
        manifest = without(make_agenttenant(agenttenant_name), "spec.namespaces")
    else:
        manifest = make_agenttenant(agenttenant_name, **spec)
    result = apply(manifest)
    assert result.returncode != 0, f"accepted: {result.stdout}"
    for fragment in expected:
        assert fragment in result.stderr


def test_agenttenant_without_spec_is_rejected(apply: Apply, agenttenant_name: str) -> None:
    result = apply(without(make_agenttenant(agenttenant_name), "spec"))
    assert result.returncode != 0, f"accepted: {result.stdout}"
    assert "spec" in result.stderr
    assert "Required value" in result.stderr


def test_agenttenant_spec_can_be_edited_by_the_platform_team(
    apply: Apply, kubectl: Kubectl, agenttenant_name: str
) -> None:
    assert apply(full_tenant(agenttenant_name)).returncode == 0
    edited = full_tenant(agenttenant_name)
    edited["spec"].update(
        namespaces=["team-b"],
        window="1h",
        budget={"tokens": 10},
        whenExhausted="Fail",
        maxConcurrentRuns=2,
        allowedTools=["calculate"],
    )
    edited["spec"]["runBudget"]["overMax"] = "Clamp"
    result = apply(edited)
    assert result.returncode == 0, result.stderr
    spec = get_json(kubectl, "agenttenant", agenttenant_name)["spec"]
    assert (spec["namespaces"], spec["window"], spec["budget"]) == (
        ["team-b"],
        "1h",
        {"tokens": 10},
    )
    assert (spec["whenExhausted"], spec["maxConcurrentRuns"]) == ("Fail", 2)
    assert spec["runBudget"]["overMax"] == "Clamp"


def test_agenttenant_short_name_and_category(
    apply: Apply, kubectl: Kubectl, agenttenant_name: str
) -> None:
    assert apply(make_agenttenant(agenttenant_name)).returncode == 0
    assert kubectl("get", "at", agenttenant_name, "-o", "name").stdout.strip() == (
        f"agenttenant.agentrun.dev/{agenttenant_name}"
    )
    listed = kubectl("get", "agentrun-all", "-o", "name").stdout.split()
    assert f"agenttenant.agentrun.dev/{agenttenant_name}" in listed


STATUS: dict[str, Any] = {
    "observedGeneration": 1,
    "windowStart": "2026-01-01T00:00:00Z",
    "resetTime": "2026-01-02T00:00:00Z",
    "activeRuns": 3,
    "queuedRuns": 2,
    "budget": {
        "tokens": {
            "used": 1_234_567,
            "reserved": 8_192,
            "limit": 5_000_000,
            "remaining": 3_757_241,
        },
        "costUSD": {
            "used": "12.345678",
            "reserved": "1.5E-7",
            "limit": "250.50",
            "remaining": "238.15432185",
        },
        "wallClockSeconds": {"used": 3600.5, "reserved": 0, "limit": 86400, "remaining": 82799.5},
    },
    "conditions": [
        {
            "type": "Ready",
            "status": "True",
            "reason": "Reconciled",
            "message": "",
            "lastTransitionTime": "2026-01-01T00:00:04Z",
            "observedGeneration": 1,
        }
    ],
}


def patch_status(
    kubectl: Kubectl, name: str, status: dict[str, Any]
) -> subprocess.CompletedProcess[str]:
    return kubectl(
        "patch",
        "agenttenant",
        name,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps({"status": status}),
        check=False,
    )


def test_status_subresource_stores_the_operators_usage(
    apply: Apply, kubectl: Kubectl, agenttenant_name: str
) -> None:
    assert apply(make_agenttenant(agenttenant_name)).returncode == 0
    result = patch_status(kubectl, agenttenant_name, STATUS)
    assert result.returncode == 0, result.stderr
    assert "unknown field" not in result.stderr
    stored = get_json(kubectl, "agenttenant", agenttenant_name)
    assert stored["status"] == STATUS
    assert stored["metadata"]["generation"] == 1


def test_status_of_an_unlimited_tenant_has_no_limit_or_remaining(
    apply: Apply, kubectl: Kubectl, agenttenant_name: str
) -> None:
    assert apply(make_agenttenant(agenttenant_name)).returncode == 0
    status = {
        "activeRuns": 0,
        "queuedRuns": 0,
        "budget": {
            "tokens": {"used": 0, "reserved": 0},
            "costUSD": {"used": "0", "reserved": "0"},
            "wallClockSeconds": {"used": 0, "reserved": 0},
        },
    }
    assert patch_status(kubectl, agenttenant_name, status).returncode == 0
    assert get_json(kubectl, "agenttenant", agenttenant_name)["status"] == status


def test_status_remaining_may_be_negative_after_an_overshoot(
    apply: Apply, kubectl: Kubectl, agenttenant_name: str
) -> None:
    # Calls in flight settle after the limit is reached; the operator must be able to say so.
    assert apply(make_agenttenant(agenttenant_name)).returncode == 0
    status = {
        "budget": {
            "tokens": {"used": 120, "reserved": 0, "limit": 100, "remaining": -20},
            "costUSD": {"used": "1.2", "reserved": "0", "limit": "1", "remaining": "-0.2"},
            "wallClockSeconds": {"used": 65.5, "reserved": 0, "limit": 60, "remaining": -5.5},
        }
    }
    result = patch_status(kubectl, agenttenant_name, status)
    assert result.returncode == 0, result.stderr
    assert get_json(kubectl, "agenttenant", agenttenant_name)["status"] == status


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        pytest.param(
            {"budget": {"costUSD": {"used": "lots"}}},
            ["status.budget.costUSD.used", "should match"],
            id="cost-not-a-decimal",
        ),
        pytest.param(
            {"budget": {"tokens": {"used": -1}}},
            ["status.budget.tokens.used", "greater than or equal to 0"],
            id="negative-tokens-used",
        ),
        pytest.param(
            {"resetTime": "tomorrow"},
            ["status.resetTime", "date-time"],
            id="reset-time-not-a-timestamp",
        ),
        pytest.param(
            {"conditions": [{"type": "Ready", "status": "Maybe"}]},
            ["status.conditions[0].status", "Unsupported value"],
            id="condition-status-outside-the-enum",
        ),
    ],
)
def test_status_rejects_malformed_values(
    apply: Apply,
    kubectl: Kubectl,
    agenttenant_name: str,
    status: dict[str, Any],
    expected: list[str],
) -> None:
    assert apply(make_agenttenant(agenttenant_name)).returncode == 0
    result = patch_status(kubectl, agenttenant_name, status)
    assert result.returncode != 0, f"accepted: {result.stdout}"
    for fragment in expected:
        assert fragment in result.stderr


def test_get_agenttenants_shows_active_queued_tokens_cost_reset(
    apply: Apply, kubectl: Kubectl, agenttenant_name: str
) -> None:
    assert apply(make_agenttenant(agenttenant_name)).returncode == 0
    assert patch_status(kubectl, agenttenant_name, STATUS).returncode == 0
    header, row = kubectl("get", "agenttenants", agenttenant_name).stdout.splitlines()
    assert header.split() == ["NAME", "ACTIVE", "QUEUED", "TOKENS", "COST", "RESET", "AGE"]
    assert row.split()[:6] == [
        agenttenant_name,
        "3",
        "2",
        "1234567",
        "12.345678",
        "2026-01-02T00:00:00Z",  # the time itself, not an age
    ]


def test_explain_agenttenant_budget_gives_units_and_what_happens_when_used_up(
    kubectl: Kubectl,
) -> None:
    text = " ".join(explain(kubectl, "agenttenant.spec.budget").split())
    for fragment in [
        "per window",
        "spec.whenExhausted",
        "tokens",
        "input plus output tokens",
        "costUSD",
        "US dollars",
        "wallClockSeconds",
        "charged while each run is active",
        "unlimited",
        # the rule admission and each call's reservation share (finding 7)
        "smallest worst case (prompt bound and 128 output tokens)",
        "the allowance shrinks to what is left",
        "BudgetOverrun",
    ]:
        assert fragment in text


def test_explain_agenttenant_run_budget_gives_caps_defaults_and_over_max(
    kubectl: Kubectl,
) -> None:
    text = " ".join(explain(kubectl, "agenttenant.spec.runBudget").split())
    for fragment in [
        "AgentRun spec.budget",
        "max",
        "default",
        "overMax",
        "Clamp",
        "Reject",
        "invalid_spec",
    ]:
        assert fragment in text
    caps = " ".join(explain(kubectl, "agenttenant.spec.runBudget.max").split())
    for field in ["maxSteps", "maxToolCalls", "maxTokens", "maxCostUSD", "timeout"]:
        assert field in caps


def test_explain_agenttenant_spec_explains_window_and_admission(kubectl: Kubectl) -> None:
    text = " ".join(explain(kubectl, "agenttenant.spec").split())
    for fragment in [
        "namespaces",
        "namespaceSelector",
        "window",
        "default 24h",
        "UNIX epoch in UTC",
        "00:00 UTC",
        "whenExhausted",
        "tenant_budget_exhausted",
        "maxConcurrentRuns",
        "Queued",
        "maxConcurrentTurns",
        "fewest turns in flight",
        "allowedModels",
        "allowedTools",
    ]:
        assert fragment in text


def test_explain_agenttenant_status_budget(kubectl: Kubectl) -> None:
    text = " ".join(explain(kubectl, "agenttenant.status.budget.tokens").split())
    for fragment in ["used", "reserved", "limit", "remaining", "absent when unlimited"]:
        assert fragment in text
