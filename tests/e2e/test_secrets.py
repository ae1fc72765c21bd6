"""A model API key appears nowhere but in its Secret and in the request to the provider.

Runs with a real-looking key (in a Secret an AgentModel references): one that completes with a
tool call, and one whose provider answers 401 echoing the key back ("Incorrect API key
provided: sk-…", as some providers do). Then every line the operator and the workers logged
(their exported spans included: the e2e stack exports spans to the logs), every Event in the
cluster, both runs' objects and every metric the operator and workers export are searched
for the key and for any 16-character piece of it: nothing is found.
"""

from __future__ import annotations

import json
import secrets
import urllib.request
from pathlib import Path

import pytest
import yaml

from .conftest import E2EStack, http_get, run_manifest

pytestmark = pytest.mark.e2e

PIECE = 16
"""Characters of any piece of the key that must not appear either (a truncated echo)."""


def scenarios(goal: str, key: str) -> str:
    return yaml.safe_dump(
        {
            "scenarios": [
                {
                    "name": f"secret-ok-{goal}",
                    "match": {"goal": f"E2E-SECRET-OK {goal}"},
                    "turns": [
                        {"tool_calls": [{"name": "calculate", "arguments": {"expression": "2+2"}}]},
                        {"content": "It is 4."},
                    ],
                },
                {
                    "name": f"secret-401-{goal}",
                    "match": {"goal": f"E2E-SECRET-401 {goal}"},
                    "turns": [
                        {
                            "fault": {
                                "status": 401,
                                "body": {
                                    "error": {
                                        "message": f"Incorrect API key provided: {key}.",
                                        "type": "invalid_request_error",
                                        "code": "invalid_api_key",
                                    }
                                },
                            }
                        }
                    ],
                },
            ]
        }
    )


def load_scenarios(stack_: E2EStack, text: str) -> None:
    base = stack_.mock_url.removesuffix("/v1")
    request = urllib.request.Request(
        f"{base}/_mock/scenarios?mode=append", data=text.encode(), method="POST"
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 200


def pieces(key: str) -> set[str]:
    return {key[i : i + PIECE] for i in range(len(key) - PIECE + 1)}


def leaks(where: str, text: str, key: str) -> list[str]:
    found = [piece for piece in pieces(key) if piece in text]
    return [f"{where}: {found[0]!r}"] if found else []


def test_a_model_api_key_appears_in_no_log_event_status_span_or_metric(
    stack_: E2EStack, test_namespace: str
) -> None:
    key = "sk-proj-" + secrets.token_urlsafe(36)
    stack_.kubectl(
        "create",
        "secret",
        "generic",
        "provider-key",
        "-n",
        test_namespace,
        f"--from-literal=apiKey={key}",
    )
    model_name = f"secret-{test_namespace}"
    model = {
        "apiVersion": "agentrun.dev/v1alpha1",
        "kind": "AgentModel",
        "metadata": {"name": model_name},
        "spec": {
            "baseURL": stack_.mock_url,
            "model": "scripted",
            "credentials": {"secretRef": {"name": "provider-key", "namespace": test_namespace}},
            "pricing": {"free": True},  # the default tenant has a cost budget
        },
    }
    stack_.kubectl("apply", "-f", "-", input=yaml.safe_dump(model))
    load_scenarios(stack_, scenarios(test_namespace, key))
    stack_.apply(
        test_namespace,
        run_manifest("keyed-ok", f"E2E-SECRET-OK {test_namespace}", model=model_name),
    )
    stack_.apply(
        test_namespace,
        run_manifest("keyed-401", f"E2E-SECRET-401 {test_namespace}", model=model_name),
    )
    done = stack_.wait_terminal(test_namespace, "keyed-ok")
    refused = stack_.wait_terminal(test_namespace, "keyed-401")
    assert done["terminalReason"] == "completed", done.get("message")
    assert (refused["terminalReason"], refused["outcome"]) == ("model_error", "none")
    assert "[redacted]" in refused["message"]
    sent = [r for r in stack_.mock_requests() if test_namespace in json.dumps(r["body"])]
    assert sent and {r["api_key"] for r in sent} == {key}  # the key did reach the provider

    found: list[str] = []
    logs = [stack_.launch.log_dir / f"{c.name}.log" for c in (stack_.operator, *stack_.workers)]
    for log in logs:
        text = Path(log).read_text(errors="replace")
        assert text, f"{log} is empty"
        found += leaks(log.name, text, key)
    assert any('"name": "chat scripted"' in Path(log).read_text() for log in logs[1:]), (
        "the workers exported no spans to scan"
    )
    events = stack_.kubectl("get", "events", "--all-namespaces", "-o", "json").stdout
    found += leaks("events", events, key)  # every Event of the cluster, whoever wrote it
    runs = stack_.kubectl("get", "agentruns", "-n", test_namespace, "-o", "json").stdout
    found += leaks("agentruns", runs, key)
    for component in (stack_.operator, *stack_.workers):
        exposition = http_get(f"http://127.0.0.1:{component.ports['metrics']}/metrics")
        found += leaks(f"{component.name} metrics", exposition, key)
    assert found == []
