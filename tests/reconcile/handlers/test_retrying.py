"""A failed handler is tried again within seconds, then less and less often: 3, 6, 12 … 60 s
(kopf's own fixed 60 s for every handler that raises was a minute of nothing served after a
start-up failed on a passing fault, as provisioning did on a freshly formed three-server NATS
cluster: a stream update timing out while its Raft group elected a leader). The start-up runs
through kopf's own activity runner, its sleeps recorded instead of slept."""

from __future__ import annotations

import time
from typing import Any

import kopf
import nats.errors
import pytest
from kopf._core.engines import activities
from kopf._core.engines.indexing import OperatorIndexers
from kopf._core.intents import causes, registries

from agentrun.operator import (
    main,  # noqa: F401  (registers the handlers)
    wiring,
)
from agentrun.operator.handlers import admission, runs, startup
from agentrun.operator.handlers.retrying import retry_delay, retrying
from agentrun.settings import OperatorSettings


class FakeApi:
    closed = 0

    async def list_objects(self, kind: Any) -> list[dict[str, Any]]:
        return []

    async def close(self) -> None:
        FakeApi.closed += 1


async def test_a_start_failing_on_a_nats_timeout_is_tried_again_after_3_seconds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tries: list[float] = []
    parts = object()
    slept: list[float] = []
    real_sleep = activities.aiotime.sleep

    async def connect() -> FakeApi:
        return FakeApi()

    async def start_parts(*_: Any, **__: Any) -> Any:
        tries.append(time.monotonic())
        if len(tries) == 1:
            raise nats.errors.TimeoutError
        return parts

    async def sleep(delay: float | None, *args: Any, **kwargs: Any) -> Any:
        if delay:
            slept.append(delay)
        return await real_sleep(delay, *args, **kwargs)

    monkeypatch.setattr(startup.Kube, "connect", staticmethod(connect))
    monkeypatch.setattr(wiring, "start_parts", start_parts)
    monkeypatch.setattr(activities.aiotime, "sleep", sleep)
    FakeApi.closed = 0
    memo = wiring.OperatorMemo(settings=OperatorSettings())
    await activities.run_activity(
        lifecycle=kopf.lifecycles.all_at_once,
        registry=registries.get_default_registry(),
        settings=kopf.OperatorSettings(),
        activity=causes.Activity.STARTUP,
        indices=OperatorIndexers().indices,
        memo=memo,
    )
    assert memo.parts is parts and len(tries) == 2
    assert FakeApi.closed == 1  # the failed try closed its client
    assert slept and slept[0] == pytest.approx(3.0, abs=0.1)  # kopf's own: 60.0
    assert 2.9 <= tries[1] - tries[0] < 30


def test_the_delay_doubles_from_3_seconds_up_to_a_minute() -> None:
    assert [retry_delay(r) for r in range(7)] == [3.0, 6.0, 12.0, 24.0, 48.0, 60.0, 60.0]
    assert retry_delay(10_000) == 60.0


async def test_a_wrapped_handler_raises_a_temporary_error_with_the_delay() -> None:
    """… and kopf's own errors as they are."""
    own = kopf.TemporaryError("mine", delay=5)

    @retrying
    async def handler(*, retry: int, fail: BaseException | None, **_: Any) -> str:
        if fail is not None:
            raise fail
        return "done"

    assert await handler(retry=0, fail=None) == "done"
    for retry, delay in ((0, 3.0), (2, 12.0), (9, 60.0)):
        with pytest.raises(kopf.TemporaryError) as raised:
            await handler(retry=retry, fail=RuntimeError("nats: timeout"))
        assert raised.value.delay == delay
        assert isinstance(raised.value.__cause__, RuntimeError)
        assert "RuntimeError: nats: timeout" in str(raised.value)
    with pytest.raises(kopf.TemporaryError) as raised:
        await handler(retry=0, fail=own)
    assert raised.value is own
    with pytest.raises(kopf.PermanentError):
        await handler(retry=0, fail=kopf.PermanentError("never"))


class Running:
    """``memo.running()`` whose run store fails as NATS does during an election."""

    class Runs:
        async def end(self, *_: Any, **__: Any) -> bool:
            raise nats.errors.TimeoutError

    class Parts:
        runs: Any = None

    def running(self) -> Any:
        parts = Running.Parts()
        parts.runs = Running.Runs()
        handling = Running.Parts()
        handling.runs = parts
        return handling


async def test_a_cancel_failing_on_a_nats_timeout_is_tried_again_after_the_delay() -> None:
    with pytest.raises(kopf.TemporaryError) as raised:
        await runs.cancel_run(status={}, namespace="ns", name="r", uid="u", memo=Running(), retry=1)
    assert raised.value.delay == 6.0


def test_every_annotation_handler_and_the_start_up_are_wrapped() -> None:
    """The handlers that act on a person's annotation (cancel, approve or deny, rerun) and the
    start-up: kopf registered the wrapped functions, under their own names."""
    registry = registries.get_default_registry()
    found = {
        h.fn.__name__: h.fn
        for h in [
            *registry._changing.get_all_handlers(),
            *registry._activities.get_all_handlers(),
        ]
    }
    for fn in (runs.cancel_run, runs.review_run, admission.rerun_run, startup.start):
        assert found[fn.__name__] is fn and hasattr(fn, "__wrapped__"), fn.__name__
