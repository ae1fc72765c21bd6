"""Status writes are coalesced: fast turns cause few API writes; the terminal one always lands."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from kubernetes_asyncio.client.exceptions import ApiException

from agentrun.operator.statuswriter import RunKey, StatusWriter

RUN = RunKey("ns", "run", "uid-1")


class FakeApi:
    def __init__(self, *, fail_with: int | None = None) -> None:
        self.writes: list[tuple[RunKey, dict[str, Any]]] = []
        self.fail_with = fail_with
        self.gone: list[RunKey] = []

    async def patch(self, run: RunKey, body: Mapping[str, Any]) -> None:
        refused = self.fail_with is not None and not (self.fail_with == 422 and "usage" not in body)
        if refused:  # a 422 fake refuses only full bodies; the minimal status is accepted
            raise ApiException(status=self.fail_with, reason="test")
        self.writes.append((run, dict(body)))

    async def on_gone(self, run: RunKey) -> None:
        self.gone.append(run)


async def test_fifty_fast_turns_cause_a_handful_of_writes_and_the_last_is_terminal() -> None:
    api = FakeApi()
    writer = StatusWriter(api.patch, interval=0.2)
    writer.start()
    for seq in range(1, 51):
        writer.submit(RUN, {"seq": seq}, seq=seq, terminal=False)
        await asyncio.sleep(0.005)
    writer.submit(RUN, {"seq": 51, "phase": "Succeeded"}, seq=51, terminal=True)
    await asyncio.sleep(0.05)
    await writer.close()
    assert 1 <= len(api.writes) <= 4
    assert api.writes[-1][1] == {"seq": 51, "phase": "Succeeded"}


async def test_an_older_projection_never_overwrites_a_newer_one() -> None:
    api = FakeApi()
    writer = StatusWriter(api.patch, interval=0.0)
    writer.submit(RUN, {"seq": 5}, seq=5, terminal=True)
    await writer.flush()
    writer.submit(RUN, {"seq": 3}, seq=3, terminal=False)
    await writer.flush()
    assert [w[1] for w in api.writes] == [{"seq": 5}]


async def test_runs_that_share_a_name_are_written_separately() -> None:
    api = FakeApi()
    writer = StatusWriter(api.patch, interval=0.0)
    old, new = RunKey("ns", "same", "uid-old"), RunKey("ns", "same", "uid-new")
    writer.submit(old, {"seq": 9}, seq=9, terminal=False)
    writer.submit(new, {"seq": 1}, seq=1, terminal=False)  # a lower seq, but another run
    await writer.flush()
    assert sorted((w[0].uid, w[1]["seq"]) for w in api.writes) == [("uid-new", 1), ("uid-old", 9)]


async def test_a_write_to_a_deleted_or_replaced_object_is_dropped_and_reported() -> None:
    for status in (404, 409):
        api = FakeApi(fail_with=status)
        writer = StatusWriter(api.patch, interval=0.0, on_gone=api.on_gone)
        writer.submit(RUN, {"phase": "Running"}, seq=1, terminal=True)
        await writer.flush()
        await writer.flush()
        assert api.writes == [] and api.gone == [RUN]


async def test_a_refused_status_is_replaced_once_by_a_minimal_one() -> None:
    api = FakeApi(fail_with=422)
    writer = StatusWriter(api.patch, interval=0.0)
    body = {"phase": "Failed", "terminalReason": "model_error", "usage": {"inputTokens": -1}}
    writer.submit(RUN, body, seq=4, terminal=True)
    await writer.flush()
    await writer.flush()
    (written,) = [w[1] for w in api.writes]
    assert (written["phase"], written["terminalReason"]) == ("Failed", "model_error")
    assert "refused by the API server" in written["message"]


async def test_a_failed_write_is_retried_after_the_interval() -> None:
    api = FakeApi(fail_with=500)
    writer = StatusWriter(api.patch, interval=0.05)
    writer.start()
    writer.submit(RUN, {"phase": "Failed"}, seq=9, terminal=True)
    await asyncio.sleep(0.02)
    api.fail_with = None
    await asyncio.sleep(0.2)
    await writer.close()
    assert api.writes == [(RUN, {"phase": "Failed"})]
