"""Status writes are coalesced: fast turns cause few API writes; the terminal one always lands."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from typing import Any

from agentrun.operator.platform.kubeapi import ApiError, Ref
from agentrun.operator.runs import RunKey
from agentrun.operator.runs.writer import StatusWriter

RUN = RunKey("ns", "run", "uid-1")


class FakeApi:
    """The API server port holding one AgentRun object in memory: merge-patches its status
    under the resourceVersion precondition, as the API server does (which does not check the
    patch's uid on the status subresource)."""

    def __init__(self, *, fail_with: int | None = None, uid: str = RUN.uid) -> None:
        self.on_conflict: Callable[[], None] | None = None
        """Runs when a patch is refused (409): e.g. a watch event arriving meanwhile."""
        self.writes: list[tuple[RunKey, dict[str, Any]]] = []
        self.fail_with = fail_with
        self.uid: str | None = uid
        """The object's uid; ``None``: there is no object."""
        self.version = 1
        self.status: dict[str, Any] = {}
        self.reads = 0
        self.refused = 0
        """Patches refused with ``fail_with``."""

    def other_writer(self, status: dict[str, Any]) -> None:
        """Another process patches the status (the version moves on)."""
        self.status.update(status)
        self.version += 1

    def _object(self) -> dict[str, Any]:
        meta = {"uid": self.uid, "resourceVersion": str(self.version)}
        return {"metadata": meta, "status": dict(self.status)}

    async def get(self, ref: Ref) -> dict[str, Any] | None:
        assert ref == RUN.ref
        self.reads += 1
        return None if self.uid is None else self._object()

    async def patch_status(
        self, ref: Ref, status: Mapping[str, Any], *, uid: str = "", version: str = ""
    ) -> dict[str, Any]:
        refused = self.fail_with is not None and not (
            self.fail_with == 422 and "usage" not in status
        )
        if refused:  # a 422 fake refuses only full bodies; the minimal status is accepted
            self.refused += 1
            raise ApiError(self.fail_with or 0, "test")
        if self.uid is None:
            raise ApiError(404, "NotFound")
        if version != str(self.version):
            if self.on_conflict is not None:
                self.on_conflict()
            raise ApiError(409, "Conflict")
        self.writes.append((RunKey(ref.namespace, ref.name, uid), dict(status)))
        self.other_writer(dict(status))
        return self._object()


def running(seq: int) -> dict[str, Any]:
    return {"phase": "Running", "lastEventSequence": seq}


def ended(seq: int, reason: str = "completed") -> dict[str, Any]:
    return {"phase": "Succeeded", "terminalReason": reason, "lastEventSequence": seq}


async def test_fifty_fast_turns_cause_a_handful_of_writes_and_the_last_is_terminal() -> None:
    api = FakeApi()
    writer = StatusWriter(api, interval=0.2)
    started = time.monotonic()
    writer.start()
    for seq in range(1, 51):
        writer.submit(RUN, running(seq), seq=seq, terminal=False)
        await asyncio.sleep(0.005)
    writer.submit(RUN, ended(51), seq=51, terminal=True)
    await asyncio.sleep(0.05)
    await writer.flush_and_stop()
    # at most one write per interval plus the terminal one: about 0.3 s of turns make 3, but
    # a busy machine stretches the 5 ms sleeps, so the bound follows the time they took (50
    # uncoalesced writes stay far above it)
    took = time.monotonic() - started
    assert 1 <= len(api.writes) <= max(4, 2 + int(took / 0.2)), took
    assert api.writes[-1][1] == ended(51)
    assert api.reads == 1  # read once; later patches go on the version each patch returned


async def test_an_older_projection_never_overwrites_a_newer_one() -> None:
    api = FakeApi()
    writer = StatusWriter(api, interval=0.0)
    writer.submit(RUN, running(5), seq=5, terminal=True)
    await writer.flush()
    writer.submit(RUN, running(3), seq=3, terminal=False)
    await writer.flush()
    assert [w[1] for w in api.writes] == [running(5)]


async def test_a_projection_older_than_another_writers_status_is_dropped() -> None:
    """Two operators (one that lost its Lease): what the object shows decides, not memory."""
    api = FakeApi()
    writer = StatusWriter(api, interval=0.0)
    writer.submit(RUN, running(2), seq=2, terminal=False)
    await writer.flush()
    api.other_writer(running(7))  # the other process wrote a newer projection meanwhile
    writer.submit(RUN, running(4), seq=4, terminal=False)
    await writer.flush()
    assert api.status["lastEventSequence"] == 7
    assert [w[1] for w in api.writes] == [running(2)]
    assert writer.stale == 1


async def test_a_terminal_status_is_final() -> None:
    """A late Running projection (from an operator that lost its Lease) must not undo another
    process's end."""
    api = FakeApi()
    api.other_writer(ended(6))
    writer = StatusWriter(api, interval=0.0)
    counted: list[str] = []
    writer.submit(RUN, running(9), seq=9, terminal=False)  # even a higher sequence
    writer.submit(
        RUN, ended(9, "cancelled"), seq=9, terminal=True, on_end=lambda: counted.append("x")
    )
    await writer.flush()
    assert api.writes == []
    assert api.status == ended(6)
    assert counted == []  # the end was the other process's: not counted here


async def test_the_write_that_ends_the_run_calls_its_end_once() -> None:
    api = FakeApi()
    writer = StatusWriter(api, interval=0.0)
    counted: list[int] = []
    writer.submit(RUN, ended(3), seq=3, terminal=True, on_end=lambda: counted.append(3))
    await writer.flush()
    writer.submit(RUN, ended(3), seq=3, terminal=True, on_end=lambda: counted.append(3))
    await writer.flush()  # a redelivered terminal event: the object is final already
    assert counted == [3]
    assert len(api.writes) == 1


async def test_a_patch_that_raced_another_writer_is_re_read_and_re_decided() -> None:
    api = FakeApi()
    writer = StatusWriter(api, interval=0.0)
    writer.submit(RUN, running(1), seq=1, terminal=False)
    await writer.flush()
    api.other_writer({"metadata-only": True})  # e.g. kopf's annotations: the version moves
    writer.submit(RUN, running(2), seq=2, terminal=False)
    await writer.flush()
    assert [w[1] for w in api.writes] == [running(1), running(2)]
    assert api.reads == 2


async def test_runs_that_share_a_name_are_written_separately() -> None:
    old, new = RunKey("ns", "run", "uid-old"), RunKey("ns", "run", "uid-new")
    api = FakeApi(uid=new.uid)  # the old run was deleted; a new one took its name
    writer = StatusWriter(api, interval=0.0)
    writer.submit(old, running(9), seq=9, terminal=False)
    writer.submit(new, running(1), seq=1, terminal=False)  # a lower seq, but another run
    await writer.flush()
    assert api.writes == [(new, running(1))]
    async with asyncio.timeout(1):
        assert await writer.next_gone() == old


async def test_a_write_to_a_deleted_or_replaced_object_is_dropped_and_reported() -> None:
    for uid in (None, "uid-of-a-new-object-with-that-name"):
        api = FakeApi()
        api.uid = uid
        writer = StatusWriter(api, interval=0.0)
        writer.submit(RUN, running(1), seq=1, terminal=True)
        await writer.flush()
        await writer.flush()
        assert api.writes == []
        async with asyncio.timeout(1):
            assert await writer.next_gone() == RUN


async def test_a_write_whose_object_went_between_read_and_patch_is_reported_gone() -> None:
    api = FakeApi()
    writer = StatusWriter(api, interval=0.0)
    writer.submit(RUN, running(1), seq=1, terminal=False)
    await writer.flush()
    api.uid = None  # deleted after our last read: the patch answers 404
    writer.submit(RUN, running(2), seq=2, terminal=True)
    await writer.flush()
    async with asyncio.timeout(1):
        assert await writer.next_gone() == RUN


async def test_a_refused_status_is_replaced_once_by_a_minimal_one() -> None:
    api = FakeApi(fail_with=422)
    writer = StatusWriter(api, interval=0.0)
    body = {
        "phase": "Failed",
        "terminalReason": "model_error",
        "lastEventSequence": 4,
        "usage": {"inputTokens": -1},
    }
    writer.submit(RUN, body, seq=4, terminal=True)
    await writer.flush()
    await writer.flush()
    (written,) = [w[1] for w in api.writes]
    assert (written["phase"], written["terminalReason"]) == ("Failed", "model_error")
    assert written["lastEventSequence"] == 4
    assert "refused by the API server" in written["message"]


async def until(check: Callable[[], bool], *, timeout: float = 10.0) -> None:
    """Poll ``check`` every 5 ms; TimeoutError after ``timeout`` seconds."""
    async with asyncio.timeout(timeout):
        while not check():
            await asyncio.sleep(0.005)


async def test_a_failed_write_is_retried_after_the_interval() -> None:
    api = FakeApi(fail_with=500)
    writer = StatusWriter(api, interval=0.05)
    writer.start()
    writer.submit(RUN, ended(9), seq=9, terminal=True)
    await until(lambda: api.refused >= 1)  # the first attempt failed
    api.fail_with = None
    await until(lambda: bool(api.writes))  # the writer tried again by itself
    await writer.flush_and_stop()
    assert api.writes == [(RUN, ended(9))]


def watched(api: FakeApi) -> dict[str, Any]:
    """The object as a watch event carries it."""
    return {
        "metadata": {"uid": RUN.uid, "resourceVersion": str(api.version)},
        "status": dict(api.status),
    }


async def test_a_watched_version_spares_the_read_before_a_patch() -> None:
    api = FakeApi()
    writer = StatusWriter(api, interval=0.0)
    writer.observe(RUN, watched(api))
    writer.submit(RUN, running(3), seq=3, terminal=False)
    await writer.flush()
    api.other_writer({})  # kopf's own patch (annotations, finalizer) moves the version on
    writer.observe(RUN, watched(api))
    writer.submit(RUN, running(5), seq=5, terminal=False)
    await writer.flush()
    assert [body["lastEventSequence"] for _, body in api.writes] == [3, 5]
    assert api.reads == 0


async def test_an_older_watched_version_is_not_taken_and_costs_one_read() -> None:
    api = FakeApi()
    writer = StatusWriter(api, interval=0.0)
    early = watched(api)
    writer.submit(RUN, running(3), seq=3, terminal=False)
    await writer.flush()
    writer.observe(RUN, early)  # delivered late: older than what the patch returned
    api.other_writer({})
    writer.submit(RUN, running(5), seq=5, terminal=False)
    await writer.flush()
    assert [body["lastEventSequence"] for _, body in api.writes] == [3, 5]
    assert api.reads == 2  # the first write's, and the re-read after the refused (409) patch


async def test_a_watched_end_drops_an_older_projection_unwritten() -> None:
    api = FakeApi()
    writer = StatusWriter(api, interval=0.0)
    writer.observe(RUN, watched(api))
    api.other_writer(ended(6))
    writer.observe(RUN, watched(api))
    writer.submit(RUN, running(5), seq=5, terminal=False)
    await writer.flush()
    assert api.writes == [] and api.reads == 0


async def test_a_finished_run_the_writer_never_wrote_is_not_remembered() -> None:
    api = FakeApi()
    api.other_writer(ended(6))
    writer = StatusWriter(api, interval=0.0)
    writer.observe(RUN, watched(api))  # e.g. listed at start-up: nothing is kept for it
    writer.submit(RUN, running(5), seq=5, terminal=False)
    assert writer.stale == 0
    await writer.flush()  # so the write reads the object first, and drops the projection
    assert (api.reads, writer.stale, api.writes) == (1, 1, [])


async def test_a_refused_patch_retries_on_the_version_the_watch_showed_meanwhile() -> None:
    api = FakeApi()
    writer = StatusWriter(api, interval=0.0)
    writer.observe(RUN, watched(api))
    api.other_writer({})  # kopf patches; its watch event arrives while our patch is refused
    api.on_conflict = lambda: writer.observe(RUN, watched(api))
    writer.submit(RUN, running(3), seq=3, terminal=False)
    await writer.flush()
    assert [body["lastEventSequence"] for _, body in api.writes] == [3]
    assert api.reads == 0
