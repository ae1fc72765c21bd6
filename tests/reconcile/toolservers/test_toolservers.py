"""AgentToolServers: the status discovery writes, and how a run's SERVER/TOOL names resolve at
admission (allowlist, last good list, tenant grants, the names the model sees)."""

from __future__ import annotations

import difflib
import random
import string
from typing import Any

import pytest

from agentrun.operator.admission import config as admission
from agentrun.operator.agents.spec import model_config
from agentrun.operator.platform.spec import (
    HINT_CHOICES,
    HINT_COMPARISONS,
    HINT_RATIOS,
    SpecError,
    hint,
    with_hints,
)
from agentrun.operator.runs import RunKey
from agentrun.operator.runs.spec import AgentRunSpec
from agentrun.operator.tenants import policy as tenancy
from agentrun.operator.toolservers.resolve import check_reach, is_pending, resolve_tool
from agentrun.operator.toolservers.spec import AgentToolServerSpec
from agentrun.operator.toolservers.status import discovered_status, failed_status
from agentrun.protocol import RemoteTool, RunConfigShape, UrlRule
from agentrun.tools import remote

NOW = 1_700_000_000.0
SPEC_AS_WRITTEN: dict[str, Any] = {
    "url": "http://tools.svc:8000/mcp",
    "headersFrom": {"secretRef": {"name": "tools-auth"}, "keys": ["Authorization"]},
    "timeouts": {"call": "5s"},
    "tools": [{"name": "add"}, {"name": "create_ticket", "effect": "write"}],
}
SPEC = AgentToolServerSpec.of(SPEC_AS_WRITTEN)
RULES = (UrlRule("other.example"), UrlRule("tools.svc:8000", "/", private_network=True))
"""The tenant's ``spec.toolServers.allow``: the server's host and port, in-cluster."""


def resolve(reference: str, server: dict[str, Any] | None) -> RemoteTool:
    return resolve_tool(reference, server, namespace="ns", rules=RULES, tenant="team")


ADD_SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
FOUND = [
    remote.Discovered("add", "Add numbers.", ADD_SCHEMA),
    remote.Discovered("create_ticket", "Open a ticket.", {"type": "object"}),
    remote.Discovered("drop_database", "Never offered.", {"type": "object"}),
]


def server_object(
    status: dict[str, Any] | None, spec: dict[str, Any] = SPEC_AS_WRITTEN
) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "metadata": {"name": "tools", "namespace": "ns", "generation": 2},
        "spec": spec,
    }
    if status is not None:
        obj["status"] = status
    return obj


def test_discovery_offers_only_allowlisted_tools_with_their_schemas() -> None:
    status = discovered_status(SPEC, FOUND, generation=2, now=NOW)
    assert [t["name"] for t in status["tools"]] == ["add", "create_ticket"]
    assert status["tools"][0]["inputSchema"] == ADD_SCHEMA
    assert status["tools"][1]["effect"] == "write"
    assert status["toolCount"] == 2 and status["observedGeneration"] == 2
    (ready,) = status["conditions"]
    assert (ready["status"], ready["reason"]) == ("True", "Discovered")
    assert status["lastRefreshTime"] == "2023-11-14T22:13:20Z"


def test_an_allowlisted_tool_the_server_lacks_makes_it_not_ready() -> None:
    status = discovered_status(SPEC, FOUND[:1], generation=2, now=NOW)
    (ready,) = status["conditions"]
    assert (ready["status"], ready["reason"]) == ("False", "ToolsMissing")
    assert "does not offer create_ticket" in ready["message"]


def test_an_allowlisted_tool_misspelled_names_the_offered_one_it_is_close_to() -> None:
    spec = AgentToolServerSpec.of({**SPEC_AS_WRITTEN, "tools": [{"name": "create_tiket"}]})
    (ready,) = discovered_status(spec, FOUND, generation=2, now=NOW)["conditions"]
    assert ready["reason"] == "ToolsMissing"
    assert ready["message"].startswith(
        "the server does not offer create_tiket (did you mean 'create_ticket'?); it offers add, "
    )


def test_no_tool_is_suggested_among_more_than_hint_choices() -> None:
    many = ["calculate", *(f"tool_{i:05}" for i in range(HINT_CHOICES))]
    assert hint("calculte", many[:HINT_CHOICES]) == " (did you mean 'calculate'?)"
    assert hint("calculte", many) == ""


def test_hints_of_hostile_names_do_bounded_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """128 names of 64 characters against 1,000 choices, all the same letters in another
    order (each passes difflib's cheap bounds, so each pair would cost a full, quadratic
    ratio): one message's hints look at ``HINT_COMPARISONS`` pairs and compute
    ``HINT_RATIOS`` ratios at most (before, 128,000 of each: 9.5 s of the operator's loop)."""
    rng = random.Random(1)
    letters = string.ascii_letters + string.digits + "_-"
    names = ["".join(rng.sample(letters, 64)) for _ in range(128)]
    choices = ["".join(rng.sample(letters, 64)) for _ in range(1_000)]
    counted = {"quick": 0, "ratio": 0}
    quick, ratio = difflib.SequenceMatcher.quick_ratio, difflib.SequenceMatcher.ratio

    def counting(kind: str, real: Any) -> Any:
        def counted_call(self: difflib.SequenceMatcher[str]) -> float:
            counted[kind] += 1
            return float(real(self))

        return counted_call

    monkeypatch.setattr(difflib.SequenceMatcher, "quick_ratio", counting("quick", quick))
    monkeypatch.setattr(difflib.SequenceMatcher, "ratio", counting("ratio", ratio))
    shown = with_hints(names, choices)
    assert shown.startswith(", ".join(sorted(names))[:64])
    assert 0 < counted["quick"] <= HINT_COMPARISONS
    assert 0 < counted["ratio"] <= HINT_RATIOS


def test_a_failed_refresh_keeps_the_last_good_list_and_says_so() -> None:
    good = discovered_status(SPEC, FOUND, generation=2, now=NOW)
    failed = failed_status(good, "connection refused", generation=2, now=NOW + 300)
    assert failed["tools"] == good["tools"]
    assert failed["lastRefreshTime"] == good["lastRefreshTime"]
    (ready,) = failed["conditions"]
    assert (ready["status"], ready["reason"]) == ("False", "RefreshFailed")
    assert "keeping the 2 tool(s) discovered at 2023-11-14T22:13:20Z" in ready["message"]


def test_a_server_never_discovered_offers_nothing() -> None:
    failed = failed_status({}, "timed out", generation=1, now=NOW)
    assert failed["tools"] == [] and failed["conditions"][0]["reason"] == "DiscoveryFailed"


def test_a_discovered_tool_resolves_to_what_the_worker_calls() -> None:
    status = discovered_status(SPEC, FOUND, generation=2, now=NOW)
    tool = resolve("tools/create_ticket", server_object(status))
    assert (tool.name, tool.server, tool.tool, tool.effect) == (
        "tools__create_ticket",
        "tools",
        "create_ticket",
        "write",
    )
    assert (tool.url, tool.timeout, tool.headers_secret, tool.headers_keys) == (
        "http://tools.svc:8000/mcp",
        5,
        "tools-auth",
        ("Authorization",),
    )
    assert tool.private_network  # the rule that allowed the URL goes with the tool
    assert tool.path_prefix == "/"


def test_the_rules_path_prefix_goes_with_the_tool() -> None:
    """Every request of the worker's sessions is held under it (an SSE server's ``endpoint``
    event too), not only the URL checked here."""
    server = server_object(discovered_status(SPEC, FOUND, generation=2, now=NOW))
    rules = (UrlRule("tools.svc:8000", "/mc"), UrlRule("tools.svc:8000", "/mcp"))
    tool = resolve_tool("tools/add", server, namespace="ns", rules=rules, tenant="team")
    assert tool.path_prefix == "/mc"  # the first rule that allows the URL, as admitted


@pytest.mark.parametrize(
    "rules",
    [
        pytest.param((), id="no-rule"),
        pytest.param((UrlRule("tools.svc:9000"),), id="other-port"),
        pytest.param((UrlRule("tools.svc", "/admin/"),), id="other-path"),
        pytest.param((UrlRule("svc"),), id="a-suffix-is-not-the-host"),
    ],
)
def test_a_server_whose_url_the_tenant_does_not_allow_is_refused_naming_the_rules(
    rules: tuple[UrlRule, ...],
) -> None:
    server = server_object(discovered_status(SPEC, FOUND, generation=2, now=NOW))
    for check in (
        lambda: resolve_tool("tools/add", server, namespace="ns", rules=rules, tenant="team"),
        lambda: check_reach("tools/add", server, rules=rules, tenant="team"),
    ):
        with pytest.raises(SpecError) as caught:
            check()
        message = str(caught.value)
        assert message.startswith("spec.tools: tools/add: AgentToolServer 'tools': spec.url: ")
        assert "is not allowed by AgentTenant 'team' (spec.toolServers.allow: " in message
    check_reach("tools/add", server, rules=RULES, tenant="team")  # allowed: no error


def test_a_headers_secret_sends_only_the_keys_it_lists() -> None:
    with pytest.raises(SpecError, match=r"spec\.headersFrom\.keys"):
        AgentToolServerSpec.of({**SPEC_AS_WRITTEN, "headersFrom": {"secretRef": {"name": "s"}}})
    with pytest.raises(SpecError, match=r"spec\.headersFrom\.keys"):
        AgentToolServerSpec.of(
            {**SPEC_AS_WRITTEN, "headersFrom": {"secretRef": {"name": "s"}, "keys": []}}
        )


@pytest.mark.parametrize(
    "key", ["Host", "x-forwarded-host", "X-Original-URL", "Content-Length", "Mcp-Session-Id"]
)
def test_a_headers_secret_cannot_give_a_header_that_routes_or_frames_a_request(key: str) -> None:
    """A shared gateway routes by ``Host`` (or ``X-Forwarded-Host``, ``X-Original-URL``): sent
    from a tenant's Secret, it would reach a server its tenant's rule does not allow."""
    spec = {**SPEC_AS_WRITTEN, "headersFrom": {"secretRef": {"name": "s"}, "keys": [key]}}
    with pytest.raises(SpecError, match=rf"spec\.headersFrom\.keys: '{key}' cannot be sent"):
        AgentToolServerSpec.of(spec)


def test_the_last_good_list_still_resolves_after_a_failed_refresh() -> None:
    good = discovered_status(SPEC, FOUND, generation=2, now=NOW)
    failed = failed_status(good, "down", generation=2, now=NOW + 1)
    assert resolve("tools/add", server_object(failed)).parameters == ADD_SCHEMA


@pytest.mark.parametrize(
    ("reference", "status", "message"),
    [
        pytest.param(
            "gone/add",
            None,
            "AgentToolServer 'gone' not found in namespace ns: "
            "`kubectl get agenttoolservers -n ns` lists those there",
            id="no-server",
        ),
        pytest.param(
            "tools/drop_database",
            "discovered",
            "does not offer 'drop_database' (spec.tools: add, create_ticket)",
            id="not-allowlisted",
        ),
        pytest.param(
            "tools/create_tiket",
            "discovered",
            "does not offer 'create_tiket' (did you mean 'create_ticket'?) (spec.tools: add, ",
            id="misspelled",
        ),
        pytest.param(
            "tools/add", "failed", "not discovered on AgentToolServer 'tools': down", id="never"
        ),
    ],
)
def test_a_tool_that_is_not_offered_is_an_invalid_spec(
    reference: str, status: str | None, message: str
) -> None:
    server = None
    if status == "discovered":
        server = server_object(discovered_status(SPEC, FOUND, generation=2, now=NOW))
    elif status == "failed":
        server = server_object(failed_status({}, "down", generation=2, now=NOW))
    with pytest.raises(SpecError) as caught:
        resolve(reference, server)
    assert message in str(caught.value)


def test_a_server_not_looked_at_yet_is_pending() -> None:
    assert is_pending(server_object(None))
    ready = discovered_status(SPEC, FOUND, generation=2, now=NOW)
    assert not is_pending(server_object(ready))
    assert not is_pending(None)


def test_admission_gives_the_model_function_names_everywhere() -> None:
    status = discovered_status(SPEC, FOUND, generation=2, now=NOW)
    tools = [resolve(name, server_object(status)) for name in ("tools/add", "tools/create_ticket")]
    spec = AgentRunSpec.of(
        {
            "model": "m",
            "goal": "g",
            "tools": ["calculate", "tools/add", "tools/create_ticket"],
            "approval": {"tools": ["tools/create_ticket"]},
            "budget": {"noProgress": {"pollable": ["tools/add"]}},
        }
    )
    model = model_config("m", {"spec": {"baseURL": "http://m/v1", "model": "x"}})
    config = admission.build_run_config(
        RunKey("ns", "run", "uid"),
        spec,
        model=model,
        known_tools={"calculate": False},
        start_time=0.0,
        resolved=admission.Resolved(remote_tools=tools),
    )
    assert config.tools == ("calculate", "tools__add", "tools__create_ticket")
    assert config.limits.approval_tools == {"tools__create_ticket"}
    assert config.limits.pollable == {"tools__add"}
    # the admitted event carries them whole
    assert RunConfigShape.of(config).value().remote_tools == config.remote_tools


def test_a_tool_of_no_server_is_unknown() -> None:
    spec = AgentRunSpec.of({"model": "m", "goal": "g", "tools": ["tools/add"]})
    model = model_config("m", {"spec": {"baseURL": "http://m/v1", "model": "x"}})
    with pytest.raises(SpecError, match="unknown tool"):
        admission.build_run_config(
            RunKey("ns", "r", "u"), spec, model=model, known_tools={}, start_time=0.0
        )


@pytest.mark.parametrize(
    ("allowed", "tool", "granted"),
    [
        pytest.param(["tools/add"], "tools/add", True, id="exact"),
        pytest.param(["tools/*"], "tools/create_ticket", True, id="whole-server"),
        pytest.param(["tools/add"], "tools/create_ticket", False, id="other-tool"),
        pytest.param(["other/*"], "tools/add", False, id="other-server"),
        pytest.param(["calculate"], "tools/add", False, id="built-ins-only"),
    ],
)
def test_the_tenant_grants_mcp_tools_by_name_or_whole_server(
    allowed: list[str], tool: str, granted: bool
) -> None:
    policy = tenancy.TenantPolicy.of(
        {"metadata": {"name": "team"}, "spec": {"namespaces": ["ns"], "allowedTools": allowed}}
    )
    spec = AgentRunSpec.of({"model": "m", "goal": "g", "tools": [tool]})
    if granted:
        assert policy.apply(spec).tools == (tool,)
    else:
        with pytest.raises(SpecError, match="not allowed by AgentTenant 'team'"):
            policy.apply(spec)


def test_a_function_name_longer_than_openai_allows_is_refused() -> None:
    raw = {**SPEC_AS_WRITTEN, "tools": [{"name": "t" * 60}]}
    spec = AgentToolServerSpec.of(raw)
    found = [remote.Discovered("t" * 60, "", {"type": "object"})]
    status = discovered_status(spec, found, generation=1, now=NOW)
    with pytest.raises(SpecError, match="longer than 64"):
        resolve("tools/" + "t" * 60, server_object(status, raw))


HOSTILE_SPEC = AgentToolServerSpec.of(
    {"url": "http://tools.svc/mcp", "tools": [{"name": "add"}, {"name": "ahead"}, {"name": "big"}]}
)


def test_a_tool_whose_schema_the_platform_cannot_check_is_left_out_saying_why() -> None:
    found = [
        remote.Discovered("add", "Add numbers.", {"properties": {"a": {"pattern": "^(a+)+$"}}}),
        remote.Discovered("ahead", "Lookahead.", {"properties": {"a": {"pattern": "^(?!x)"}}}),
        remote.Discovered("big", "Large.", {"description": "x" * 70_000}),
    ]
    status = discovered_status(HOSTILE_SPEC, found, generation=1, now=NOW)
    assert [t["name"] for t in status["tools"]] == ["add"]  # RE2 runs ^(a+)+$ in linear time
    (ready,) = status["conditions"]
    assert (ready["status"], ready["reason"]) == ("False", "ToolsUnusable")
    assert ready["message"].startswith(
        "1 tool(s) usable; the platform cannot use ahead: inputSchema at /properties/a/pattern: "
        "'^(?!x)' is not a regular expression the linear-time engine accepts"
    )
    assert "big: inputSchema 70018 bytes as JSON, over the 65536-byte limit" in ready["message"]
    unusable = server_object(status, {**SPEC_AS_WRITTEN, "tools": [{"name": "ahead"}]})
    with pytest.raises(SpecError, match="not discovered on AgentToolServer 'tools': 1 tool"):
        resolve("tools/ahead", unusable)


def test_descriptions_and_the_schemas_of_one_status_are_bounded() -> None:
    names = [f"t{i}" for i in range(12)]
    spec = AgentToolServerSpec.of({"url": "http://x/mcp", "tools": [{"name": n} for n in names]})
    schema = {"description": "s" * 60_000}
    found = [remote.Discovered(n, "d" * 10_000, schema) for n in names]
    status = discovered_status(spec, found, generation=1, now=NOW)
    assert len(status["tools"]) == 8  # 8 x 60 KB fit the 512 KiB of schemas one status holds
    assert all(len(t["description"]) == 4096 for t in status["tools"])
    (ready,) = status["conditions"]
    assert (
        "t8: inputSchema no room left in the status for its 60018-byte schema" in (ready["message"])
    )
    assert len(ready["message"]) <= 1024
