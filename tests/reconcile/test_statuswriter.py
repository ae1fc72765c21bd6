"""Status writes are coalesced: fast turns cause few API writes; the terminal one always lands."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from kubernetes_asyncio.client.exceptions import ApiException

from agentrun.operator.statuswriter import StatusWriter


class FakeApi:
    def __init__(self, *, fail_with: int | None = None) -> None:
        self.writes: list[tuple[str, str, dict[str, Any]]] = []
        self.fail_with = fail_with

    async def patch(self, namespace: str, name: str, body: Mapping[str, Any]) -> None:
        if self.fail_with is not None:
            raise ApiException(status=self.fail_with, reason="test")
        self.writes.append((namespace, name, dict(body)))


async def test_fifty_fast_turns_cause_a_handful_of_writes_and_the_last_is_terminal() -> None:
    api = FakeApi()
    writer = StatusWriter(api.patch, interval=0.2)
    writer.start()
    for seq in range(1, 51):
        writer.submit("ns", "run", {"seq": seq}, seq=seq, terminal=False)
        await asyncio.sleep(0.005)
    writer.submit("ns", "run", {"seq": 51, "phase": "Succeeded"}, seq=51, terminal=True)
    await asyncio.sleep(0.05)
    await writer.close()
    assert 1 <= len(api.writes) <= 4
    assert api.writes[-1][2] == {"seq": 51, "phase": "Succeeded"}


async def test_an_older_projection_never_overwrites_a_newer_one() -> None:
    api = FakeApi()
    writer = StatusWriter(api.patch, interval=0.0)
    writer.submit("ns", "run", {"seq": 5}, seq=5, terminal=True)
    await writer.flush()
    writer.submit("ns", "run", {"seq": 3}, seq=3, terminal=False)
    await writer.flush()
    assert [w[2] for w in api.writes] == [{"seq": 5}]


async def test_a_write_to_a_deleted_object_is_dropped_not_retried() -> None:  # C21
    api = FakeApi(fail_with=404)
    writer = StatusWriter(api.patch, interval=0.0)
    writer.submit("ns", "gone", {"phase": "Running"}, seq=1, terminal=True)
    await writer.flush()
    await writer.flush()
    assert writer._pending == {}  # nothing queued for a retry that would recreate it


async def test_a_failed_write_is_retried_after_the_interval() -> None:
    api = FakeApi(fail_with=500)
    writer = StatusWriter(api.patch, interval=0.05)
    writer.start()
    writer.submit("ns", "run", {"phase": "Failed"}, seq=9, terminal=True)
    await asyncio.sleep(0.02)
    api.fail_with = None
    await asyncio.sleep(0.2)
    await writer.close()
    assert api.writes == [("ns", "run", {"phase": "Failed"})]
