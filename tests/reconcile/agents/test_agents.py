"""Resolving a run's spec.agentRef against its Agent (pure)."""

from __future__ import annotations

from typing import Any

import pytest

from agentrun.operator.agents import resolve as agents


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


def test_a_template_is_split_at_its_placeholders_and_rendered() -> None:
    template = agents.parse_template("a {{params.x}} b {{  params.y_2 }}{{ params.x }}", field="f")
    assert template.pieces == ("a ", "x", " b ", "y_2", "", "x", "")
    assert template.names == {"x", "y_2"}
    assert template.render({"x": "1", "y_2": "2"}) == "a 1 b 21"


def test_text_without_a_double_brace_is_left_alone() -> None:
    text = '{params.a} }} {"json": {"nested": 1}}'
    assert agents.substitute(text, {}, field="f") == text


MALFORMED: list[Any] = [
    pytest.param(
        "hi {{ params.x",
        "f: '{{' at character 3 has no matching '}}' (a placeholder is {{ params.NAME }})",
        id="unclosed",
    ),
    pytest.param(
        "{{ params.x }} then {{",
        "f: '{{' at character 20 has no matching '}}' (a placeholder is {{ params.NAME }})",
        id="unclosed-after-a-good-one",
    ),
    pytest.param(
        "{{ other.x }}",
        "f: placeholder '{{ other.x }}' at character 0 is not {{ params.NAME }}",
        id="not-params",
    ),
    pytest.param(
        "x {{params.}}",
        "f: placeholder '{{params.}}' at character 2 is not {{ params.NAME }}",
        id="no-name",
    ),
    pytest.param(
        "{{ params.a-b }}",
        "f: placeholder '{{ params.a-b }}' at character 0 is not {{ params.NAME }}",
        id="bad-name",
    ),
    pytest.param(
        "{{ params.x {{ params.y }}",
        "f: placeholder '{{ params.x {{ params.y }}' at character 0 is not {{ params.NAME }}",
        id="nested",
    ),
    pytest.param(
        "{{ params.x params.y }}",
        "f: placeholder '{{ params.x params.y }}' at character 0 is not {{ params.NAME }}",
        id="two-names",
    ),
]


@pytest.mark.parametrize(("text", "message"), MALFORMED)
def test_a_malformed_placeholder_is_invalid_naming_the_field(text: str, message: str) -> None:
    with pytest.raises(agents.InvalidRef) as raised:
        agents.substitute(text, {"x": "1", "y": "2"}, field="f")
    assert str(raised.value) == message


def test_a_run_of_an_agent_with_malformed_instructions_names_them() -> None:
    run = {"goal": "g", "agentRef": {"name": "helper", "parameters": {"team": "a"}}}
    with pytest.raises(agents.InvalidRef) as raised:
        agents.resolve(run, agent(instructions="hi {{ params.team"))
    assert str(raised.value).startswith(
        "Agent 'helper' spec.instructions: '{{' at character 3 has no matching '}}'"
    )


def test_a_malformed_goal_of_a_run_of_an_agent_is_invalid_naming_spec_goal() -> None:
    run = {"goal": "do {{ team }}", "agentRef": {"name": "helper", "parameters": {"team": "a"}}}
    with pytest.raises(agents.InvalidRef) as raised:
        agents.resolve(run, agent())
    assert str(raised.value) == (
        "spec.goal: placeholder '{{ team }}' at character 3 is not {{ params.NAME }}"
    )


READINESS: list[Any] = [
    pytest.param(agent(), True, {"calculate"}, ("Ready", True), id="ready"),
    pytest.param(agent(), False, {"calculate"}, ("ModelNotFound", False), id="no-model"),
    pytest.param(agent(), True, {"sleep"}, ("UnknownTools", False), id="unknown-tool"),
    pytest.param(agent(tools="calc"), True, {"calc"}, ("InvalidSpec", False), id="bad-spec"),
    pytest.param(
        agent(instructions=None), True, {"calculate"}, ("Ready", True), id="no-instructions"
    ),
]


NOT_READY_INSTRUCTIONS: list[Any] = [
    pytest.param(
        "hi {{ params.team",
        "spec.instructions: '{{' at character 3 has no matching '}}' "
        "(a placeholder is {{ params.NAME }})",
        id="unclosed",
    ),
    pytest.param(
        "hi {{ team }}",
        "spec.instructions: placeholder '{{ team }}' at character 3 is not {{ params.NAME }}",
        id="not-params",
    ),
    pytest.param(
        "hi {{ params.team }} {{ params.colour }}",
        "spec.instructions: references {{ params.colour }}, not a parameter of the Agent "
        "(declared: team, tone)",
        id="undeclared",
    ),
]


@pytest.mark.parametrize(("obj", "model_found", "tools", "expected"), READINESS)
def test_readiness(
    obj: dict[str, Any], model_found: bool, tools: set[str], expected: tuple[str, bool]
) -> None:
    found = agents.readiness(obj, model_found=model_found, known_tools=tools)
    assert (found.reason, found.ready) == expected


@pytest.mark.parametrize(("instructions", "message"), NOT_READY_INSTRUCTIONS)
def test_an_agent_whose_instructions_have_a_bad_placeholder_is_not_ready(
    instructions: str, message: str
) -> None:
    found = agents.readiness(
        agent(instructions=instructions), model_found=True, known_tools={"calculate"}
    )
    assert found == agents.Readiness(False, "InvalidSpec", message)


def test_an_agent_with_a_misspelled_tool_is_not_ready_naming_the_close_one() -> None:
    found = agents.readiness(
        agent(tools=["calculte"]), model_found=True, known_tools={"calculate", "sleep"}
    )
    assert found.reason == "UnknownTools"
    assert found.message.startswith(
        "spec.tools: unknown tool(s) calculte (did you mean 'calculate'?); the worker's catalog"
    )


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


def test_a_render_past_the_bound_stops_there_naming_the_field() -> None:
    """131 KB of Agent and run: instructions naming one 64 Ki parameter thousands of times
    would render to gigabytes; the render stops at the field's own bound."""
    instructions = "{{ params.team }}" * 3_000
    run = {"goal": "g", "agentRef": {"name": "helper", "parameters": {"team": "x" * 65_536}}}
    with pytest.raises(agents.InvalidRef) as raised:
        agents.resolve(run, agent(instructions=instructions))
    assert str(raised.value) == (
        "Agent 'helper' spec.instructions: with its parameters substituted it is longer than "
        "65536 characters (the limit of the field written in full); shorten it or the "
        "parameter values it references"
    )
    goal = {"goal": "{{ params.team }}{{ params.team }}", "agentRef": run["agentRef"]}
    with pytest.raises(agents.InvalidRef, match=r"^spec\.goal: with its parameters"):
        agents.resolve(goal, agent())


def test_a_render_at_the_bound_is_whole() -> None:
    template = agents.parse_template("{{ params.x }}-", field="f")
    assert template.render({"x": "y" * 65_535}) == "y" * 65_535 + "-"
    with pytest.raises(agents.TooLong):
        template.render({"x": "y" * 65_536})


def test_an_agent_output_schema_over_the_bound_is_refused_naming_it() -> None:
    huge = {"schema": {"description": "d" * 1_200_000}}
    run = {"goal": "g", "agentRef": {"name": "helper", "parameters": {"team": "a"}}}
    with pytest.raises(agents.InvalidRef, match=r"^Agent 'helper' spec\.output\.schema: 12000"):
        agents.resolve(run, agent(output=huge))
    found = agents.readiness(agent(output=huge), model_found=True, known_tools={"calculate"})
    assert (found.reason, found.message[:40]) == (
        "InvalidSpec",
        "spec.output.schema: 1200018 bytes as JSO",
    )


def test_an_agent_whose_output_schema_has_a_lookahead_is_not_ready() -> None:
    output = {"schema": {"properties": {"id": {"pattern": "^(?=x)"}}}}
    found = agents.readiness(agent(output=output), model_found=True, known_tools={"calculate"})
    assert found.reason == "InvalidSpec"
    assert found.message.startswith("spec.output.schema: at /properties/id/pattern: '^(?=x)'")
