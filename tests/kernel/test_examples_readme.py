"""The runs examples/README.md asks a reader to apply are valid and do what it says of them:
the walk it says to cancel lasts long enough to be cancelled by hand."""

from __future__ import annotations

import pathlib
import re
import time
from typing import Any

import yaml

from agentrun.operator.admission import config as admission
from agentrun.operator.agents.spec import model_config
from agentrun.operator.runs import RunKey
from agentrun.operator.runs.spec import AgentRunSpec
from agentrun.protocol import RunConfig
from agentrun.tools import default_catalog
from agentrun_dev import demo

README = pathlib.Path(__file__).resolve().parents[2] / "examples" / "README.md"
HEREDOC = re.compile(r"<<'EOF'\n(.*?)\nEOF\n", re.DOTALL)
BY_HAND = 100
"""Turns of one call each a run to cancel by hand must have room for: at the demo's pace
(about 25 turns a second) four seconds or more."""


def readme_runs() -> dict[str, dict[str, Any]]:
    """The AgentRuns of the README's ``kubectl apply -f - <<'EOF'`` blocks, by name."""
    found = (yaml.safe_load(block) for block in HEREDOC.findall(README.read_text()))
    return {run["metadata"]["name"]: run for run in found if run.get("kind") == "AgentRun"}


def admitted(run: dict[str, Any]) -> RunConfig:
    """``run`` admitted as the demo's operator admits it (the ``mock`` AgentModel)."""
    catalog = default_catalog(kube=None)
    return admission.build_run_config(
        RunKey("default", run["metadata"]["name"], "uid"),
        AgentRunSpec.of(run["spec"]),
        model=model_config(demo.MODEL_NAME, demo.mock_model("http://127.0.0.1:1/v1")),
        known_tools={name: tool.spec.pollable for name, tool in catalog.items()},
        start_time=time.time(),
    )


def test_every_run_of_the_readme_is_admitted() -> None:
    runs = readme_runs()
    assert {"long-collatz", "held-rectangle"} <= set(runs)
    for run in runs.values():
        admitted(run)


def test_the_walk_to_cancel_has_room_for_a_hundred_one_call_turns() -> None:
    """The collatz scenario makes one ``calculate`` call a turn, forever: the run must be
    bounded by neither its steps nor its tool calls before ``BY_HAND`` turns (the default
    ``maxToolCalls`` of 50 ended it in two seconds, before a reader could cancel it)."""
    config = admitted(readme_runs()["long-collatz"])
    assert min(config.limits.max_steps, config.limits.max_tool_calls) >= BY_HAND
    assert config.deadline - time.time() >= 60  # its timeout: minutes, not the turns' time
