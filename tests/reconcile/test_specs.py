"""The CRD specs parse into typed values; a bad field is named in the message."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from kube_support import FakeKube

from agentrun import kernel
from agentrun.operator.agents.spec import AgentModelSpec, model_config
from agentrun.operator.platform import spec as specs
from agentrun.operator.platform.spec import Duration, SpecError, not_found
from agentrun.operator.runs.spec import IMPLICIT_BUDGET, AgentRunSpec
from agentrun.operator.tenants.policy import InvalidTenant, TenantPolicy
from agentrun.operator.tenants.registry import NoTenant, Tenants
from agentrun.operator.tenants.spec import AgentTenantSpec

BAD_TENANT_FIELDS = [
    pytest.param(
        {"budget": {"tokens": "lots"}}, "spec.budget.tokens: 'lots' is invalid", id="tokens"
    ),
    pytest.param(
        {"budget": {"wallClockSeconds": "long"}},
        "spec.budget.wallClockSeconds: 'long' is invalid",
        id="wall clock",
    ),
    pytest.param({"whenExhausted": "Wait"}, "spec.whenExhausted: 'Wait' is invalid", id="when"),
    pytest.param(
        {"runBudget": {"overMax": "Ignore"}}, "spec.runBudget.overMax: 'Ignore'", id="overMax"
    ),
    pytest.param(
        {"runBudget": {"max": {"timeout": "1 hour"}}},
        "spec.runBudget.max.timeout: '1 hour' is not a duration",
        id="cap timeout",
    ),
    pytest.param(
        {"maxConcurrentRuns": "some"}, "spec.maxConcurrentRuns: 'some' is invalid", id="slots"
    ),
    pytest.param({"namespaces": "team-a"}, "spec.namespaces: 'team-a' is invalid", id="namespaces"),
]


@pytest.mark.parametrize(("spec", "message"), BAD_TENANT_FIELDS)
def test_a_bad_agenttenant_field_is_named(spec: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidTenant) as err:
        TenantPolicy.of({"metadata": {"name": "acme"}, "spec": spec})
    assert str(err.value).startswith(message)


def test_durations_compare_by_length_and_print_as_written() -> None:
    assert Duration.parse("90s") == Duration.parse("1m30s")
    assert Duration.parse("1h") > Duration.parse("59m59s")
    assert str(Duration.parse("1h30m")) == "1h30m"
    with pytest.raises(ValueError, match="like 90s"):
        Duration.parse("90")


def test_the_implicit_budget_takes_its_caps_from_the_kernel() -> None:
    defaults = kernel.Limits()
    assert IMPLICIT_BUDGET.max_steps == defaults.max_steps
    assert IMPLICIT_BUDGET.max_tool_calls == defaults.max_tool_calls
    assert IMPLICIT_BUDGET.timeout == Duration(600.0, "10m")


def test_an_empty_agentrun_spec_has_every_default() -> None:
    spec = AgentRunSpec.of(None)
    assert (spec.model, spec.goal, spec.instructions, spec.tools) == ("", "", None, ())
    assert spec.budget.written() == {}
    assert spec.budget.on_exhausted is kernel.OnExhausted.SUMMARIZE
    assert spec.output.json_schema is None and spec.approval.tools == ()


def test_unset_budget_fields_are_filled_from_defaults_and_set_ones_kept() -> None:
    asked = AgentRunSpec.of({"budget": {"maxSteps": 3, "maxCostUSD": "0.10"}}).budget
    filled = asked.filled_from(IMPLICIT_BUDGET)
    assert filled.written() == {
        "maxSteps": 3,
        "maxToolCalls": 50,
        "maxCostUSD": "0.10",
        "timeout": "10m",
    }
    assert filled.max_cost_usd == Decimal("0.10")


def test_an_agentmodel_spec_reads_prices_as_decimals() -> None:
    spec = AgentModelSpec.of("m", {"pricing": {"outputPerMillionUSD": "10.5"}, "model": "x"})
    assert spec.pricing.output_per_million == Decimal("10.5")
    assert spec.pricing.input_per_million == Decimal(0)


@pytest.mark.parametrize(
    ("pricing", "cached"),
    [
        ({"inputPerMillionUSD": "2.50", "outputPerMillionUSD": "10"}, Decimal("2.50")),
        ({"inputPerMillionUSD": "2.50", "cachedInputPerMillionUSD": "0"}, Decimal(0)),
        ({"inputPerMillionUSD": "2.50", "cachedInputPerMillionUSD": "1.25"}, Decimal("1.25")),
    ],
    ids=["unset-is-the-input-price", "zero-on-purpose", "set"],
)
def test_cached_prompt_tokens_are_never_free_by_omission(
    pricing: dict[str, str], cached: Decimal
) -> None:
    model = {"spec": {"baseURL": "http://m/v1", "model": "x", "pricing": pricing}}
    assert model_config("m", model).pricing.cached_input_per_million == cached


@pytest.mark.parametrize(
    "base_url",
    ["https://gateway:s3cret-key@llm.example.com/v1", "http://sk-123@llm", "http://@llm/v1"],
)
def test_an_agentmodel_with_credentials_in_its_base_url_is_refused_without_repeating_them(
    base_url: str,
) -> None:
    with pytest.raises(SpecError) as err:
        model_config("m", {"spec": {"baseURL": base_url, "model": "x"}})
    assert str(err.value).startswith("AgentModel 'm' spec.baseURL: must not carry credentials")
    assert "s3cret" not in str(err.value) and "sk-123" not in str(err.value)


@pytest.mark.parametrize(
    "base_url", ["https://llm.example.com/v1?api-version=2024-06-01", "http://llm/v1/a@b"]
)
def test_an_at_sign_after_the_host_is_no_credential(base_url: str) -> None:
    assert model_config("m", {"spec": {"baseURL": base_url, "model": "x"}}).base_url == base_url


def test_an_agenttenant_without_a_window_gets_a_day() -> None:
    assert AgentTenantSpec.of({}).window.seconds == 86_400.0


def test_only_the_first_error_is_reported_with_its_path() -> None:
    with pytest.raises(SpecError) as err:
        specs.parse(AgentRunSpec, {"budget": {"maxSteps": "x", "maxToolCalls": "y"}}, where="spec")
    assert str(err.value).startswith("spec.budget.maxSteps: ")
    assert "maxToolCalls" not in str(err.value)


async def test_an_invalid_tenant_keeps_its_namespaces_so_their_runs_are_rejected() -> None:
    tenants = Tenants(FakeKube(), default="fallback")
    tenants.put({"metadata": {"name": "fallback"}, "spec": {"namespaces": ["other"]}})
    bad = {
        "metadata": {"name": "acme", "generation": 5},
        "spec": {"namespaces": ["team-a"], "window": "soon"},
    }
    assert tenants.put(bad) is None
    assert tenants.invalid["acme"][0] == 5
    with pytest.raises(
        NoTenant, match=r"'acme' binds namespace 'team-a' but is invalid: spec\.window"
    ):
        await tenants.resolve("team-a")
    assert (await tenants.resolve("elsewhere")).name == "fallback"


class SlowLabels(FakeKube):
    """Namespace labels read while ``meanwhile`` happens (a watch event handled during the
    read)."""

    def __init__(self, meanwhile: Any) -> None:
        super().__init__()
        self.meanwhile = meanwhile

    async def namespace_labels(self, name: str) -> dict[str, str]:
        self.meanwhile()
        return {}


async def test_a_tenant_made_invalid_while_a_namespace_is_resolved_still_rejects_its_runs() -> None:
    """AgentTenant ``acme`` lists ``team-a`` and becomes invalid while the namespace's labels
    are read (another tenant selects by label): the run is rejected naming ``acme``, never
    charged to the default tenant."""
    bad = {"metadata": {"name": "acme"}, "spec": {"namespaces": ["team-a"], "window": "soon"}}
    tenants = Tenants(SlowLabels(lambda: tenants.put(bad)), default="fallback")
    tenants.put({"metadata": {"name": "fallback"}, "spec": {"namespaces": ["other"]}})
    tenants.put({"metadata": {"name": "acme"}, "spec": {"namespaces": ["team-a"]}})
    selector = {"namespaceSelector": {"matchLabels": {"team": "b"}}}
    tenants.put({"metadata": {"name": "by-label"}, "spec": selector})
    with pytest.raises(NoTenant, match="'acme' binds namespace 'team-a' but is invalid"):
        await tenants.resolve("team-a")


async def test_an_ambiguous_namespace_is_remembered_for_its_tenants_conditions_until_resolved() -> (
    None
):
    tenants = Tenants(FakeKube())
    for name in ("a", "b"):
        tenants.put({"metadata": {"name": name}, "spec": {"namespaces": ["shared", f"own-{name}"]}})
    with pytest.raises(NoTenant, match="several AgentTenants: a, b"):
        await tenants.resolve("shared")
    assert (await tenants.resolve("own-a")).name == "a"  # the others' runs are untouched
    assert tenants.ambiguous_of("a") == {"shared": ("b",)}
    assert tenants.ambiguous_of("b") == {"shared": ("a",)}
    tenants.put({"metadata": {"name": "b"}, "spec": {"namespaces": ["own-b"]}})
    assert (await tenants.resolve("shared")).name == "a"
    assert tenants.ambiguous_of("a") == {} and tenants.ambiguous_of("b") == {}
    assert await tenants.tool_server_rules("own-a") == ("a", ())


def test_a_namespace_two_tenants_list_is_shown_ambiguous_before_any_run_comes() -> None:
    """A second tenant listing a namespace the first lists: both conditions name it at once
    (the runs there would be rejected), not only once a run was; and not after it lets go."""
    tenants = Tenants(FakeKube())
    tenants.put({"metadata": {"name": "a"}, "spec": {"namespaces": ["shared", "own-a"]}})
    assert tenants.ambiguous_of("a") == {}
    tenants.put({"metadata": {"name": "b"}, "spec": {"namespaces": ["shared"]}})
    assert tenants.ambiguous_of("a") == {"shared": ("b",)}
    assert tenants.ambiguous_of("b") == {"shared": ("a",)}
    tenants.remove("b")
    assert tenants.ambiguous_of("a") == {}


async def test_a_namespace_two_selectors_took_is_no_longer_ambiguous_once_one_lets_go() -> None:
    """Shared by two selectors (seen when a run came), then one tenant deleted: the other's
    condition stops naming it without waiting for another run there."""
    api = FakeKube()
    api.labels["labelled"] = {"team": "x"}
    tenants = Tenants(api)
    for name in ("a", "b"):
        selector = {"namespaceSelector": {"matchLabels": {"team": "x"}}}
        tenants.put({"metadata": {"name": name}, "spec": selector})
    assert tenants.ambiguous_of("a") == {}  # its labels not read yet
    with pytest.raises(NoTenant, match="several AgentTenants: a, b"):
        await tenants.resolve("labelled")
    assert tenants.ambiguous_of("a") == {"labelled": ("b",)}
    tenants.remove("b")
    assert tenants.ambiguous_of("a") == {}


def test_a_tenant_that_sets_no_turn_cap_gets_the_platforms() -> None:
    tenants = Tenants(FakeKube(), default_turns=3)
    tenants.put({"metadata": {"name": "own"}, "spec": {"maxConcurrentTurns": 10}})
    tenants.put({"metadata": {"name": "none"}, "spec": {}})
    assert tenants.max_concurrent_turns("own") == 10  # the AgentTenant's own, higher or lower
    assert tenants.max_concurrent_turns("none") == 3
    assert tenants.max_concurrent_turns("deleted") == 3
    assert Tenants(FakeKube(), default_turns=0).max_concurrent_turns("none") is None


async def test_a_namespaces_tool_servers_count_against_its_tenant_the_default_one_included() -> (
    None
):
    """The tenant whose discovery share a namespace's servers count against (the one
    ``tool_server_rules`` names with its rules): the namespaces that fall to the default tenant
    share its share, as they share its budget; a namespace with no tenant, or several, has
    none (its servers are refused at once)."""
    tenants = Tenants(FakeKube(), default="fallback")
    tenants.put({"metadata": {"name": "fallback"}, "spec": {"namespaces": ["listed"]}})
    tenants.put({"metadata": {"name": "acme"}, "spec": {"namespaces": ["team-a"]}})
    tenants.put({"metadata": {"name": "x"}, "spec": {"namespaces": ["shared"]}})
    tenants.put({"metadata": {"name": "y"}, "spec": {"namespaces": ["shared"]}})
    for namespace, tenant in (
        ("team-a", "acme"),
        ("listed", "fallback"),
        ("elsewhere", "fallback"),
    ):
        assert (await tenants.tool_server_rules(namespace))[0] == tenant
    with pytest.raises(NoTenant, match=r"\bx\b"):
        await tenants.tool_server_rules("shared")
    with pytest.raises(NoTenant):
        await Tenants(FakeKube()).tool_server_rules("elsewhere")


@pytest.mark.parametrize(
    ("kind", "namespace", "message"),
    [
        (
            "AgentModel",
            None,
            "AgentModel 'gpt-5' not found (cluster-scoped): "
            "`kubectl get agentmodels` lists those there",
        ),
        (
            "Agent",
            "team-a",
            "Agent 'gpt-5' not found in namespace team-a: "
            "`kubectl get agents -n team-a` lists those there",
        ),
    ],
)
def test_a_missing_reference_says_how_to_list_what_exists(
    kind: str, namespace: str | None, message: str
) -> None:
    assert not_found(kind, "gpt-5", namespace=namespace) == message
