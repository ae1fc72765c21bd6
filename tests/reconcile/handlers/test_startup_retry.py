"""A failed start-up (and a failed resource handler) is tried again within seconds, not after
kopf's default minute: run through kopf's own activity runner with the operator's registered
start-up handler, whose first try fails as provisioning did on a freshly formed three-server
NATS cluster (a stream update timing out while its Raft group elected a leader) — two
sharded operators then served nothing for 60 s."""

from __future__ import annotations

import time
from typing import Any

import kopf
import nats.errors
import pytest
from kopf._core.engines.activities import run_activity
from kopf._core.engines.indexing import OperatorIndexers
from kopf._core.intents import causes, registries

from agentrun.operator import (
    main,  # noqa: F401  (registers the handlers)
    wiring,
)
from agentrun.operator.handlers import startup
from agentrun.settings import OperatorSettings


class FakeApi:
    closed = 0

    async def list_objects(self, kind: Any) -> list[dict[str, Any]]:
        return []

    async def close(self) -> None:
        FakeApi.closed += 1


async def test_a_start_failing_on_a_nats_timeout_is_tried_again_within_seconds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tries: list[float] = []
    parts = object()

    async def connect() -> FakeApi:
        return FakeApi()

    async def start_parts(*_: Any, **__: Any) -> Any:
        tries.append(time.monotonic())
        if len(tries) == 1:
            raise nats.errors.TimeoutError
        return parts

    monkeypatch.setattr(startup.Kube, "connect", staticmethod(connect))
    monkeypatch.setattr(wiring, "start_parts", start_parts)
    FakeApi.closed = 0
    memo = wiring.OperatorMemo(settings=OperatorSettings())
    settings = kopf.OperatorSettings()
    await run_activity(
        lifecycle=kopf.lifecycles.all_at_once,
        registry=registries.get_default_registry(),
        settings=settings,
        activity=causes.Activity.STARTUP,
        indices=OperatorIndexers().indices,
        memo=memo,
    )
    assert memo.parts is parts
    assert len(tries) == 2 and FakeApi.closed == 1  # the failed try closed its client
    assert tries[1] - tries[0] == pytest.approx(startup.RETRY_DELAY, abs=1.0)
    assert startup.RETRY_DELAY <= 5
    # and so is a resource handler that raised (a cancel while NATS elects a leader)
    assert settings.execution.default_backoff == startup.RETRY_DELAY
