"""Hostile neighbours driven as users would (kubectl, the scripted model, a real MCP server from
the official SDK): a catastrophic regular expression in one tenant's ``spec.output.schema`` or
in a tool server's ``inputSchema`` freezes no worker; an oversized schema or template stops only
its own object, with the operator's memory bounded; the tenant's next run goes on.

The timings of the other tenant's run, with and without the hostile one, are printed (``-s``
or ``-rP`` shows them)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import mcp_support
import pytest
import yaml

from .conftest import E2EStack, run_manifest
from .test_agents import agent_manifest, agent_run
from .test_fairness import arrivals, lone_worker, quick_scenario, wait_until
from .test_mcp_tools import tool_server, wait_server
from .test_tenants import TenantFactory, append_scenario, more_namespaces, tenants  # noqa: F401

pytestmark = pytest.mark.e2e

HOSTILE_PATTERN = mcp_support.HOSTILE_PATTERN
HOSTILE_TEXT = mcp_support.HOSTILE_TEXT
"""41 characters that ``^(a+)+$`` does not match: on Python's backtracking ``re`` 30 of them
took 22 s (issue 21) and each one more doubles it, so 41 take hours."""
NEIGHBOUR_BOUND = 15.0
"""Seconds the other tenant's one-turn run may take from ``kubectl apply`` to its terminal
status while the hostile run is checked: under the 22 s that even 30 characters cost on
``re``, and a ten-thousandth of what 41 cost; an idle stack takes about a second."""
LOOPBACK = {
    "toolServers": {
        "allow": [{"host": "127.0.0.1", "privateNetwork": True}],
    }
}
"""An AgentTenant's policy for the test's MCP server on loopback."""


def timed_run(stack_: E2EStack, namespace: str, name: str, goal: str) -> tuple[float, Any]:
    """Apply a one-turn run and wait for its end: (seconds from ``kubectl apply`` returned to
    its terminal status seen, the status)."""
    stack_.apply(namespace, run_manifest(name, goal, tools=[]))
    started = time.monotonic()
    status = stack_.wait_terminal(namespace, name, timeout=60)
    return time.monotonic() - started, status


def report(what: str, alone: float, beside: float) -> None:
    print(f"\n{what}: the other tenant's run took {alone:.2f}s alone, {beside:.2f}s beside it")


@pytest.fixture
def pair(
    stack_: E2EStack,
    tenants: TenantFactory,  # noqa: F811
    more_namespaces: Callable[[], str],  # noqa: F811
) -> Iterator[tuple[str, str]]:
    """Two namespaces of two tenants (the first may reach the test's MCP server), run on one
    worker (4 slots) so that a frozen worker would hold up both."""
    hostile, other = more_namespaces(), more_namespaces()
    tenants(f"a-{hostile}", [hostile], **LOOPBACK)
    tenants(f"b-{other}", [other])
    append_scenario(stack_, quick_scenario(other))
    with lone_worker(stack_, slots=4):
        yield hostile, other


# --- a catastrophic pattern freezes no worker ----------------------------------------------------


def test_a_catastrophic_output_schema_pattern_holds_up_no_other_tenants_run(
    stack_: E2EStack, pair: tuple[str, str]
) -> None:
    """Tenant A's ``spec.output.schema`` asks for ``^(a+)+$`` and the model answers 40 ``a``
    and ``!``, twice (the correction too): A's run ends ``invalid_output`` quoting the pattern,
    while tenant B's run, applied as A's answer is checked, takes about what it takes alone."""
    hostile, other = pair
    answer = {"content": json.dumps(HOSTILE_TEXT), "usage": {"prompt_tokens": 9}}
    append_scenario(
        stack_,
        {
            "name": "hostile-output",
            "match": {"goal": f"E2E-HOSTILE-OUT {hostile}"},
            "turns": [answer, answer],
        },
    )
    alone, _ = timed_run(stack_, other, "alone", f"E2E-FAIR-QUICK {other} alone")
    schema = {"type": "string", "pattern": HOSTILE_PATTERN}
    stack_.apply(
        hostile,
        run_manifest("redos", f"E2E-HOSTILE-OUT {hostile}", tools=[], output={"schema": schema}),
    )
    wait_until(lambda: bool(arrivals(stack_, hostile)), "A's first answer", timeout=30)
    beside, status = timed_run(stack_, other, "beside", f"E2E-FAIR-QUICK {other} beside")
    report("output schema ^(a+)+$", alone, beside)
    assert (status["terminalReason"], status["answer"]) == ("completed", "quick done")
    assert beside < NEIGHBOUR_BOUND, f"B took {beside:.1f}s beside A ({alone:.1f}s alone)"
    ended = stack_.wait_terminal(hostile, "redos", timeout=30)
    assert (ended["phase"], ended["terminalReason"], ended["outcome"]) == (
        "Failed",
        "invalid_output",
        "partial",
    )
    assert ended["message"] == (
        "the final answer does not meet spec.output.schema: "
        f"(root): {HOSTILE_TEXT!r} does not match {HOSTILE_PATTERN!r}"
    )
    assert (ended["usage"]["steps"], ended["usage"]["corrections"]) == (2, 2)


def test_a_catastrophic_mcp_input_schema_pattern_holds_up_no_other_tenants_run(
    stack_: E2EStack, pair: tuple[str, str], tmp_path: Path
) -> None:
    """A real MCP server lists ``guarded`` with an inputSchema whose ``code`` must match
    ``^(a+)+$``; tenant A's model calls it with 40 ``a`` and ``!``. The call is refused
    before it reaches the server and sent back to the model as a correction (the schema
    error), A's run completes, and tenant B's run applied meanwhile is not held up."""
    hostile, other = pair
    append_scenario(
        stack_,
        {
            "name": "hostile-input",
            "match": {"goal": f"E2E-HOSTILE-IN {hostile}"},
            "turns": [
                {
                    "tool_calls": [
                        {"id": "g1", "name": "evil__guarded", "arguments": {"code": HOSTILE_TEXT}}
                    ]
                },
                {"content": "gave up on the code"},
            ],
        },
    )
    with mcp_support.running(tmp_path) as server:
        stack_.apply(hostile, tool_server("evil", server.url, {"name": "guarded"}))
        listed = wait_server(stack_, hostile, "evil", "Discovered")["tools"][0]
        assert listed["inputSchema"]["properties"]["code"]["pattern"] == HOSTILE_PATTERN
        alone, _ = timed_run(stack_, other, "alone", f"E2E-FAIR-QUICK {other} alone")
        goal = f"E2E-HOSTILE-IN {hostile}"
        stack_.apply(hostile, run_manifest("redos", goal, tools=["evil/guarded"]))
        wait_until(lambda: bool(arrivals(stack_, hostile)), "A's tool call", timeout=30)
        beside, status = timed_run(stack_, other, "beside", f"E2E-FAIR-QUICK {other} beside")
        report("MCP inputSchema ^(a+)+$", alone, beside)
        assert (status["terminalReason"], status["answer"]) == ("completed", "quick done")
        assert beside < NEIGHBOUR_BOUND, f"B took {beside:.1f}s beside A ({alone:.1f}s alone)"
        ended = stack_.wait_terminal(hostile, "redos", timeout=30)
        called = [r for r in server.requests() if r.get("method") == "tools/call"]
    assert (ended["terminalReason"], ended["answer"]) == ("completed", "gave up on the code")
    # a refused call is a failure the model caused, not a call made
    assert (ended["usage"]["toolCalls"], ended["usage"]["toolFailures"]) == (0, 1)
    assert not called, called  # refused before the server: nothing ran
    second = [r for r in stack_.mock_requests() if goal in json.dumps(r["body"])][-1]
    (result,) = [m["content"] for m in second["body"]["messages"] if m["role"] == "tool"]
    assert result.startswith(
        "ERROR: arguments do not match the schema: "
        f"code: {HOSTILE_TEXT!r} does not match {HOSTILE_PATTERN!r}. The tool's schema: "
    ), result


# --- an oversized object stops only itself ------------------------------------------------------


def schema_of(size: int) -> dict[str, Any]:
    """A JSON Schema of about ``size`` bytes made of small properties (no string is large)."""
    count = size // 70
    props = {f"field_{i:06d}": {"type": "string", "description": "d" * 40} for i in range(count)}
    return {"type": "object", "properties": props}


def test_an_oversized_output_schema_is_refused_or_ends_invalid_spec_and_the_tenant_goes_on(
    stack_: E2EStack,
    test_namespace: str,
    tenants: TenantFactory,  # noqa: F811
) -> None:
    """A 1.2 MB ``spec.output.schema`` of small properties is refused by ``kubectl apply``
    (with its copy in the last-applied annotation the request is over the API server's
    3 MiB) and by ``kubectl apply --server-side`` (with ``managedFields`` naming each of its
    fields, the object is over the 2 MiB the API server sends to etcd); neither message
    names the field, which the API server cannot measure (CEL does not see the unknown
    fields a free-form schema holds). A 200 KB one is stored, and the run ends
    ``invalid_spec`` naming the field and the operator's 64 KiB bound; the tenant's next
    run, queued behind it with ``maxConcurrentRuns: 1``, is admitted and completes. (A
    1.2 MB schema in one long string is stored and ends the same way:
    ``test_fairness.test_a_run_too_large_to_checkpoint_ends_invalid_spec_...``.)"""
    ns = test_namespace
    tenants(f"t-{ns}", [ns], maxConcurrentRuns=1)
    append_scenario(stack_, quick_scenario(ns))
    huge = run_manifest("huge", "a large answer", tools=[], output={"schema": schema_of(1_200_000)})
    assert len(json.dumps(huge["spec"]["output"]["schema"])) > 1_200_000
    body = yaml.safe_dump(huge)
    refused = stack_.kubectl("apply", "-n", ns, "-f", "-", input=body, check=False)
    assert "Request entity too large: limit is 3145728" in refused.stderr, refused.stderr
    refused = stack_.kubectl(
        "apply", "--server-side", "-n", ns, "-f", "-", input=body, check=False, timeout=120
    )
    assert "trying to send message larger than max" in refused.stderr, refused.stderr
    assert refused.returncode != 0 and stack_.get(ns, "huge") is None
    big = run_manifest("big", "a large answer", tools=[], output={"schema": schema_of(200_000)})
    size = len(json.dumps(big["spec"]["output"]["schema"], separators=(",", ":")))
    stack_.kubectl("apply", "--server-side", "-n", ns, "-f", "-", input=yaml.safe_dump(big))
    stack_.apply(ns, run_manifest("next", f"E2E-FAIR-QUICK {ns}"))
    status = stack_.wait_terminal(ns, "big", timeout=30)
    assert (status["terminalReason"], status["outcome"]) == ("invalid_spec", "none")
    assert status["message"] == (
        f"spec.output.schema: {size} bytes as JSON, over the 65536-byte limit"
    ), status["message"]
    after = stack_.wait_terminal(ns, "next", timeout=30)
    assert (after["terminalReason"], after["answer"]) == ("completed", "quick done")


def rss_mb(pid: int) -> float:
    """The resident set of process ``pid`` in MB (``VmRSS`` of ``/proc/<pid>/status``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


RSS_GROWTH_MB = 100.0
"""How much the operator's resident memory may grow while it resolves the 131 KB template:
unbounded it expanded to about 250 MB of text per field (issue 21: 110 MB → 2.9 GB)."""


def test_a_131_kb_template_ends_invalid_spec_within_bounded_operator_memory(
    stack_: E2EStack,
    test_namespace: str,
    tenants: TenantFactory,  # noqa: F811
) -> None:
    """An Agent whose 64 KiB of instructions are ``{{ params.blob }}`` 3,855 times, and a run
    of it passing a 64 KiB ``blob`` (131 KB in all, the issue's case): in full that is 250 MB
    of instructions. The run ends ``invalid_spec`` naming the Agent's field; the operator's
    RSS grows by less than ``RSS_GROWTH_MB``; the tenant's next run (``maxConcurrentRuns:
    1``) completes."""
    ns = test_namespace
    tenants(f"t-{ns}", [ns], maxConcurrentRuns=1)
    append_scenario(stack_, quick_scenario(ns))
    placeholder = "{{ params.blob }}"
    instructions = placeholder * (65_536 // len(placeholder))
    agent = agent_manifest(
        "tpl", instructions=instructions, parameters=[{"name": "blob", "required": True}]
    )
    stack_.apply(ns, agent)
    pid = stack_.operator.record.pid
    before = peak = rss_mb(pid)
    stack_.apply(ns, agent_run("big", "summarise", "tpl", parameters={"blob": "y" * 65_536}))
    stack_.apply(ns, run_manifest("next", f"E2E-FAIR-QUICK {ns}"))
    end = time.monotonic() + 30
    status: dict[str, Any] = {}
    while not status.get("terminalReason"):
        assert time.monotonic() < end, f"the run did not end: {status}"
        peak = max(peak, rss_mb(pid))
        status = ((stack_.get(ns, "big") or {}).get("status")) or {}
        time.sleep(0.1)
    peak = max(peak, rss_mb(pid))
    print(f"\noperator RSS {before:.0f} MB before, {peak:.0f} MB at most while resolving")
    assert (status["terminalReason"], status["outcome"]) == ("invalid_spec", "none")
    assert status["message"].startswith(
        "Agent 'tpl' spec.instructions: with its parameters substituted it is longer than "
        "65536 characters"
    ), status["message"]
    assert peak - before < RSS_GROWTH_MB, f"{before:.0f} MB → {peak:.0f} MB"
    after = stack_.wait_terminal(ns, "next", timeout=30)
    assert (after["terminalReason"], after["answer"]) == ("completed", "quick done")
