"""AgentTenant policy: parsing, namespace binding, per-run budget caps/defaults, resolution."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from agentrun.ledger import TenantLimits
from agentrun.operator.platform.spec import SpecError
from agentrun.operator.runs.spec import IMPLICIT_BUDGET, AgentRunSpec
from agentrun.operator.tenants.policy import (
    Ambiguous,
    InvalidTenant,
    OverMax,
    TenantPolicy,
    WhenExhausted,
    resolve,
    selector_matches,
)


def tenant(name: str = "acme", **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "generation": 3}, "spec": spec}


def policy(name: str = "acme", **spec: Any) -> TenantPolicy:
    return TenantPolicy.of(tenant(name, **spec))


def admitted_spec(spec: dict[str, Any]) -> AgentRunSpec:
    """The run's spec as the operator parses it (``SpecError`` naming a bad field)."""
    return AgentRunSpec.of(spec)


def run_spec(**budget: Any) -> dict[str, Any]:
    return {"model": "gpt", "goal": "g", "tools": ["calculate"], "budget": budget}


# --------------------------------------------------------------------------- of()


def test_defaults_of_an_almost_empty_tenant() -> None:
    p = TenantPolicy.of({"metadata": {"name": "acme"}, "spec": {"namespaces": ["a"]}})
    assert p.name == "acme"
    assert p.generation == 1
    assert p.namespaces == frozenset({"a"})
    assert p.selector is None
    assert p.limits == TenantLimits(window_seconds=86_400.0)
    assert p.when_exhausted is WhenExhausted.QUEUE
    assert p.over_max is OverMax.REJECT
    assert (p.run_max.written(), p.run_default.written()) == ({}, {})
    assert (p.allowed_models, p.allowed_tools) == (None, None)
    assert p.ttl_after_finished is None


def test_a_full_tenant_is_parsed() -> None:
    p = policy(
        namespaces=["a", "b"],
        namespaceSelector={"matchLabels": {"team": "x"}},
        window="1h30m",
        budget={"tokens": 1_000_000, "costUSD": "250.50", "wallClockSeconds": 7200},
        maxConcurrentRuns=4,
        whenExhausted="Fail",
        runBudget={"max": {"maxSteps": 50}, "default": {"maxSteps": 10}, "overMax": "Clamp"},
        allowedModels=["gpt", "small"],
        allowedTools=[],
        ttlSecondsAfterFinished=3600,
    )
    assert p.generation == 3
    assert p.ttl_after_finished == 3600
    assert p.limits == TenantLimits(
        tokens=1_000_000,
        cost_usd=Decimal("250.50"),
        wall_seconds=7200.0,
        window_seconds=5_400.0,
        max_concurrent_runs=4,
    )
    assert p.when_exhausted is WhenExhausted.FAIL
    assert p.over_max is OverMax.CLAMP
    assert p.run_max.written() == {"maxSteps": 50}
    assert p.run_default.written() == {"maxSteps": 10}
    assert p.allowed_models == frozenset({"gpt", "small"})
    assert p.allowed_tools == frozenset()


def test_a_negative_run_ttl_default_is_an_invalid_tenant_naming_the_field() -> None:
    with pytest.raises(InvalidTenant, match="ttlSecondsAfterFinished"):
        policy(ttlSecondsAfterFinished=-1)


@pytest.mark.parametrize("window", ["soon", "", "1d", "0s", "500ms"])
def test_an_invalid_window_is_an_invalid_tenant_naming_spec_window(window: str) -> None:
    with pytest.raises(InvalidTenant, match=r"^spec\.window: "):
        policy(window=window)


@pytest.mark.parametrize("cost", ["lots", "1,50", "$5"])
def test_an_invalid_cost_is_an_invalid_tenant_naming_the_field(cost: str) -> None:
    with pytest.raises(InvalidTenant, match=r"^spec\.budget\.costUSD: "):
        policy(budget={"costUSD": cost})


@pytest.mark.parametrize(
    ("field", "default", "cap"),
    [
        ("maxSteps", 60, 50),
        ("maxToolCalls", 11, 10),
        ("maxTokens", 2_000, 1_000),
        ("maxCostUSD", "1.000001", "1.00"),
        ("timeout", "2h", "90m"),
        ("timeout", "91s", "1m30s"),
    ],
)
def test_a_default_above_its_cap_is_an_invalid_tenant_naming_the_field(
    field: str, default: Any, cap: Any
) -> None:
    with pytest.raises(InvalidTenant, match=rf"^spec\.runBudget\.default\.{field}: ") as err:
        policy(runBudget={"max": {field: cap}, "default": {field: default}})
    assert f"spec.runBudget.max.{field}" in str(err.value)


@pytest.mark.parametrize(
    ("field", "default", "cap"),
    [("maxSteps", 50, 50), ("maxCostUSD", "1.0", "1.00"), ("timeout", "90s", "1m30s")],
)
def test_a_default_equal_to_its_cap_is_fine(field: str, default: Any, cap: Any) -> None:
    p = policy(runBudget={"max": {field: cap}, "default": {field: default}})
    assert p.run_default.written()[field] == default


def test_a_malformed_default_under_a_cap_is_an_invalid_tenant() -> None:
    with pytest.raises(InvalidTenant, match=r"^spec\.runBudget\.default\.maxSteps: "):
        policy(runBudget={"max": {"maxSteps": 5}, "default": {"maxSteps": "many"}})


# --------------------------------------------------------------------------- binding


def test_binds_by_namespace_list() -> None:
    p = policy(namespaces=["team-a", "team-b"])
    assert p.binds("team-a", {})
    assert p.binds("team-b", {"any": "thing"})
    assert not p.binds("team-c", {})


def test_binds_by_selector_or_list() -> None:
    p = policy(namespaces=["legacy"], namespaceSelector={"matchLabels": {"team": "a"}})
    assert p.binds("legacy", {})
    assert p.binds("fresh", {"team": "a", "env": "prod"})
    assert not p.binds("fresh", {"team": "b"})
    assert not p.binds("fresh", {})


def test_an_empty_selector_binds_every_namespace() -> None:
    assert policy(namespaceSelector={}).binds("anything", {})
    assert selector_matches({}, {"a": "b"})


def test_match_labels_need_every_label() -> None:
    selector = {"matchLabels": {"team": "a", "env": "prod"}}
    assert selector_matches(selector, {"team": "a", "env": "prod", "x": "y"})
    assert not selector_matches(selector, {"team": "a"})
    assert not selector_matches(selector, {"team": "a", "env": "dev"})


@pytest.mark.parametrize(
    ("expression", "labels", "expected"),
    [
        ({"key": "env", "operator": "In", "values": ["prod", "stage"]}, {"env": "prod"}, True),
        ({"key": "env", "operator": "In", "values": ["prod", "stage"]}, {"env": "dev"}, False),
        ({"key": "env", "operator": "In", "values": ["prod"]}, {}, False),
        ({"key": "env", "operator": "NotIn", "values": ["dev"]}, {"env": "prod"}, True),
        ({"key": "env", "operator": "NotIn", "values": ["dev"]}, {"env": "dev"}, False),
        ({"key": "env", "operator": "NotIn", "values": ["dev"]}, {}, True),
        ({"key": "env", "operator": "Exists"}, {"env": ""}, True),
        ({"key": "env", "operator": "Exists"}, {"other": "x"}, False),
        ({"key": "env", "operator": "DoesNotExist"}, {}, True),
        ({"key": "env", "operator": "DoesNotExist"}, {"env": "prod"}, False),
        ({"key": "env", "operator": "Matches", "values": ["prod"]}, {"env": "prod"}, False),
        ({"key": "env", "values": ["prod"]}, {"env": "prod"}, False),
    ],
)
def test_match_expressions_operators(
    expression: dict[str, Any], labels: dict[str, str], expected: bool
) -> None:
    assert selector_matches({"matchExpressions": [expression]}, labels) is expected
    assert policy(namespaceSelector={"matchExpressions": [expression]}).binds("ns", labels) is (
        expected
    )


def test_match_labels_and_expressions_are_anded() -> None:
    selector = {
        "matchLabels": {"team": "a"},
        "matchExpressions": [
            {"key": "env", "operator": "In", "values": ["prod"]},
            {"key": "frozen", "operator": "DoesNotExist"},
        ],
    }
    assert selector_matches(selector, {"team": "a", "env": "prod"})
    assert not selector_matches(selector, {"team": "b", "env": "prod"})
    assert not selector_matches(selector, {"team": "a", "env": "prod", "frozen": "1"})
    assert not selector_matches(selector, {"team": "a"})


# --------------------------------------------------------------------------- apply()


def test_a_model_not_allowed_is_invalid_naming_spec_model_and_the_tenant() -> None:
    p = policy(allowedModels=["small", "tiny"])
    with pytest.raises(SpecError, match=r"^spec\.model: ") as err:
        p.apply(admitted_spec(run_spec()))
    assert "'gpt'" in str(err.value) and "'acme'" in str(err.value)
    assert p.apply(admitted_spec({**run_spec(), "model": "small"})).model == "small"


def test_an_empty_allowed_models_list_allows_none() -> None:
    with pytest.raises(SpecError, match=r"^spec\.model: .*none"):
        policy(allowedModels=[]).apply(admitted_spec(run_spec()))


def test_a_tool_not_allowed_is_invalid_naming_spec_tools_and_the_tenant() -> None:
    p = policy(allowedTools=["calculate"])
    spec = admitted_spec({**run_spec(), "tools": ["calculate", "kubernetes_get", "sleep"]})
    with pytest.raises(SpecError, match=r"^spec\.tools: kubernetes_get, sleep ") as err:
        p.apply(spec)
    assert "'acme'" in str(err.value)
    assert p.apply(admitted_spec(run_spec())).tools == ("calculate",)


def test_a_misspelled_model_or_tool_names_the_allowed_one_it_is_close_to() -> None:
    p = policy(allowedModels=["gpt-5", "small"], allowedTools=["calculate", "search/*"])
    with pytest.raises(SpecError) as err:
        p.apply(admitted_spec({**run_spec(), "model": "gtp-5"}))
    assert "AgentModel 'gtp-5' (did you mean 'gpt-5'?) is not allowed" in str(err.value)
    spec = {**run_spec(), "model": "small", "tools": ["calculte", "rm_rf"]}
    with pytest.raises(SpecError) as err:
        p.apply(admitted_spec(spec))
    assert str(err.value).startswith(
        "spec.tools: calculte (did you mean 'calculate'?), rm_rf not allowed by AgentTenant"
    )


def test_an_empty_allowed_tools_list_allows_only_runs_without_tools() -> None:
    p = policy(allowedTools=[])
    with pytest.raises(SpecError, match=r"^spec\.tools: "):
        p.apply(admitted_spec(run_spec()))
    assert p.apply(admitted_spec({"model": "gpt", "goal": "g"})).model == "gpt"


def test_without_a_policy_only_the_implicit_values_are_filled() -> None:
    budget = policy().apply(admitted_spec({"model": "gpt", "goal": "g"})).budget.written()
    assert budget == {"maxSteps": 20, "maxToolCalls": 50, "timeout": "10m"}
    assert IMPLICIT_BUDGET.max_tokens is None and IMPLICIT_BUDGET.max_cost_usd is None


def test_defaults_are_filled_only_for_unset_fields() -> None:
    p = policy(
        runBudget={
            "default": {"maxSteps": 7, "maxTokens": 500, "maxCostUSD": "0.50", "timeout": "5m"}
        }
    )
    budget = p.apply(admitted_spec(run_spec(maxSteps=12, maxCostUSD="2"))).budget.written()
    assert budget == {
        "maxSteps": 12,
        "maxToolCalls": 50,
        "maxTokens": 500,
        "maxCostUSD": "2",
        "timeout": "5m",
    }


@pytest.mark.parametrize(
    ("field", "value", "cap"),
    [
        ("maxSteps", 51, 50),
        ("maxToolCalls", 101, 100),
        ("maxTokens", 10_001, 10_000),
        ("maxCostUSD", "2.000001", "2.00"),
        ("timeout", "90s", "1m"),
        ("timeout", "1h0m1s", "1h"),
    ],
)
def test_over_max_with_reject_is_invalid_naming_the_field_and_the_cap(
    field: str, value: Any, cap: Any
) -> None:
    p = policy(runBudget={"max": {field: cap}})
    with pytest.raises(SpecError, match=rf"^spec\.budget\.{field}: ") as err:
        p.apply(admitted_spec(run_spec(**{field: value})))
    message = str(err.value)
    assert f"cap {cap}" in message
    assert "'acme'" in message
    assert f"spec.runBudget.max.{field}" in message


@pytest.mark.parametrize(
    ("field", "value", "cap"),
    [
        ("maxSteps", 51, 50),
        ("maxToolCalls", 101, 100),
        ("maxTokens", 10_001, 10_000),
        ("maxCostUSD", "2.000001", "2.00"),
        ("timeout", "90s", "1m"),
    ],
)
def test_over_max_with_clamp_is_clamped(field: str, value: Any, cap: Any) -> None:
    p = policy(runBudget={"max": {field: cap}, "overMax": "Clamp"})
    assert p.apply(admitted_spec(run_spec(**{field: value}))).budget.written()[field] == cap


@pytest.mark.parametrize(
    ("field", "value", "cap"),
    [
        ("maxSteps", 50, 50),
        ("maxCostUSD", "2.0", "2.00"),
        ("maxCostUSD", "1.99", "2"),
        ("timeout", "60s", "1m"),
        ("timeout", "59s", "1m"),
        ("timeout", "1500ms", "2s"),
    ],
)
def test_values_within_the_cap_are_kept_as_written(field: str, value: Any, cap: Any) -> None:
    for over_max in ("Reject", "Clamp"):
        p = policy(runBudget={"max": {field: cap}, "overMax": over_max})
        assert p.apply(admitted_spec(run_spec(**{field: value}))).budget.written()[field] == value


def test_an_unset_field_with_a_cap_gets_the_cap_or_the_lower_implicit_default() -> None:
    p = policy(
        runBudget={
            "max": {
                "maxSteps": 50,
                "maxToolCalls": 10,
                "maxTokens": 4_000,
                "maxCostUSD": "0.75",
                "timeout": "2m",
            }
        }
    )
    budget = p.apply(admitted_spec({"model": "gpt", "goal": "g"})).budget.written()
    assert budget == {
        "maxSteps": 20,  # implicit 20 is under the cap of 50: stays 20
        "maxToolCalls": 10,  # implicit 50 is above the cap of 10: the cap (not a rejection)
        "maxTokens": 4_000,  # no implicit limit: the cap
        "maxCostUSD": "0.75",
        "timeout": "2m",  # implicit 10m is above the cap
    }


def test_capped_names_each_cap_the_tenant_lowers_and_how_the_run_had_it() -> None:
    """What the ``Admitted`` Event says: asked above the cap (Clamp), an implicit default
    above it, no cap at all; a value under its cap, or a tenant default, is not named."""
    p = policy(
        runBudget={
            "max": {"maxSteps": 5, "maxToolCalls": 10, "maxTokens": 4_000, "timeout": "2m"},
            "default": {"maxSteps": 3},
            "overMax": "Clamp",
        }
    )
    asked = admitted_spec(run_spec(maxSteps=9)).budget
    assert [o.text() for o in p.capped(asked)] == [
        "maxSteps 5 (9 asked)",
        "maxToolCalls 10 (50 by default)",
        "maxTokens 4000 (none by default)",
        "timeout 2m (10m by default)",
    ]
    within = admitted_spec(run_spec(maxToolCalls=10, maxTokens=10, timeout="1m")).budget
    assert p.capped(within) == ()  # maxSteps: the tenant's default 3, under its cap


def test_an_unset_field_takes_the_tenant_default_under_the_cap() -> None:
    p = policy(runBudget={"max": {"maxTokens": 4_000}, "default": {"maxTokens": 1_000}})
    assert p.apply(admitted_spec(run_spec())).budget.max_tokens == 1_000
    assert p.apply(admitted_spec(run_spec(maxTokens=3_000))).budget.max_tokens == 3_000


def test_the_spec_passed_in_is_left_as_it_was() -> None:
    p = policy(
        runBudget={"max": {"maxSteps": 5, "timeout": "1m"}, "overMax": "Clamp"},
        allowedTools=["calculate"],
    )
    spec = admitted_spec(run_spec(maxSteps=9, timeout="5m"))
    before = spec.model_copy(deep=True)
    result = p.apply(spec)
    assert spec == before
    assert result.budget.written()["maxSteps"] == 5
    assert spec.budget.written()["maxSteps"] == 9
    assert result.model_copy(update={"budget": spec.budget}) == spec


def test_a_run_value_that_is_not_a_number_is_invalid_naming_the_field() -> None:
    p = policy(runBudget={"max": {"maxSteps": 5}})
    with pytest.raises(SpecError, match=r"^spec\.budget\.maxSteps: "):
        p.apply(admitted_spec(run_spec(maxSteps="many")))
    with pytest.raises(SpecError, match=r"^spec\.budget\.timeout: "):
        policy(runBudget={"max": {"timeout": "1m"}}).apply(admitted_spec(run_spec(timeout="soon")))


# --------------------------------------------------------------------------- resolve()


NAME_LABEL = "kubernetes.io/metadata.name"


def test_resolve_picks_the_one_binding_tenant() -> None:
    a = policy("a", namespaces=["ns-a"])
    b = policy("b", namespaceSelector={"matchLabels": {"team": "b"}})
    fallback = policy("fallback", namespaces=["elsewhere"])
    pool = [a, b, fallback]
    assert resolve(pool, "ns-a", {}, default="fallback") is a
    assert resolve(pool, "ns-x", {"team": "b"}, default="fallback") is b


def test_resolve_falls_back_to_the_default_tenant_by_name() -> None:
    pool = [policy("a", namespaces=["ns-a"]), policy("fallback", namespaces=["elsewhere"])]
    chosen = resolve(pool, "ns-z", {}, default="fallback")
    assert chosen is not None and chosen.name == "fallback"
    assert resolve(pool, "ns-z", {}, default="missing") is None


def test_resolve_without_binding_or_default_is_none() -> None:
    assert resolve([policy("a", namespaces=["ns-a"])], "ns-z", {}) is None
    assert resolve([], "ns-z", {}, default="") is None


def test_resolve_refuses_to_guess_between_two_tenants_binding_alike() -> None:
    listed = [policy("b", namespaces=["shared"]), policy("a", namespaces=["shared", "own"])]
    with pytest.raises(Ambiguous, match=r"'shared'.*a, b") as caught:
        resolve(listed, "shared", {}, default="a")
    assert caught.value.tenants == ("a", "b")
    assert resolve(listed, "own", {}).name == "a"  # type: ignore[union-attr]
    selected = [
        policy("b", namespaceSelector={"matchLabels": {"team": "x"}}),
        policy(
            "a", namespaceSelector={"matchExpressions": [{"key": "team", "operator": "Exists"}]}
        ),
    ]
    with pytest.raises(Ambiguous, match=r"'shared'.*a, b"):
        resolve(selected, "shared", {"team": "x"})
    assert resolve(selected, "other", {"team": "y"}).name == "a"  # type: ignore[union-attr]


def test_a_namespace_listed_by_name_is_not_taken_or_blocked_by_a_broad_selector() -> None:
    """A tenant selecting every namespace (``Exists`` on the name label the API server sets)
    leaves alone the namespaces other tenants list: a name is more specific than a label."""
    everything = {"matchExpressions": [{"key": NAME_LABEL, "operator": "Exists"}]}
    pool = [policy("b", namespaces=["shared"]), policy("broad", namespaceSelector=everything)]
    assert resolve(pool, "shared", {NAME_LABEL: "shared"}).name == "b"  # type: ignore[union-attr]
    chosen = resolve(pool, "loose", {NAME_LABEL: "loose"}, default="b")
    assert chosen is not None and chosen.name == "broad"
