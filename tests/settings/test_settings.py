"""Process settings come from ``AGENTRUN_*`` variables, typed and checked once."""

from __future__ import annotations

import pydantic
import pytest

from agentrun.settings import OperatorSettings, WorkerSettings


def test_defaults_apply_when_variables_are_unset_or_empty(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTRUN_TOOL_TIMEOUT", "")
    monkeypatch.delenv("AGENTRUN_WORKER_CONCURRENCY", raising=False)
    worker = WorkerSettings()
    assert worker.tool_timeout == 60.0
    assert worker.worker_concurrency == 64


def test_variables_are_parsed_into_their_fields(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTRUN_LEDGER_SWEEP", "0.5")
    monkeypatch.setenv("AGENTRUN_DEFAULT_TENANT", "default")
    monkeypatch.setenv("AGENTRUN_TURN_ACK_WAIT", "4")
    operator = OperatorSettings()
    assert (operator.ledger_sweep, operator.default_tenant, operator.turn_ack_wait) == (
        0.5,
        "default",
        4.0,
    )


@pytest.mark.parametrize(
    ("variable", "value"),
    [("AGENTRUN_TOOL_TIMEOUT", "ten"), ("AGENTRUN_WORKER_CONCURRENCY", "0")],
    ids=["not-a-number", "below-range"],
)
def test_a_malformed_variable_is_rejected_naming_its_field(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(pydantic.ValidationError, match=variable.removeprefix("AGENTRUN_").lower()):
        WorkerSettings()
