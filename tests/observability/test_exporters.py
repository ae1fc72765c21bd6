"""Who exports what: a process that is down must not look healthy.

Every process imports `agentrun.metrics`, so a gauge registered at import would be exported at 0
by all of them: a worker or a standby operator would report an empty queue while the leader is
dead. Here fresh processes show that the queue gauge comes from the leader only, that every
operator (and only operators) reports whether it leads, and that failed model calls are counted
by AgentModel and error type next to all calls.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from agentrun import metrics

SEPARATOR = "--- next ---"

ROLES = textwrap.dedent(
    f"""
    import sys
    from prometheus_client import generate_latest
    from agentrun import metrics
    from agentrun.worker import consumer  # everything a worker imports

    sys.stdout.write(generate_latest().decode() + {SEPARATOR!r} + "\\n")  # a worker
    metrics.export_operator()  # an operator at start-up, standing by
    sys.stdout.write(generate_latest().decode() + {SEPARATOR!r} + "\\n")
    metrics.lead()  # the operator took the Lease
    metrics.TURNS_PENDING.set(7)
    sys.stdout.write(generate_latest().decode())
    """
)


def samples(exposition: str) -> dict[str, float]:
    """Unlabelled samples by name (labelled ones are left out)."""
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(exposition)
        for sample in family.samples
        if not sample.labels
    }


@pytest.fixture(scope="module")
def expositions() -> list[dict[str, float]]:
    """What a worker, a standby operator and a leading operator export (fresh processes)."""
    done = subprocess.run(
        [sys.executable, "-c", ROLES], capture_output=True, text=True, timeout=120, check=True
    )
    return [samples(part) for part in done.stdout.split(SEPARATOR + "\n")]


def test_a_worker_exports_no_operator_gauges(expositions: list[dict[str, float]]) -> None:
    worker, _, _ = expositions
    assert "agentrun_turns_pending" not in worker
    assert "agentrun_operator_leader" not in worker
    assert "agentrun_worker_concurrency" in worker  # its own gauges it does export


def test_a_standby_operator_says_so_and_exports_no_queue(
    expositions: list[dict[str, float]],
) -> None:
    _, standby, _ = expositions
    assert standby["agentrun_operator_leader"] == 0
    assert "agentrun_turns_pending" not in standby


def test_the_leader_exports_the_queue(expositions: list[dict[str, float]]) -> None:
    _, _, leader = expositions
    assert leader["agentrun_operator_leader"] == 1
    assert leader["agentrun_turns_pending"] == 7


def test_model_calls_and_their_failures_are_counted_by_model_and_error_type() -> None:
    def value(name: str, **labels: str) -> float:
        found = REGISTRY.get_sample_value(name, {"tenant": "calls", "model": "m", **labels})
        return found or 0.0

    metrics.count_model_call("calls", model="m", error_type=None)
    metrics.count_model_call("calls", model="m", error_type=metrics.ModelErrorType.RATE_LIMITED)
    assert value("agentrun_model_calls_total") == 2
    assert value("agentrun_model_call_errors_total", error_type="rate_limited") == 1
    assert value("agentrun_model_call_errors_total", error_type="server_error") == 0
