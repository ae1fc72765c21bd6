"""A run's config is built once while what it is built from stays the same: the create
handler's build (to reject at once what can never run) is the one the pump admits with, its
deadline counted from the admission; an edited AgentModel, tenant or spec builds it anew."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from kube_support import FakeKube

from agentrun import kube
from agentrun.operator.admission import lookup
from agentrun.operator.admission.lookup import RunConfigs
from agentrun.operator.agents.models import ModelCache
from agentrun.operator.runs import RunKey
from agentrun.operator.tenants.policy import TenantPolicy
from agentrun.operator.toolservers.store import ToolServerCache
from agentrun.protocol import RunConfig
from agentrun_dev import demo

RUN = RunKey("default", "r", "uid-r")
SPEC = {"model": demo.MODEL_NAME, "goal": "add", "tools": ["calculate"]}
TENANT = demo.default_tenant()


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Counted:
    """``lookup.build_run_config``, counting its calls."""

    def __init__(self) -> None:
        self.calls = 0
        self.real = lookup.build_run_config

    def __call__(self, *args: Any, **kwargs: Any) -> RunConfig:
        self.calls += 1
        return self.real(*args, **kwargs)


@pytest.fixture
def builds(monkeypatch: pytest.MonkeyPatch) -> Counted:
    counted = Counted()
    monkeypatch.setattr(lookup, "build_run_config", counted)
    return counted


def configs(api: FakeKube, clock: Clock) -> RunConfigs:
    return RunConfigs(
        ModelCache(api, clock=clock),
        known_tools={"calculate": False},
        tool_specs=lambda names: [],
        servers=ToolServerCache(api, clock=clock),
    )


def api_with_model(**spec: Any) -> FakeKube:
    api = FakeKube()
    model = demo.mock_model("http://127.0.0.1:9/v1")
    model["spec"].update(spec)
    api.put(kube.MODELS, model)
    return api


async def fresh(api: FakeKube, policy: TenantPolicy, *, start_time: float) -> RunConfig:
    """What a build that keeps nothing makes."""
    return await configs(api, Clock()).build_config(RUN, SPEC, policy, start_time=start_time)


async def test_the_admissions_build_reuses_the_handlers_with_the_deadline_from_admission(
    builds: Counted,
) -> None:
    api, clock, policy = api_with_model(), Clock(), TenantPolicy.of(TENANT)
    runs = configs(api, clock)
    validated = await runs.build_config(RUN, SPEC, policy, start_time=100.0)
    clock.now = 60.0  # past the AgentModel's cache: it is read again, and is the same
    admitted = await runs.build_config(RUN, dict(SPEC), policy, start_time=160.0)
    assert builds.calls == 1
    assert admitted.deadline == validated.deadline + 60.0
    builds.calls = 0
    assert admitted == await fresh(api, policy, start_time=160.0)


async def test_an_edited_agentmodel_builds_the_config_anew(builds: Counted) -> None:
    api, clock, policy = api_with_model(), Clock(), TenantPolicy.of(TENANT)
    runs = configs(api, clock)
    before = await runs.build_config(RUN, SPEC, policy, start_time=100.0)
    edited = copy.deepcopy(api.find(kube.MODELS, demo.MODEL_NAME))
    assert edited is not None
    edited["spec"]["maxOutputTokens"] = 1234
    runs.models.put(demo.MODEL_NAME, edited)  # as the AgentModel watch tells it
    after = await runs.build_config(RUN, SPEC, policy, start_time=100.0)
    assert builds.calls == 2
    assert after.model.max_output_tokens == 1234 != before.model.max_output_tokens


async def test_an_edited_tenant_builds_the_config_anew(builds: Counted) -> None:
    api, clock = api_with_model(), Clock()
    runs = configs(api, clock)
    await runs.build_config(RUN, SPEC, TenantPolicy.of(TENANT), start_time=100.0)
    capped = copy.deepcopy(TENANT)
    capped["spec"]["runBudget"] = {"default": {"maxSteps": 3}}
    after = await runs.build_config(RUN, SPEC, TenantPolicy.of(capped), start_time=100.0)
    assert builds.calls == 2
    assert after.limits.max_steps == 3


async def test_another_spec_under_the_same_uid_builds_the_config_anew(builds: Counted) -> None:
    api, clock, policy = api_with_model(), Clock(), TenantPolicy.of(TENANT)
    runs = configs(api, clock)
    await runs.build_config(RUN, SPEC, policy, start_time=100.0)
    after = await runs.build_config(RUN, {**SPEC, "goal": "multiply"}, policy, start_time=100.0)
    assert builds.calls == 2
    assert after.goal == "multiply"


async def test_a_run_forgotten_is_built_anew(builds: Counted) -> None:
    api, clock, policy = api_with_model(), Clock(), TenantPolicy.of(TENANT)
    runs = configs(api, clock)
    await runs.build_config(RUN, SPEC, policy, start_time=100.0)
    runs.forget(RUN.uid)
    await runs.build_config(RUN, SPEC, policy, start_time=100.0)
    assert builds.calls == 2
