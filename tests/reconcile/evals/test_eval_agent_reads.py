"""A suite reads its Agents in one list of its namespace when it runs many of them (a suite of
200 cases, each of its own Agent, read 201 Agents one GET at a time at every reconcile), one GET
each when it runs a few (a list reads every Agent of the namespace); either way a missing Agent
is seen as missing and a refused read fails the reconcile, as before."""

from __future__ import annotations

from typing import Any

import pytest
from kube_support import FakeKube
from trajectory_support import NoEvents

from agentrun import kube
from agentrun.operator import agents
from agentrun.operator.evals.controller import EvalController
from agentrun.operator.evals.status import AgentSeen, round_id
from agentrun.operator.evals.store import AGENTS_BY_GET, EVALS
from agentrun.operator.platform.events import EventRecorder, Throttle
from agentrun.operator.platform.kubeapi import ApiError, Ref

CASES = 200
"""Cases of the big suite, each running its own Agent (the most a suite may have)."""


def agent(name: str, namespace: str = "ns", *, generation: int = 1) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": namespace, "generation": generation},
        "spec": {"model": "mock", "instructions": f"I am {name}.", "tools": []},
    }


def suite(cases: int) -> dict[str, Any]:
    return {
        "metadata": {"name": "suite", "namespace": "ns", "generation": 1, "uid": "suite-uid"},
        "spec": {
            "agentRef": {"name": "bot-0"},
            "parallelism": 2,
            "cases": [
                {"name": f"c{i}", "goal": "Add 2 and 3.", "agentRef": {"name": f"bot-{i}"}}
                for i in range(cases)
            ],
        },
    }


def controller(api: FakeKube) -> EvalController:
    events = EventRecorder(api, throttle=Throttle(repeat_after=0, rate=1000, burst=1000))
    return EvalController(api, runs=NoEvents(), events=events, retry=3600)


def agent_reads(calls: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """The requests of ``calls`` reading Agents: GETs of one, lists of a namespace's."""
    return [
        (verb, what)
        for verb, what in calls
        if (verb == "get" and isinstance(what, Ref) and what.plural == kube.AGENTS)
        or (verb == "list" and what[0] == kube.AGENTS)
    ]


class RefusingAgentReads(FakeKube):
    """``FakeKube`` answering every read of Agents (a GET, a list) with HTTP ``status``; a
    GET's 404 is ``None``, as ``Kube.get`` answers it."""

    def __init__(self, status: int) -> None:
        super().__init__()
        self.status = status

    async def get(self, ref: Ref) -> dict[str, Any] | None:
        if ref.plural != kube.AGENTS:
            return await super().get(ref)
        if self.status == 404:
            return None
        raise ApiError(self.status, "test")

    async def list_kept(self, plural: str, keep: Any, **selected: Any) -> list[Any]:
        if plural == kube.AGENTS:
            raise ApiError(self.status, "test")
        return await super().list_kept(plural, keep, **selected)


def with_agents(
    cases: int, *, missing: int | None = None, others: int = 0, refusing: int | None = None
) -> FakeKube:
    """An API server holding ``suite(cases)``, its Agents (all but ``bot-<missing>``) with
    generation 2, and ``others`` Agents the suite does not run, in its namespace and another;
    its reads of Agents answered with HTTP ``refusing`` when given."""
    api = FakeKube() if refusing is None else RefusingAgentReads(refusing)
    for i in range(cases):
        if i != missing:
            api.put("agents", agent(f"bot-{i}", generation=2))
    for i in range(others):
        api.put("agents", agent(f"other-{i}"))
        api.put("agents", agent(f"bot-{i}", "elsewhere", generation=7))
    api.put(EVALS, suite(cases))
    return api


def expected_round(cases: int, *, missing: int | None = None) -> str:
    seen = [
        AgentSeen(f"bot-{i}")
        if i == missing
        else AgentSeen(f"bot-{i}", 2, agents.digest_of(agent(f"bot-{i}")["spec"]))
        for i in range(cases)
    ]
    return round_id(1, seen)


async def test_a_suite_of_many_agents_reads_them_in_one_request_per_reconcile() -> None:
    api = with_agents(CASES, others=50)
    ctl = controller(api)
    for _ in range(2):  # reconciles repeat: each run that ends asks for one
        before = len(api.calls)
        await ctl.reconcile("ns", "suite")
        this = api.calls[before:]
        assert agent_reads(this) == [("list", ("agents", "ns", ""))]
        # the suite, its Agents, its runs: 3 reads however many Agents it runs (202 before)
        assert sum(verb in ("get", "list") for verb, _ in this) == 3
    status = api.find(EVALS, "suite", "ns")["status"]  # type: ignore[index]
    assert status["round"] == expected_round(CASES)
    assert status["agent"]["generation"] == 2


async def test_a_suite_of_a_few_agents_reads_each_with_a_get_in_a_namespace_of_many() -> None:
    """A list reads every Agent of the namespace: for a few, a GET each costs less."""
    api = with_agents(AGENTS_BY_GET, others=2000)
    await controller(api).reconcile("ns", "suite")
    assert [verb for verb, _ in agent_reads(api.calls)] == ["get"] * AGENTS_BY_GET
    status = api.find(EVALS, "suite", "ns")["status"]  # type: ignore[index]
    assert status["round"] == expected_round(AGENTS_BY_GET)


@pytest.mark.parametrize("cases", [AGENTS_BY_GET, CASES], ids=["by-get", "by-list"])
async def test_a_missing_agent_is_seen_as_missing_in_the_round(cases: int) -> None:
    """Deleted before the reconcile, or between the reads of another: the round names it
    without a generation, and its deletion's watch event asks for the next reconcile."""
    api = with_agents(cases, missing=1)
    await controller(api).reconcile("ns", "suite")
    status = api.find(EVALS, "suite", "ns")["status"]  # type: ignore[index]
    assert status["round"] == expected_round(cases, missing=1)
    assert sum(k[0] == "agentruns" for k in api.objects) == 2  # the round goes on


@pytest.mark.parametrize("status", [403, 500, 0], ids=["forbidden", "server-error", "no-answer"])
@pytest.mark.parametrize("cases", [AGENTS_BY_GET, CASES], ids=["by-get", "by-list"])
async def test_a_refused_read_of_the_agents_fails_the_reconcile(cases: int, status: int) -> None:
    api = with_agents(cases, refusing=status)
    with pytest.raises(ApiError) as raised:
        await controller(api).reconcile("ns", "suite")
    assert raised.value.status == status
    assert not any(k[0] == "agentruns" for k in api.objects)  # no run created, no status
    assert "status" not in api.find(EVALS, "suite", "ns")  # type: ignore[operator]


@pytest.mark.parametrize("cases", [AGENTS_BY_GET, CASES], ids=["by-get", "by-list"])
async def test_agents_not_found_at_all_are_each_missing(cases: int) -> None:
    """A 404 for the reads themselves (no Agent kind served): each Agent missing, as a GET's
    404 always read."""
    api = with_agents(cases, refusing=404)
    await controller(api).reconcile("ns", "suite")
    status = api.find(EVALS, "suite", "ns")["status"]  # type: ignore[index]
    assert status["round"] == round_id(1, [AgentSeen(f"bot-{i}") for i in range(cases)])
