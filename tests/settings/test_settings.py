"""Process settings come from ``AGENTRUN_*`` variables, typed and checked once."""

from __future__ import annotations

import pydantic
import pytest

from agentrun import kernel
from agentrun.settings import TOOL_RESULT_MAX_BYTES_LIMIT, OperatorSettings, WorkerSettings


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


def test_the_tool_result_cap_is_bounded_by_what_one_turn_may_hold(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert TOOL_RESULT_MAX_BYTES_LIMIT == kernel.results_budget(kernel.MESSAGE_CAP) == 524_288
    monkeypatch.setenv("AGENTRUN_TOOL_RESULT_MAX_BYTES", str(TOOL_RESULT_MAX_BYTES_LIMIT))
    assert WorkerSettings().tool_result_max_bytes == TOOL_RESULT_MAX_BYTES_LIMIT
    monkeypatch.setenv("AGENTRUN_TOOL_RESULT_MAX_BYTES", str(TOOL_RESULT_MAX_BYTES_LIMIT + 1))
    with pytest.raises(pydantic.ValidationError) as raised:
        WorkerSettings()
    assert "AGENTRUN_TOOL_RESULT_MAX_BYTES=524289 is over its limit of 524288 bytes" in str(
        raised.value
    )


def test_nats_credentials_come_from_files_never_from_the_url(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AGENTRUN_NATS_CREDS_FILE", "/var/run/agentrun/nats/nats.creds")
    monkeypatch.setenv("AGENTRUN_NATS_CA_FILE", "/var/run/agentrun/nats-ca/ca.crt")
    auth = WorkerSettings().nats_auth
    assert (str(auth.creds_file), str(auth.ca_file)) == (
        "/var/run/agentrun/nats/nats.creds",
        "/var/run/agentrun/nats-ca/ca.crt",
    )
    monkeypatch.setenv("AGENTRUN_NATS_URL", "tls://agentrun:s3cret@nats.ops.svc:4222")
    with pytest.raises(pydantic.ValidationError, match="AGENTRUN_NATS_CREDS_FILE") as refused:
        WorkerSettings()
    assert "s3cret" not in str(refused.value)  # the refusal does not log the password


def test_a_worker_drains_for_its_grace_period_less_the_margin(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AGENTRUN_TERMINATION_GRACE", "90")
    monkeypatch.setenv("AGENTRUN_DRAIN_MARGIN", "15")
    assert WorkerSettings().drain_seconds == 75.0
    monkeypatch.delenv("AGENTRUN_TERMINATION_GRACE")
    monkeypatch.delenv("AGENTRUN_DRAIN_MARGIN")
    assert WorkerSettings().drain_seconds == 20.0  # Kubernetes' default 30 s less 10


def test_a_drain_margin_not_below_the_grace_period_is_refused_naming_both(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AGENTRUN_TERMINATION_GRACE", "10")
    monkeypatch.setenv("AGENTRUN_DRAIN_MARGIN", "10")
    with pytest.raises(pydantic.ValidationError) as refused:
        WorkerSettings()
    assert "AGENTRUN_DRAIN_MARGIN=10" in str(refused.value)
    assert "AGENTRUN_TERMINATION_GRACE=10" in str(refused.value)


def test_the_admission_bound_per_namespace_is_4_at_least_1_and_read_from_its_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from agentrun.operator.admission import fairgate

    monkeypatch.delenv("AGENTRUN_ADMISSION_PER_NAMESPACE", raising=False)
    assert OperatorSettings().admission_per_namespace == fairgate.LIMIT == 4
    monkeypatch.setenv("AGENTRUN_ADMISSION_PER_NAMESPACE", "16")
    assert OperatorSettings().admission_per_namespace == 16
    monkeypatch.setenv("AGENTRUN_ADMISSION_PER_NAMESPACE", "0")
    with pytest.raises(pydantic.ValidationError, match="admission_per_namespace"):
        OperatorSettings()


def test_the_platforms_turn_cap_is_off_unless_set_and_never_negative(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("AGENTRUN_DEFAULT_MAX_CONCURRENT_TURNS", raising=False)
    assert OperatorSettings().default_max_concurrent_turns == 0
    monkeypatch.setenv("AGENTRUN_DEFAULT_MAX_CONCURRENT_TURNS", "96")
    assert OperatorSettings().default_max_concurrent_turns == 96
    monkeypatch.setenv("AGENTRUN_DEFAULT_MAX_CONCURRENT_TURNS", "-1")
    with pytest.raises(pydantic.ValidationError, match="default_max_concurrent_turns"):
        OperatorSettings()


def test_the_operator_provisions_one_replica_unless_told_and_at_most_five(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("AGENTRUN_NATS_REPLICAS", raising=False)
    assert OperatorSettings().nats_replicas == 1
    monkeypatch.setenv("AGENTRUN_NATS_REPLICAS", "3")
    assert OperatorSettings().nats_replicas == 3
    for refused in ("0", "6"):
        monkeypatch.setenv("AGENTRUN_NATS_REPLICAS", refused)
        with pytest.raises(pydantic.ValidationError, match="nats_replicas"):
            OperatorSettings()


def test_the_operator_makes_one_value_ledgers_unless_told_split(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("AGENTRUN_LEDGER_LAYOUT", raising=False)
    assert OperatorSettings().ledger_layout == "single"  # what workers N-1 read
    monkeypatch.setenv("AGENTRUN_LEDGER_LAYOUT", "split")
    assert OperatorSettings().ledger_layout == "split"
    monkeypatch.setenv("AGENTRUN_LEDGER_LAYOUT", "sharded")
    with pytest.raises(pydantic.ValidationError, match="ledger_layout"):
        OperatorSettings()
