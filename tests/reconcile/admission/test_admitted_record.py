"""What admission leaves on the object for disaster recovery (``runs.recovery``): the admitted
run's uid in ``agentrun.dev/admitted-uid``, never on a newer object of the name; and an end
written for a run not admitted again carries the event sequence its status shows."""

from __future__ import annotations

import logging
import types
from typing import Any

import pytest
from kube_support import FakeKube

from agentrun import kernel
from agentrun.operator.admission.pump import QueuePump
from agentrun.operator.admission.queuestatus import QueueStatus
from agentrun.operator.runs.keys import ADMITTED_UID_ANNOTATION, RunKey

RUN = RunKey("ns", "r", "uid-r")


def pump(api: FakeKube) -> QueuePump:
    deps = types.SimpleNamespace(store=None, board=None, clock=lambda: 0.0, shown=None, api=api)
    return QueuePump(deps)  # type: ignore[arg-type]


async def test_an_admitted_run_records_its_uid() -> None:
    api = FakeKube()
    api.put("agentruns", {"metadata": {"name": "r", "namespace": "ns", "uid": RUN.uid}})
    await pump(api)._record_admitted(RUN)
    found = api.find("agentruns", "r", "ns")
    assert found is not None
    assert found["metadata"]["annotations"] == {ADMITTED_UID_ANNOTATION: RUN.uid}
    ((_, (_, body)),) = [c for c in api.calls if c[0] == "patch"]
    assert body["metadata"]["uid"] == RUN.uid  # the API server refuses it on another object


async def test_a_failed_record_is_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    api = FakeKube()
    api.fail("patch", 422, "metadata.uid: field is immutable")
    with caplog.at_level(logging.WARNING):
        await pump(api)._record_admitted(RUN)
    assert "could not record the admission of ns/r" in caplog.text


class Writer:
    def __init__(self) -> None:
        self.submitted: list[tuple[dict[str, Any], int, bool]] = []

    def submit(self, run: RunKey, body: Any, *, seq: int, terminal: bool, **_: Any) -> None:
        self.submitted.append((dict(body), seq, terminal))


def test_an_end_not_admitted_again_carries_the_sequence_its_status_shows() -> None:
    writer = Writer()
    shown = QueueStatus(writer, counter=None, events=None, clock=lambda: 0.0)  # type: ignore[arg-type]
    shown.end_unadmitted(
        RUN, kernel.Phase.CHECKPOINT_FAILED, "gone", tenant="t", generation=1, seq=7
    )
    shown.end_unadmitted(RUN, kernel.Phase.INVALID_SPEC, "bad", tenant="t", generation=1)
    (first, seq, terminal), (_, default_seq, _) = writer.submitted
    assert (first["terminalReason"], seq, terminal) == ("checkpoint_failed", 7, True)
    assert default_seq == 0
