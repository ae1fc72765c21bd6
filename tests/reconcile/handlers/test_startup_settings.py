"""What the start-up sets in kopf: the initial list of every watched kind is read in pages
(``kubeapi.LIST_PAGE``), not in one response: with 50,000 AgentRuns one response held the
interpreter's lock past the Lease's renew deadline and the operator exited before it started
(``bench/bench_objects.py``); and an object's worker exits soon after its last event
(``startup.WORKER_IDLE``), letting go of the object it handled."""

from __future__ import annotations

from typing import Any

import kopf
import pytest

from agentrun.operator import wiring
from agentrun.operator.handlers import startup
from agentrun.operator.platform import kubeapi
from agentrun.settings import OperatorSettings


class NoTenants:
    async def list_objects(self, kind: Any) -> list[dict[str, Any]]:
        return []

    async def close(self) -> None:
        pass


async def test_kopf_lists_in_pages_and_lets_idle_workers_go(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def connect() -> NoTenants:
        return NoTenants()

    async def start_parts(*_: Any, **__: Any) -> object:
        return object()

    monkeypatch.setattr(startup.Kube, "connect", staticmethod(connect))
    monkeypatch.setattr(wiring, "start_parts", start_parts)
    settings = kopf.OperatorSettings()
    assert settings.watching.chunk_size is None  # kopf's default: everything at once
    assert settings.queueing.idle_timeout == 5.0  # kopf's default: the last 5 s of objects held
    await startup.start(settings=settings, memo=wiring.OperatorMemo(settings=OperatorSettings()))
    assert settings.watching.chunk_size == kubeapi.LIST_PAGE
    assert 100 <= kubeapi.LIST_PAGE <= 1000
    assert settings.queueing.idle_timeout == startup.WORKER_IDLE
    assert 0 < startup.WORKER_IDLE <= 1.0
    # kopf is not given the finalizer earlier operators added: it would take it off runs still
    # going, which an older shard owner adds again during a rolling upgrade (handlers.runs)
    assert settings.persistence.finalizer != startup.LEGACY_FINALIZER
