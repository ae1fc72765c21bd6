"""Resolving a run's spec.agentRef against its Agent (pure)."""

from __future__ import annotations

from typing import Any

import pytest

from agentrun.operator import agents


def agent(**spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "m",
        "instructions": "Serve {{ params.team }}.",
        "tools": ["calculate"],
        "budget": {"maxSteps": 5, "maxTokens": 900, "onExhausted": "stop"},
        "parameters": [{"name": "team", "required": True}, {"name": "tone", "default": "dry"}],
    }
    body.update(spec)
    return {"metadata": {"name": "helper", "generation": 4}, "spec": body}


def test_the_run_takes_the_agent_fields_and_overrides_only_budget_caps() -> None:
    run = {
        "goal": "Hi {{params.team}}, {{ params.tone }}.",
        "agentRef": {"name": "helper", "parameters": {"team": "ops"}},
        "budget": {"maxSteps": 2, "onExhausted": "summarize", "noProgress": {"window": 3}},
    }
    resolved = agents.resolve(run, agent())
    assert resolved.spec == {
        "model": "m",
        "instructions": "Serve ops.",
        "tools": ["calculate"],
        "goal": "Hi ops, dry.",
        "budget": {"maxSteps": 2, "maxTokens": 900, "onExhausted": "stop"},
    }
    assert (resolved.agent, resolved.generation) == ("helper", 4)
    assert resolved.digest == agents.digest_of(resolved.spec)


def test_the_digest_is_canonical_and_changes_with_the_definition() -> None:
    assert agents.digest_of({"a": 1, "b": [1, 2]}) == agents.digest_of({"b": [1, 2], "a": 1})
    assert agents.digest_of({"a": 1}) != agents.digest_of({"a": 2})


def test_a_recorded_resolution_is_used_only_when_its_digest_matches() -> None:
    resolved = agents.resolve(
        {"goal": "g", "agentRef": {"name": "helper", "parameters": {"team": "x"}}}, agent()
    )
    assert agents.recorded(resolved.status()) == resolved
    tampered = resolved.status()
    tampered["resolvedSpec"] = {**resolved.spec, "model": "pricier"}
    assert agents.recorded(tampered) is None
    assert agents.recorded({}) is None


INVALID: list[Any] = [
    pytest.param(
        {"team": "a", "x": "1"},
        "g",
        "spec.agentRef.parameters.x: Agent 'helper' declares no parameter 'x' (it declares: "
        "team, tone)",
        id="unknown",
    ),
    pytest.param(
        {},
        "g",
        "spec.agentRef.parameters.team: required by Agent 'helper' and not given",
        id="missing-required",
    ),
    pytest.param(
        {"team": "a"},
        "{{ params.nope }} and {{params.team}}",
        "spec.goal: references {{ params.nope }}, not a parameter of the Agent (declared: "
        "team, tone)",
        id="undeclared-reference",
    ),
]


@pytest.mark.parametrize(("given", "goal", "message"), INVALID)
def test_invalid_references_name_the_field(given: dict[str, str], goal: str, message: str) -> None:
    with pytest.raises(agents.InvalidRef) as raised:
        agents.resolve({"goal": goal, "agentRef": {"name": "helper", "parameters": given}}, agent())
    assert str(raised.value) == message


def test_text_that_only_looks_like_a_reference_is_left_alone() -> None:
    assert agents.substitute("{{ other.x }} {{params.}} {params.a}", {}, field="f") == (
        "{{ other.x }} {{params.}} {params.a}"
    )


READINESS: list[Any] = [
    pytest.param(agent(), True, {"calculate"}, ("Ready", True), id="ready"),
    pytest.param(agent(), False, {"calculate"}, ("ModelNotFound", False), id="no-model"),
    pytest.param(agent(), True, {"sleep"}, ("UnknownTools", False), id="unknown-tool"),
    pytest.param(agent(tools="calc"), True, {"calc"}, ("InvalidSpec", False), id="bad-spec"),
]


@pytest.mark.parametrize(("obj", "model_found", "tools", "expected"), READINESS)
def test_readiness(
    obj: dict[str, Any], model_found: bool, tools: set[str], expected: tuple[str, bool]
) -> None:
    found = agents.readiness(obj, model_found=model_found, known_tools=tools)
    assert (found.reason, found.ready) == expected


def test_the_ready_status_is_written_only_on_change_and_keeps_its_transition_time() -> None:
    ready = agents.Readiness(True, "Ready", "ok")
    first = agents.ready_status(ready, generation=1, previous={}, now=100.0)
    assert first is not None
    assert agents.ready_status(ready, generation=1, previous=first, now=200.0) is None
    bumped = agents.ready_status(ready, generation=2, previous=first, now=200.0)
    assert bumped is not None
    assert (
        bumped["conditions"][0]["lastTransitionTime"]
        == first["conditions"][0]["lastTransitionTime"]
    )
    flipped = agents.ready_status(
        agents.Readiness(False, "ModelNotFound", "gone"), generation=2, previous=bumped, now=300.0
    )
    assert flipped is not None and flipped["conditions"][0]["status"] == "False"
    assert (
        flipped["conditions"][0]["lastTransitionTime"]
        != first["conditions"][0]["lastTransitionTime"]
    )
