"""A write decided by a real model runs once, though the model answers a redone turn with new
call ids: the worker's turn code, the kernel, the effect ledger on a real nats-server, and the
scripted model over HTTP whose call ids (and argument order) change with every request.

A turn that is not committed is simply run again (its worker died): these tests run a turn,
throw its record away as a killed worker would, and run it again.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import nats
import pytest

from agentrun import kernel
from agentrun.kernel import Phase
from agentrun.testing import mockllm, scenario
from agentrun.tools import Catalog, Sleep
from agentrun.worker.effects import EffectLedger
from agentrun.worker.model import ModelClient, RetryPolicy
from agentrun.worker.turn import TurnDeps, execute_turn
from agentrun_dev import natsserver

from .loop import NoSecrets, config
from .test_turns import Counter

SCRIPT = """
scenarios:
  - name: fresh-ids
    turns:
      - tool_calls:
          - id: "w{request}"
            name: bump
            arguments: [{key: a, note: x}, '{"note":"x","key":"a"}']
          - {id: "s{request}", name: sleep, arguments: {seconds: 0}}
      - content: "bumped once"
"""


@pytest.fixture
async def ledger(nats_server: natsserver.NatsServer) -> AsyncIterator[EffectLedger]:
    client = await nats.connect(**nats_server.client_options())
    try:
        yield await EffectLedger.open(client.jetstream(), bucket=f"E{uuid.uuid4().hex[:10]}")
    finally:
        await client.close()


@pytest.fixture
async def mock() -> AsyncIterator[mockllm.MockLLM]:
    async with mockllm.MockLLM(scenario.parse_scenarios(SCRIPT)) as server:
        yield server


PARAMS = {
    "type": "object",
    "properties": {"key": {"type": "string"}, "note": {"type": "string"}},
    "required": ["key"],
}


async def test_a_redone_decision_with_new_ids_never_runs_the_write_twice(
    ledger: EffectLedger, mock: mockllm.MockLLM
) -> None:
    counter = Counter(params=PARAMS)
    model = ModelClient(RetryPolicy(max_retries=0))
    deps = TurnDeps(
        model=model, catalog=Catalog([counter, Sleep()]), secrets=NoSecrets(), effects=ledger
    )
    run = config(mock.base_url, goal="bump", tools=("bump", "sleep"))
    try:
        state = kernel.initial_state(goal="bump")
        lost = await execute_turn(deps, run, state)  # its worker dies before the commit
        decided = await execute_turn(deps, run, state)
        assert isinstance(lost, kernel.Answered) and isinstance(decided, kernel.Answered)
        assert lost.deferred != decided.deferred  # the model answered with new ids
        assert counter.counts == {}  # nothing ran before its decision was committed
        state = kernel.advance(state, decided, run.limits)
        assert state.phase is Phase.RUNNING and state.pending is not None

        ran = await execute_turn(deps, run, state)  # its worker dies after the ledger write
        again = await execute_turn(deps, run, state)
        assert isinstance(ran, kernel.Resumed) and again == ran
        assert counter.counts == {"a": 1}
        write_id = decided.deferred[0]
        assert ran.results[0].content == "a=1" and ran.results[0].tool_call_id == write_id

        state = kernel.advance(state, again, run.limits)
        final = await execute_turn(deps, run, state)
        state = kernel.advance(state, final, run.limits)
        assert (state.phase, state.answer) == (Phase.COMPLETED, "bumped once")
        assert counter.counts == {"a": 1}  # exactly once: the run completed
        assert (state.steps, state.tool_calls) == (2, 2)
    finally:
        await model.close()


async def test_a_batch_of_read_calls_runs_in_the_turn_that_decided_it(
    ledger: EffectLedger,
) -> None:
    model = ModelClient(RetryPolicy(max_retries=0))
    deps = TurnDeps(model=model, catalog=Catalog([Sleep()]), secrets=NoSecrets(), effects=ledger)
    read_only = """
scenarios:
  - name: reads
    turns:
      - tool_calls: [{id: "s{request}", name: sleep, arguments: {seconds: 0}}]
      - content: "slept"
"""
    try:
        async with mockllm.MockLLM(scenario.parse_scenarios(read_only)) as reads:
            run = config(reads.base_url, goal="sleep", tools=("sleep",))
            state = kernel.initial_state(goal="sleep")
            record = await execute_turn(deps, run, state)
            assert isinstance(record, kernel.Answered)
            assert record.deferred == () and len(record.results) == 1
    finally:
        await model.close()
