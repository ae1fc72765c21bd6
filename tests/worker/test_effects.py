"""The effect ledger against a real nats-server: a write call runs at most once however often
its turn is run again, a recorded call is replayed, one sent with no recorded outcome ends the
run ``effect_unknown``, and read calls are not recorded."""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from typing import Any

import nats
import nats.errors
import pytest
from kv_support import live_keys
from nats.js import api

from agentrun import buckets, kernel, natsclient
from agentrun.kernel import Phase, ToolFault
from agentrun.settings import TOOL_RESULT_MAX_BYTES_LIMIT
from agentrun.tools import ToolContext, ToolError, ToolSpec
from agentrun.worker import toolrunner
from agentrun.worker.effects import (
    EffectEntry,
    EffectLedger,
    EffectLedgerUnavailable,
    EffectState,
    call_digest,
    effect_key,
    fit_entry,
)
from agentrun_dev import natsserver

SETTINGS = toolrunner.ToolRunSettings(retries=2, retry_backoff=0.01)


class Counting:
    """A tool that counts its calls; ``fail`` makes it raise once with that fault."""

    def __init__(self, effect: str, *, fail: ToolFault | None = None) -> None:
        self.calls = 0
        self.fail = fail
        self._spec = ToolSpec(
            "bump",
            "counts",
            {"type": "object", "properties": {"key": {"type": "string"}}},
            effect,  # type: ignore[arg-type]
            False,
        )

    @property
    def spec(self) -> ToolSpec:
        return self._spec

    async def run(self, arguments: Mapping[str, Any], ctx: ToolContext) -> str:
        self.calls += 1
        if self.fail is not None:
            fault, self.fail = self.fail, None
            raise ToolError("reset by peer", fault=fault)
        return f"bumped {arguments['key']} (key {ctx.run_uid}:{ctx.call_id})"


@pytest.fixture
async def ledger(nats_server: natsserver.NatsServer) -> AsyncIterator[EffectLedger]:
    client = await nats.connect(**nats_server.client_options())
    try:
        yield await EffectLedger.open(client.jetstream(), bucket=f"E{uuid.uuid4().hex[:10]}")
    finally:
        await client.close()


async def test_the_bucket_the_operator_provisions_is_the_one_a_worker_binds(
    nats_server: natsserver.NatsServer,
) -> None:
    """The operator creates the effect ledger's bucket from ``buckets.effects_config`` (it does
    not import the worker); a worker's ledger binds it without creating one: no history, a
    week's TTL, file storage."""
    client = await nats.connect(**nats_server.client_options())
    bucket = f"E{uuid.uuid4().hex[:10]}"
    try:
        js = client.jetstream()
        kv = await buckets.open_bucket(js, buckets.effects_config(bucket), create=True)
        status = await kv.status()
        assert (status.history, status.ttl) == (1, 604_800.0)
        assert status.stream_info.config.storage == api.StorageType.FILE
        ledger = await EffectLedger.open(js, bucket=bucket, create=False)
        call = kernel.CheckedCall("c1", "bump", {"key": "k"})
        assert await ledger.prepare("run-1", call) is None
        assert await live_keys(kv) == [effect_key("run-1", "c1")]
    finally:
        await client.close()


async def run(
    tool: Counting, ledger: EffectLedger, call: kernel.CheckedCall, *, run_uid: str = "run-1"
) -> kernel.ToolResult:
    ctx = ToolContext(namespace="ns", run_name="r", run_uid=run_uid, call_id="")
    (result,) = await toolrunner.run_batch(
        [call],
        tools={"bump": tool},
        context=ctx,
        settings=SETTINGS,
        deadline=time.time() + 60,
        effects=ledger,
    )
    return result


CALL = kernel.CheckedCall("call_7", "bump", {"key": "a"})


@pytest.mark.parametrize("effect", ["write", "idempotent"])
async def test_a_turn_run_again_replays_the_recorded_result(
    ledger: EffectLedger, effect: str
) -> None:
    tool = Counting(effect)
    first = await run(tool, ledger, CALL)
    again = await run(tool, ledger, CALL)
    assert tool.calls == 1
    assert first == again
    assert first.content == "bumped a (key run-1:call_7)"


async def test_a_call_sent_with_no_recorded_outcome_is_never_sent_again(
    ledger: EffectLedger,
) -> None:
    tool = Counting("write")
    assert await ledger.claim("run-1", CALL) is None  # the worker died right after sending
    result = await run(tool, ledger, CALL)
    assert tool.calls == 0
    assert (result.is_error, result.fault) == (True, ToolFault.EFFECT_UNKNOWN)
    state = kernel.advance(
        kernel.initial_state(goal="g"),
        kernel.Answered(0, kernel.ToolCalls((), None), calls=(CALL,), results=(result,)),
        kernel.Limits(),
    )
    assert state.phase is Phase.EFFECT_UNKNOWN
    assert "bump (call_7) was sent before its worker stopped" in state.message


async def test_a_different_call_under_the_same_key_gets_no_other_calls_result(
    ledger: EffectLedger,
) -> None:
    tool = Counting("write")
    await run(tool, ledger, CALL)
    other = kernel.CheckedCall("call_7", "bump", {"key": "b"})
    result = await run(tool, ledger, other)
    assert tool.calls == 1 and result.fault is ToolFault.EFFECT_UNKNOWN


async def test_runs_are_kept_apart(ledger: EffectLedger) -> None:
    tool = Counting("write")
    await run(tool, ledger, CALL, run_uid="run-1")
    await run(tool, ledger, CALL, run_uid="run-2")
    assert tool.calls == 2


async def test_a_failed_write_is_recorded_once_and_not_retried(ledger: EffectLedger) -> None:
    tool = Counting("write", fail=ToolFault.CONNECTION)
    result = await run(tool, ledger, CALL)
    # a reset may have come after the write happened: its outcome is unknown
    assert (tool.calls, result.fault) == (1, ToolFault.EFFECT_UNKNOWN)
    assert await run(tool, ledger, CALL) == result and tool.calls == 1


async def test_an_idempotent_call_is_retried_inside_its_one_ledger_entry(
    ledger: EffectLedger,
) -> None:
    tool = Counting("idempotent", fail=ToolFault.CONNECTION)
    result = await run(tool, ledger, CALL)
    assert (tool.calls, result.is_error) == (2, False)
    entry = await ledger.claim("run-1", CALL)
    assert entry is not None and entry == result


async def test_read_calls_are_not_recorded(ledger: EffectLedger) -> None:
    tool = Counting("read")
    await run(tool, ledger, CALL)
    await run(tool, ledger, CALL)
    assert tool.calls == 2
    assert await ledger.claim("run-1", CALL) is None  # nothing was there


def test_keys_are_valid_kv_keys_and_digests_tell_calls_apart() -> None:
    key = effect_key("0d7c-uid", "call:weird/id ü")
    assert key.startswith("0d7c-uid.") and all(c.isalnum() or c in "-_." for c in key)
    assert call_digest(CALL) != call_digest(kernel.CheckedCall("call_7", "bump", {"key": "b"}))
    assert EffectState.PREPARED.value == "prepared"


class Verbose:
    """A write tool whose result is ``text``; counts its calls."""

    def __init__(self, text: str) -> None:
        self.calls = 0
        self.text = text
        self.spec = ToolSpec("bump", "verbose", {"type": "object"}, "write", False)

    async def run(self, arguments: Mapping[str, Any], ctx: ToolContext) -> str:
        self.calls += 1
        return self.text


TRUNCATED = re.compile(r"\n\[agentrun: result truncated, (\d+) more bytes\]$")


async def test_a_result_over_what_an_entry_holds_is_recorded_cut_and_replayed_cut(
    nats_server: natsserver.NatsServer,
) -> None:
    """At the largest result cap the settings allow, accented text (2 UTF-8 bytes a character,
    stored as 6-byte escapes) would take three times the bus's message cap in its entry: it is
    recorded cut, with the marker results are cut with, and the call answers what was recorded
    both times."""
    bucket = f"E{uuid.uuid4().hex[:10]}"
    client = await nats.connect(**nats_server.client_options())
    try:
        cap = natsclient.event_cap(client)
        ledger = await EffectLedger.open(client.jetstream(), bucket=bucket, entry_cap=cap)
        tool = Verbose("é" * (TOOL_RESULT_MAX_BYTES_LIMIT // 2))
        ctx = ToolContext(namespace="ns", run_name="r", run_uid="run-1", call_id="")
        settings = toolrunner.ToolRunSettings(max_result_bytes=TOOL_RESULT_MAX_BYTES_LIMIT)

        async def run_turn() -> kernel.ToolResult:
            (result,) = await toolrunner.run_batch(
                [CALL],
                tools={"bump": tool},
                context=ctx,
                settings=settings,
                deadline=time.time() + 60,
                effects=ledger,
            )
            return result

        first = await run_turn()
        again = await run_turn()
        entry = await (await client.jetstream().key_value(bucket)).get(effect_key("run-1", CALL.id))
    finally:
        await client.close()
    assert tool.calls == 1
    assert first == again and not first.is_error
    found = TRUNCATED.search(first.content)
    assert found is not None
    kept = first.content[: found.start()]
    assert set(kept) == {"é"}
    assert len(kept.encode()) + int(found.group(1)) == len(tool.text.encode())
    assert entry.value is not None and cap - 1024 < len(entry.value) <= cap


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("\x01" * 5000, id="control-characters"),
        pytest.param('"' * 5000, id="quotes"),
        pytest.param("ü" * 5000, id="accents"),
        pytest.param("🙂" * 5000, id="emoji"),
    ],
)
def test_an_entry_is_cut_to_its_cap_however_its_text_is_escaped(text: str) -> None:
    result = kernel.ToolResult("call_7", "bump", text)
    entry = EffectEntry(EffectState.DONE, call_digest(CALL), result)
    fitted, data = fit_entry(entry, 4096)
    assert len(data) <= 4096
    assert fitted.result is not None and TRUNCATED.search(fitted.result.content)
    assert fit_entry(entry, 1_000_000)[0] is entry
    with pytest.raises(ValueError, match="cannot fit in 50 bytes"):
        fit_entry(entry, 50)


class LostAnswer:
    """A KV bucket whose first ``create`` is stored but answers with a timeout (a leader that
    stepped down after storing, a reply lost on the way)."""

    def __init__(self, kv: Any) -> None:
        self.kv = kv
        self.lost = False

    async def create(self, key: str, value: bytes) -> int:
        revision: int = await self.kv.create(key, value)
        if not self.lost:
            self.lost = True
            raise nats.errors.TimeoutError
        return revision

    def __getattr__(self, name: str) -> Any:
        return getattr(self.kv, name)


async def test_a_prepare_whose_answer_was_lost_is_read_back_as_its_own_and_sent_once(
    ledger: EffectLedger,
) -> None:
    """B04's kind on the effect ledger: the ``prepared`` record was stored but its answer lost.
    Read back, the entry is this prepare's own (its writer token): nothing was sent, so the
    call is sent — once — instead of ending the run ``effect_unknown``; a later prepare of
    the same call (another delivery) still finds it and does not send."""
    ledger._kv = LostAnswer(ledger._kv)  # type: ignore[assignment]
    tool = Counting("write")
    call = kernel.CheckedCall("c1", "bump", {"key": "k"})
    first = await run(tool, ledger, call)
    assert (first.is_error, tool.calls) == (False, 1)
    again = await ledger.prepare("run-1", call)
    assert again is not None and again.state is EffectState.DONE


async def test_a_prepare_that_was_never_stored_is_unavailable_not_unknown(
    ledger: EffectLedger,
) -> None:
    class NeverStored:
        async def create(self, key: str, value: bytes) -> int:
            raise nats.errors.TimeoutError

        def __getattr__(self, name: str) -> Any:
            return getattr(kv, name)

    kv = ledger._kv
    ledger._kv = NeverStored()  # type: ignore[assignment]
    with pytest.raises(EffectLedgerUnavailable, match="cannot record"):
        await ledger.prepare("run-1", kernel.CheckedCall("c1", "bump", {"key": "k"}))
