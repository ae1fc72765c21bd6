"""``kubectl agentrun``: the plugin found by kubectl on PATH, used as a person would."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from agentrun import kernel
from agentrun.cli import kubectl
from agentrun_dev import stack

from . import test_tenants
from .conftest import E2EStack, run_manifest
from .events import read_events
from .test_agents import agent_manifest, agent_run
from .test_tenants import TenantFactory, append_scenario

pytestmark = pytest.mark.e2e

tenants = test_tenants.tenants
"""The AgentTenant fixture: ``tenants(name, namespaces, **spec)``."""

BIN = Path(sys.executable).parent


def plugin_env(stack_: E2EStack) -> dict[str, str]:
    """kubectl's environment with the plugin on PATH and the run events' NATS server, its CA
    and the dev stack's admin credentials (what ``agentrun dev env`` exports)."""
    creds = Path(stack_.env[stack.CREDS_DIR_ENV]) / "admin.creds"
    return {
        **stack_.kubectl.env,
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "AGENTRUN_NATS_URL": stack_.env["AGENTRUN_NATS_URL"],
        "AGENTRUN_NATS_CA_FILE": stack_.env["AGENTRUN_NATS_CA_FILE"],
        "AGENTRUN_NATS_CREDS_FILE": str(creds),
    }


def plugin(stack_: E2EStack, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``kubectl agentrun ARGS`` through the real kubectl."""
    return subprocess.run(
        [str(stack_.kubectl.binary), "agentrun", *args],
        env=plugin_env(stack_),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_kubectl_finds_the_plugin(stack_: E2EStack) -> None:
    listed = subprocess.run(
        [str(stack_.kubectl.binary), "plugin", "list", "--name-only"],
        env=plugin_env(stack_),
        capture_output=True,
        text=True,
        check=False,
    )
    assert "kubectl-agentrun" in listed.stdout.split(), listed.stderr
    result = plugin(stack_, "--help")
    assert result.returncode == 0 and "logs" in result.stdout and "rerun" in result.stdout


def test_get_shows_tenant_queue_position_and_cost(
    stack_: E2EStack, test_namespace: str, tenants: TenantFactory
) -> None:
    tenant = tenants(f"kp-{test_namespace}", [test_namespace], maxConcurrentRuns=1)
    holder = run_manifest("first", "E2E-APPROVAL first", approval={"tools": ["calculate"]})
    stack_.apply(test_namespace, holder)  # waits for a person: holds the tenant's one slot
    stack_.wait_for(test_namespace, "first", lambda s: s.get("phase") == "AwaitingApproval")
    stack_.apply(test_namespace, run_manifest("second", "E2E-LONG second"))
    stack_.wait_for(test_namespace, "second", lambda s: s.get("phase") == "Queued")
    result = plugin(stack_, "get", "-n", test_namespace)
    assert result.returncode == 0, result.stderr
    header, *rows = result.stdout.splitlines()
    assert header.split() == [
        "NAME", "TENANT", "PHASE", "REASON", "QUEUE", "STEPS", "TOKENS", "COST", "AGE"
    ]  # fmt: skip
    cells = {row.split()[0]: row.split() for row in rows}
    assert cells["first"][1:5] == [tenant, "AwaitingApproval", "-", "-"]
    assert cells["second"][1:5] == [tenant, "Queued", "-", "1"]
    assert plugin(stack_, "cancel", "first", "-n", test_namespace).returncode == 0
    stack_.wait_terminal(test_namespace, "second", timeout=60)
    done = plugin(stack_, "get", "second", "-n", test_namespace).stdout.splitlines()[1].split()
    status = stack_.get(test_namespace, "second")["status"]  # type: ignore[index]
    assert done[2:4] == ["Succeeded", "completed"]
    assert done[5:8] == [
        str(status["usage"]["steps"]),
        str(status["usage"]["totalTokens"]),
        kubectl.money(status["usage"]["costUSD"]),  # its formatting: tests/plugin
    ]
    listed = json.loads(plugin(stack_, "get", "-n", test_namespace, "-o", "json").stdout)
    assert sorted(i["metadata"]["name"] for i in listed["items"]) == ["first", "second"]
    everywhere = plugin(stack_, "get", "-A").stdout.splitlines()
    assert everywhere[0].split()[0] == "NAMESPACE"
    assert any(line.split()[:2] == [test_namespace, "second"] for line in everywhere)


def test_logs_follow_prints_each_turn_as_it_commits_and_exits_at_the_end(
    stack_: E2EStack, test_namespace: str, nats_server: Any
) -> None:
    slow_turn = {
        "tool_calls": [{"name": "sleep", "arguments": {"seconds": 1.0}}],
        "latency_ms": 1000,
        "usage": {"prompt_tokens": 40, "completion_tokens": 10},
    }
    append_scenario(
        stack_,
        {
            "name": "plugin-live",
            "match": {"goal": "E2E-PLUGIN-LIVE"},
            "turns": [
                *[slow_turn] * 8,
                {"content": "Finished the long job.", "usage": slow_turn["usage"]},
            ],
        },
    )
    stack_.apply(test_namespace, run_manifest("live", "E2E-PLUGIN-LIVE"))
    follower = subprocess.Popen(
        [str(stack_.kubectl.binary), "agentrun", "logs", "live", "-f", "-n", test_namespace],
        env=plugin_env(stack_),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    arrivals: list[tuple[float, str]] = []
    ended_at: list[float] = []

    def read() -> None:
        assert follower.stdout is not None
        for line in follower.stdout:
            arrivals.append((time.time(), line.rstrip("\n")))

    def watch() -> None:  # when the run's end first shows in its status (never early)
        while not ended_at:
            if ((stack_.get(test_namespace, "live") or {}).get("status") or {}).get(
                "terminalReason"
            ):
                ended_at.append(time.time())
            time.sleep(0.1)

    threads = [threading.Thread(target=f, daemon=True) for f in (read, watch)]
    for thread in threads:
        thread.start()
    assert follower.wait(timeout=60) == 0, follower.stderr.read() if follower.stderr else ""
    for thread in threads:
        thread.join(timeout=10)
    lines = [line for _, line in arrivals]
    turns = [i for i, line in enumerate(lines) if line[9:].startswith("turn ")]
    assert len(turns) == 9, "\n".join(lines)
    # once the plugin is up (a few seconds on a busy machine), each turn shows as it commits:
    # each of the last tool turns arrives before the turn after the next one's event was made
    # (two model calls and sleeps later: a follower that printed only at the end, or in a
    # batch, fails it), and before the end shows in the run's status. (Before the next turn's
    # event, asked before, failed when a loaded machine held one line back 2 s; a gap of over
    # 1 s between two arrivals, asked before that, the same.)
    made = [e.time for e in read_events(nats_server, test_namespace, "live") if e.kind == "turn"]
    shown = "\n".join(f"{at - ended_at[0]:+.2f} {line}" for at, line in arrivals)
    late = [arrivals[i][0] for i in turns[4:7]]
    assert all(at < made[k + 2] for k, at in enumerate(late, start=4)), (
        [round(at - made[k], 2) for k, at in enumerate(late, start=4)],
        shown,
    )
    assert arrivals[turns[7]][0] < ended_at[0], shown
    assert "admitted in tenant" in lines[0] and "goal: E2E-PLUGIN-LIVE" in "\n".join(lines)
    assert any('→ sleep({"seconds":1.0})' in line for line in lines)
    assert any("← sleep" in line for line in lines)
    assert any(line.strip().startswith("usage 40 in + 10 out tokens") for line in lines)
    assert lines[-1][9:].startswith("end   Succeeded completed (ok): 9 steps, 8 tool calls")
    assert lines[-1].endswith("answer: Finished the long job.")


def test_logs_of_a_finished_run_print_all_and_exit_and_a_missing_run_is_one_line(
    stack_: E2EStack, test_namespace: str
) -> None:
    long_expression = "+".join(["1"] * 60)  # 119 characters: valid, shown cut
    append_scenario(
        stack_,
        {
            "name": "plugin-logs",
            "match": {"goal": "E2E-PLUGIN-LOGS"},
            "turns": [
                {
                    "tool_calls": [
                        {"name": "calculate", "arguments": {"expression": long_expression}}
                    ]
                },
                {"tool_calls": [{"name": "no_such_tool", "arguments": {}}]},
                {"content": "60. " + "x" * 400},
            ],
        },
    )
    stack_.apply(test_namespace, run_manifest("done", "E2E-PLUGIN-LOGS"))
    stack_.wait_terminal(test_namespace, "done")
    for follow in ([], ["-f"]):
        started = time.monotonic()
        result = plugin(stack_, "logs", "done", "-n", test_namespace, *follow, timeout=30)
        assert result.returncode == 0, result.stderr
        assert time.monotonic() - started < 15
        out = result.stdout
        assert '→ calculate({"expression":"1+1+1' in out and "… (136 chars)" in out, out
        assert "← calculate" in out and ": 60" in out
        assert "✗ no_such_tool" in out  # a rejected call: a correction for the model
        assert out.rstrip().splitlines()[-1][9:].startswith("end   Succeeded completed (ok)")
    as_json = plugin(stack_, "logs", "done", "-n", test_namespace, "-o", "json").stdout
    kinds = [json.loads(line)["kind"] for line in as_json.splitlines()]
    assert kinds == ["admitted", "turn", "turn", "turn"]
    missing = plugin(stack_, "logs", "nope", "-f", "-n", test_namespace)
    assert missing.returncode == 1 and missing.stdout == ""
    assert missing.stderr.strip().count("\n") == 0
    assert 'agentruns.agentrun.dev "nope" not found' in missing.stderr


def test_describe_approve_cancel_and_rerun(stack_: E2EStack, test_namespace: str) -> None:
    append_scenario(
        stack_,
        {
            "name": "plugin-agent",
            "match": {"goal": "E2E-PLUGIN-AGENT"},
            "turns": [
                {
                    "tool_calls": [
                        {"id": "c1", "name": "calculate", "arguments": {"expression": "6*7"}}
                    ]
                },
                {"content": "Approved and computed: 42."},
            ],
        },
    )
    stack_.apply(test_namespace, agent_manifest("calc", approval={"tools": ["calculate"]}))
    stack_.apply(
        test_namespace, agent_run("held", "E2E-PLUGIN-AGENT", "calc", parameters={"team": "qa"})
    )
    stack_.wait_for(test_namespace, "held", lambda s: s.get("phase") == "AwaitingApproval")
    described = described_once(
        stack_, test_namespace, "held", lambda r: "ApprovalRequested" in r.stdout
    )
    text = described.stdout
    assert "Phase:         AwaitingApproval" in text
    assert "Agent:         calc (generation 1, sha256:" in text and "  team: qa" in text
    assert "Pending:       call 1 of 1 held for approval, decided in turn" in text
    assert "  → 1. calculate call c1: pending" in text
    digest = kernel.digest_of("calculate", {"expression": "6*7"})
    assert f"       digest {digest}" in text
    assert '           "expression": "6*7"' in text  # in full, indented
    assert "Approval:      calculate" in text
    assert "ApprovalRequested" in text  # its Kubernetes Events (waited for above)
    approved = plugin(stack_, "approve", "held", "--digest", digest, "-n", test_namespace)
    assert approved.returncode == 0, approved.stderr
    assert stack_.wait_terminal(test_namespace, "held")["terminalReason"] == "completed"

    rerun = plugin(stack_, "rerun", "held", "-n", test_namespace)
    assert rerun.returncode == 0, rerun.stderr
    new_name = rerun.stdout.split("/")[1].split()[0]
    assert new_name.startswith("held-")
    again = stack_.get(test_namespace, new_name)
    assert again is not None
    assert again["metadata"]["labels"]["agentrun.dev/rerun-of"] == "held"
    assert again["spec"]["agentRef"] == {"name": "calc", "parameters": {"team": "qa"}}
    stack_.wait_for(test_namespace, new_name, lambda s: s.get("phase") == "AwaitingApproval")
    cancelled = plugin(stack_, "cancel", new_name, "-n", test_namespace)
    assert cancelled.returncode == 0, cancelled.stderr
    assert stack_.wait_terminal(test_namespace, new_name)["terminalReason"] == "cancelled"

    def cancelled_event(result: subprocess.CompletedProcess[str]) -> bool:
        return "Cancelled" in [e["reason"] for e in json.loads(result.stdout)["events"]]

    described = described_once(stack_, test_namespace, new_name, cancelled_event, "-o", "json")
    as_json = json.loads(described.stdout)
    assert as_json["object"]["status"]["terminalReason"] == "cancelled"
    assert "Cancelled" in [e["reason"] for e in as_json["events"]]


def described_once(
    stack_: E2EStack,
    namespace: str,
    name: str,
    shows: Callable[[subprocess.CompletedProcess[str]], bool],
    *args: str,
    timeout: float = 30,
) -> subprocess.CompletedProcess[str]:
    """``kubectl agentrun describe NAME ARGS`` once its output ``shows`` what is wanted. The
    operator posts its Events from a queue after the status they speak of (a run's end only
    once its status is written), so a describe right after a status change may not list the
    Event yet. Raises AssertionError after ``timeout`` seconds."""
    end = time.monotonic() + timeout
    while True:
        result = plugin(stack_, "describe", name, "-n", namespace, *args)
        assert result.returncode == 0, result.stderr
        if shows(result):
            return result
        assert time.monotonic() < end, f"describe never showed it:\n{result.stdout}"
        time.sleep(0.5)
