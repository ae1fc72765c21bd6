"""A committed trajectory replays: the example runs' events, folded again, give the same run.

For every AgentRun in ``examples/**/*.yaml`` with the scenarios of ``examples/scenarios.yaml``:
admit it as the operator does, run its loop in-process (the worker's ``execute_turn`` and
``kernel.advance`` against the scripted model over HTTP, with the real ``openai`` client),
and keep its events as the bytes JetStream would store. Then

- folding the decoded records from ``kernel.initial_state`` gives the same final state, and
  so does the shared replay of workers and operator (``agentrun.history.fold``);
- running the loop again against a fresh scripted model makes the same decisions (kinds,
  tools, arguments, call ids) and ends with the same terminal reason;
- each example ends as its manifest says.
"""

from __future__ import annotations

import dataclasses
import pathlib
import time
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
import yaml
from seals_support import VERIFIER, sealed

from agentrun import history, kernel
from agentrun.operator.admission import config as admission
from agentrun.operator.agents import resolve as agents
from agentrun.operator.agents.spec import model_config
from agentrun.operator.runs import RunKey
from agentrun.operator.runs.spec import AgentRunSpec
from agentrun.protocol import RunConfig, RunEvent
from agentrun.testing import mockllm, scenario
from agentrun.tools import default_catalog
from agentrun.worker.model import ModelClient, RetryPolicy
from agentrun.worker.turn import TurnDeps, execute_turn
from agentrun_dev import demo

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"
SCENARIOS = scenario.parse_scenarios((EXAMPLES / "scenarios.yaml").read_text())

ENDINGS = {
    "rectangle": kernel.TerminalReason.COMPLETED,
    "collatz": kernel.TerminalReason.MAX_STEPS,
    "inventory": kernel.TerminalReason.TOOL_BUDGET_EXHAUSTED,
    "rectangle-from-agent": kernel.TerminalReason.COMPLETED,
}
"""How each example run ends, as its manifest's comment and examples/README.md say."""


def example_runs() -> dict[str, Mapping[str, Any]]:
    """Every AgentRun object in ``examples/**/*.yaml``, by name; a run of an Agent carries the
    spec the operator resolves from that Agent (also in ``examples/``)."""
    documents = [
        document
        for path in sorted(EXAMPLES.rglob("*.yaml"))
        for document in yaml.safe_load_all(path.read_text())
        if isinstance(document, dict)
    ]
    defined = {d["metadata"]["name"]: d for d in documents if d.get("kind") == "Agent"}
    runs: dict[str, Mapping[str, Any]] = {}
    for document in documents:
        if document.get("kind") != "AgentRun":
            continue
        spec = document["spec"]
        if "agentRef" in spec:
            resolved = agents.resolve(spec, defined[spec["agentRef"]["name"]])
            document = {**document, "spec": resolved.spec}
        runs[document["metadata"]["name"]] = document
    return runs


RUNS = example_runs()


class NoSecrets:
    async def api_key(self, ref: Any) -> str:
        raise AssertionError("the mock AgentModel has no secret")


@dataclasses.dataclass(frozen=True)
class Trajectory:
    """A finished run: its config, final state, turn records and event payloads."""

    config: RunConfig
    state: kernel.RunState
    records: tuple[kernel.TurnRecord, ...]
    payloads: tuple[bytes, ...]
    """Every event as stored: ``admitted``, then one ``turn`` event per committed turn."""


async def run_example(run: Mapping[str, Any]) -> Trajectory:
    """Admit ``run`` as the operator does and drive its loop to the end, as the workers do."""
    catalog = default_catalog(kube=None)
    model = ModelClient(RetryPolicy(max_retries=2))
    uid = f"uid-{run['metadata']['name']}"
    try:
        async with mockllm.MockLLM(SCENARIOS) as mock:
            config = admission.build_run_config(
                RunKey("default", run["metadata"]["name"], uid),
                AgentRunSpec.of(run["spec"]),
                model=model_config(demo.MODEL_NAME, demo.mock_model(mock.base_url)),
                known_tools={name: tool.spec.pollable for name, tool in catalog.items()},
                start_time=time.time(),
            )
            deps = TurnDeps(model=model, catalog=catalog, secrets=NoSecrets())
            state = kernel.initial_state(goal=config.goal, instructions=config.instructions)
            events = [sealed(RunEvent("admitted", uid, state.summary(), config=config))]
            records: list[kernel.TurnRecord] = []
            while not state.phase.is_terminal:
                record = await execute_turn(deps, config, state)
                state = kernel.advance(state, record, config.limits)
                records.append(record)
                events.append(RunEvent("turn", uid, state.summary(), record=record))
    finally:
        await model.close()
    return Trajectory(config, state, tuple(records), tuple(e.encode() for e in events))


def decisions(records: Sequence[kernel.TurnRecord]) -> list[tuple[Any, ...]]:
    """What each turn decided: its kind, how it stopped, the decision kind, and the calls
    with ids and arguments."""
    out: list[tuple[Any, ...]] = []
    for record in records:
        calls = tuple(
            (c.id, c.name, dict(c.arguments) if isinstance(c, kernel.CheckedCall) else c.error)
            for c in (record.calls if isinstance(record, kernel.Answered) else ())
        )
        stopped = (
            record.ending
            if isinstance(record, kernel.Stopped)
            else getattr(record, "stopped", None)
        )
        out.append(
            (
                record.turn,
                type(record).__name__,
                stopped.phase if stopped is not None else None,
                type(getattr(record, "decision", None)).__name__,
                calls,
                tuple(
                    (r.tool_call_id, r.content, r.is_error) for r in kernel.record_results(record)
                ),
            )
        )
    return out


def ending(state: kernel.RunState) -> kernel.TerminalReason:
    terminal = kernel.conclude(state.phase, steps=state.steps)
    assert terminal is not None, f"the run did not end: {state.phase}"
    return terminal.reason


example_names = pytest.mark.parametrize("name", sorted(RUNS), ids=str)


def test_every_example_run_has_a_known_ending() -> None:
    assert set(RUNS) == set(ENDINGS)


@example_names
async def test_an_example_run_ends_as_its_manifest_says(name: str) -> None:
    trajectory = await run_example(RUNS[name])
    assert ending(trajectory.state) is ENDINGS[name]


@example_names
async def test_a_committed_trajectory_folds_back_to_the_same_run(name: str) -> None:
    trajectory = await run_example(RUNS[name])
    events = [RunEvent.decode(p, seq=i) for i, p in enumerate(trajectory.payloads, start=1)]
    admitted, turns = events[0], events[1:]
    assert admitted.config == trajectory.config
    assert [e.record for e in turns] == list(trajectory.records)

    replayed = kernel.initial_state(
        goal=admitted.config.goal, instructions=admitted.config.instructions
    )
    for event in turns:
        assert event.record is not None
        replayed = kernel.advance(replayed, event.record, admitted.config.limits)
        assert event.summary == replayed.summary()
    live = trajectory.state
    assert (replayed.phase, replayed.answer, replayed.usage) == (
        live.phase,
        live.answer,
        live.usage,
    )
    assert replayed.messages == live.messages
    assert replayed == live

    loaded = history.fold(events, run_uid=admitted.run_uid, seals=VERIFIER)
    assert loaded is not None and loaded.state == live and loaded.seq == len(events)


@example_names
async def test_a_second_run_against_a_fresh_model_makes_the_same_decisions(name: str) -> None:
    first = await run_example(RUNS[name])
    committed = [RunEvent.decode(p).record for p in first.payloads[1:]]
    second = await run_example(RUNS[name])
    assert decisions(second.records) == decisions([r for r in committed if r is not None])
    assert ending(second.state) is ending(first.state)
    assert second.state.usage == first.state.usage
