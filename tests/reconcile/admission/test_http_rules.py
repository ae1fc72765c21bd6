"""The tenant's http_get rules travel from the AgentTenant into each run's config, and the
worker gives the run an http_get bound to them."""

from __future__ import annotations

from agentrun.operator.admission import config as admission
from agentrun.operator.agents.spec import model_config
from agentrun.operator.runs import RunKey
from agentrun.operator.runs.spec import AgentRunSpec
from agentrun.operator.tenants import policy as tenancy
from agentrun.protocol import RunConfigShape, UrlRule
from agentrun.tools import HttpGet, default_catalog
from agentrun.worker.turn import TurnDeps


class NoSecrets:
    async def api_key(self, ref: object) -> str:
        raise AssertionError("not read")


def test_the_tenants_url_rules_reach_the_run_config_and_the_workers_http_get() -> None:
    policy = tenancy.TenantPolicy.of(
        {
            "metadata": {"name": "team"},
            "spec": {
                "namespaces": ["ns"],
                "httpGet": {
                    "allow": [
                        {"host": "api.example.com", "pathPrefix": "/v1/"},
                        {"host": "prometheus.monitoring.svc:9090", "privateNetwork": True},
                    ]
                },
            },
        }
    )
    assert policy.url_rules == (
        UrlRule("api.example.com", "/v1/", False),
        UrlRule("prometheus.monitoring.svc:9090", "/", True),
    )
    spec = policy.apply(AgentRunSpec.of({"model": "m", "goal": "g", "tools": ["http_get"]}))
    model = model_config("m", {"spec": {"baseURL": "http://m/v1", "model": "x"}})
    config = admission.build_run_config(
        RunKey("ns", "r", "u"),
        spec,
        model=model,
        known_tools={"http_get": True},
        start_time=0.0,
        resolved=admission.Resolved(url_rules=policy.url_rules),
    )
    config = RunConfigShape.of(config).value()  # as the admitted event carries it
    assert config.url_rules == policy.url_rules
    deps = TurnDeps(model=None, catalog=default_catalog(), secrets=NoSecrets())  # type: ignore[arg-type]
    tool = deps.run_tools(config)["http_get"]
    assert isinstance(tool, HttpGet) and tool.rules == policy.url_rules
    assert isinstance(default_catalog()["http_get"], HttpGet)
    assert default_catalog()["http_get"].rules == ()  # type: ignore[attr-defined]
