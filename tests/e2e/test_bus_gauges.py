"""What the bus alerts read, from a real stack: the leading operator exports what agentrun's
streams store, its consumers' lag, the store's size and the oldest held call's time per tenant;
``agentrun nats status`` (in the operator's image, with its identity) prints the same for a
runbook, read-only."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from agentrun import protocol
from agentrun_dev import natsserver, stack

from .conftest import E2EStack, http_get, run_manifest
from .test_tenants import TenantFactory, tenants  # noqa: F401

pytestmark = pytest.mark.e2e


def scrape(stack_: E2EStack) -> dict[str, float]:
    """The operator's samples: series (name and labels as exposed) → value."""
    text = http_get(f"http://127.0.0.1:{stack_.operator.ports['metrics']}/metrics")
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            series, value = line.rsplit(" ", 1)
            samples[series] = float(value)
    return samples


def until_sampled(
    stack_: E2EStack, check: object, what: str, *, timeout: float = 30
) -> dict[str, float]:
    """Scrape until ``check(samples)`` holds (the operator refreshes its gauges every 5 s)."""
    end = time.monotonic() + timeout
    while True:
        samples = scrape(stack_)
        if check(samples):  # type: ignore[operator]
            return samples
        assert time.monotonic() < end, f"{what}: not in {timeout}s"
        time.sleep(0.5)


def test_the_operator_exports_the_streams_the_consumers_and_the_store(
    stack_: E2EStack, test_namespace: str
) -> None:
    stack_.apply(test_namespace, run_manifest("stored", "E2E-SHARED stored"))
    stack_.wait_terminal(test_namespace, "stored")
    events = f'agentrun_jetstream_stream_bytes{{stream="{protocol.STREAM_EVENTS}"}}'
    samples = until_sampled(stack_, lambda s: s.get(events, 0) > 0, "run events' bytes")
    streams = {
        protocol.STREAM_TURNS,
        protocol.STREAM_EVENTS,
        protocol.kv_stream(protocol.LEDGER_BUCKET),
        protocol.kv_stream(protocol.EFFECTS_BUCKET),
    }
    for stream in streams:
        assert f'agentrun_jetstream_stream_messages{{stream="{stream}"}}' in samples
    for consumer in (protocol.WORKERS_CONSUMER, protocol.OPERATOR_CONSUMER):
        assert f'agentrun_jetstream_consumer_pending{{consumer="{consumer}"}}' in samples
        assert f'agentrun_jetstream_consumer_ack_pending{{consumer="{consumer}"}}' in samples
    assert samples["agentrun_jetstream_store_limit_bytes"] == natsserver.STORE_BYTES
    assert samples["agentrun_crd_mismatch"] == 0


def test_a_held_call_shows_as_its_tenant_s_oldest_approval_until_decided(
    stack_: E2EStack,
    test_namespace: str,
    tenants: TenantFactory,  # noqa: F811
) -> None:
    tenant = tenants(f"t-{test_namespace}", [test_namespace], budget={"tokens": 100_000})
    series = f'agentrun_approval_oldest_request_timestamp_seconds{{tenant="{tenant}"}}'
    before = time.time()
    manifest = run_manifest("held", "E2E-APPROVAL gauge", approval={"tools": ["calculate"]})
    stack_.apply(test_namespace, manifest)
    stack_.wait_for(test_namespace, "held", lambda s: s.get("phase") == "AwaitingApproval")
    samples = until_sampled(stack_, lambda s: series in s, "the oldest approval")
    assert before - 1 <= samples[series] <= time.time()
    stack_.kubectl("annotate", "agentrun", "held", "-n", test_namespace, "agentrun.dev/cancel=true")
    stack_.wait_terminal(test_namespace, "held")
    until_sampled(stack_, lambda s: series not in s, "the series goes once nothing waits")


def test_nats_status_prints_the_streams_consumers_and_store_share(stack_: E2EStack) -> None:
    creds = Path(stack_.env[stack.CREDS_DIR_ENV]) / "operator.creds"
    result = subprocess.run(
        [str(Path(sys.executable).with_name("agentrun")), "nats", "status"],
        env={**stack_.env, "AGENTRUN_NATS_CREDS_FILE": str(creds)},
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["STREAM", "MESSAGES", "BYTES"]
    shown = {line.split()[0] for line in lines if line.strip()}
    assert {protocol.STREAM_TURNS, protocol.STREAM_EVENTS, protocol.OPERATOR_CONSUMER} <= shown
    assert protocol.WORKERS_CONSUMER in shown
    assert f"of {natsserver.STORE_BYTES})" in lines[-1]
