"""Chaos in the control plane: kube-apiserver is SIGKILLed mid-run and started again; the run
finishes and its status converges on what its events say, with nothing lost or committed
twice. (NATS restarts during ledger compare-and-sets and workers killed after the model
answered are in the ledger and delivery suites.)"""

from __future__ import annotations

from typing import Any

import pytest

from agentrun_dev import controlplane

from .conftest import E2EStack, Restarts, apiserver, run_manifest
from .events import read_events, turn_numbers

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        controlplane.existing_cluster_requested(), reason="restarts the local control plane"
    ),
]


def test_a_kube_apiserver_restart_mid_run_loses_nothing_and_the_status_converges(
    stack_: E2EStack, test_namespace: str, nats_server: Any, control_plane: Any, restarts: Restarts
) -> None:
    stack_.apply(test_namespace, run_manifest("through", "E2E-LONG job"))
    running = stack_.wait_for(
        test_namespace,
        "through",
        lambda s: (s.get("usage") or {}).get("steps", 0) >= 1,
        timeout=30,
    )
    assert not running.get("terminalReason")  # mid-run: four turns of about 1 s each to go
    restarts.kill_and_restart(apiserver(control_plane, restarts), down=3.0)
    status = stack_.wait_terminal(test_namespace, "through", timeout=90)
    assert (status["terminalReason"], status["answer"]) == ("completed", "Finished the long job.")
    events = read_events(nats_server, test_namespace, "through")
    assert turn_numbers(events) == [0, 1, 2, 3, 4]  # nothing lost, nothing committed twice
    assert status["usage"]["steps"] == 5
    assert status["observedGeneration"] == 1
