"""The runs examples/README.md asks a reader to apply are valid and do what it says of them:
the walk it says to cancel lasts long enough to be cancelled by hand."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys
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


OWN_RUN = re.compile(r"## Your own run on the local stack\n.*?```sh\n(.*?)```", re.DOTALL)
MODEL_STARTED = re.compile(r"^http://127\.0\.0\.1:(\d+)/v1$", re.MULTILINE)


def own_model_start(folder: pathlib.Path) -> str:
    """The "your own run" block up to its ``kubectl apply``: the scenarios written, the
    scripted model started, waited for and its URL shown; its files in ``folder``, not /tmp."""
    block = OWN_RUN.search(README.read_text())
    assert block is not None
    start = block.group(1)[: block.group(1).index("kubectl apply")]
    start = start.replace('eval "$(.venv/bin/agentrun dev env)"\n', "")
    return start.replace("/tmp/", f"{folder}/")


def run_shell(script: str, folder: pathlib.Path) -> subprocess.CompletedProcess[str]:
    """``script`` in ``bash -e`` with this interpreter's ``python`` first on ``PATH``."""
    path = f"{pathlib.Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    return subprocess.run(
        ["bash", "-e", "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=folder,
        env={**os.environ, "PATH": path},
        check=False,
    )


def test_your_own_runs_model_takes_a_free_port_and_the_model_points_at_it(
    tmp_path: pathlib.Path,
) -> None:
    """A fixed port another process holds would have the run talk to that process."""
    block = OWN_RUN.search(README.read_text())
    assert block is not None and "baseURL: ${FENCE_URL}" in block.group(1)
    done = run_shell(own_model_start(tmp_path) + 'kill "$!"\n', tmp_path)
    assert done.returncode == 0, done.stderr
    (port,) = MODEL_STARTED.findall(done.stdout)
    assert int(port) > 0


def test_your_own_run_stops_when_its_model_does_not_start(tmp_path: pathlib.Path) -> None:
    script = own_model_start(tmp_path).replace("--scenarios ", "--scenarios missing-")
    done = run_shell(script + 'echo "went on"\n', tmp_path)
    assert done.returncode != 0
    assert "the scripted model did not start" in done.stderr
    assert "went on" not in done.stdout
