"""Status writes are coalesced: fast turns cause few API writes; the first status, an approval
request and the terminal one are written at once; the terminal one always lands."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from typing import Any

from agentrun.operator.platform.kubeapi import ApiError, Ref
from agentrun.operator.runs import RunKey
from agentrun.operator.runs.writer import StatusWriter, refused_for_size

RUN = RunKey("ns", "run", "uid-1")


class FakeApi:
    """The API server port holding one AgentRun object in memory: merge-patches its status
    under the resourceVersion precondition, as the API server does (which does not check the
    patch's uid on the status subresource)."""

    def __init__(self, *, fail_with: int | None = None, uid: str = RUN.uid) -> None:
        self.on_conflict: Callable[[], None] | None = None
        """Runs when a patch is refused (409): e.g. a watch event arriving meanwhile."""
        self.writes: list[tuple[RunKey, dict[str, Any]]] = []
        """Applied patches: the run they were meant for and the status they carried."""
        self.written_at: list[float] = []
        """When each applied patch landed (monotonic seconds)."""
        self.fail_with = fail_with
        self.uid: str | None = uid
        """The object's uid; ``None``: there is no object."""
        self.version = 1
        self.status: dict[str, Any] = {}
        self.reads = 0
        self.refused = 0
        """Patches refused with ``fail_with``."""
        self.slow: list[float] = []
        """Seconds the next patches take before they land, one value a patch, in order."""

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
        if self.slow:
            await asyncio.sleep(self.slow.pop(0))
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
        self.written_at.append(time.monotonic())
        self.other_writer(dict(status))
        return self._object()


def running(seq: int) -> dict[str, Any]:
    return {"phase": "Running", "lastEventSequence": seq}


def ended(seq: int, reason: str = "completed") -> dict[str, Any]:
    return {"phase": "Succeeded", "terminalReason": reason, "lastEventSequence": seq}


async def until(check: Callable[[], bool], *, timeout: float = 10.0) -> None:
    """Poll ``check`` every 5 ms; TimeoutError after ``timeout`` seconds."""
    async with asyncio.timeout(timeout):
        while not check():
            await asyncio.sleep(0.005)


async def test_fifty_fast_turns_cause_two_writes_the_first_and_the_terminal() -> None:
    """An interval far longer than the turns take: the bound is two writes whatever the
    machine's speed (the first status at once, the terminal one at once, the rest coalesced
    into it); only a machine 100 times slower than needed could see a third."""
    api = FakeApi()
    writer = StatusWriter(api, interval=30.0)
    writer.start()
    for seq in range(1, 51):
        writer.submit(RUN, running(seq), seq=seq, terminal=False)
        await asyncio.sleep(0.005)
    writer.submit(RUN, ended(51), seq=51, terminal=True)
    await until(lambda: len(api.writes) == 2, timeout=5.0)
    await writer.flush_and_stop()
    first, last = (body for _, body in api.writes)
    assert first["phase"] == "Running" and first["lastEventSequence"] < 51
    assert last == ended(51)
    assert api.reads == 1  # read once; later patches go on the version each patch returned


async def test_the_first_status_and_the_terminal_one_are_not_held_for_the_interval() -> None:
    api = FakeApi()
    writer = StatusWriter(api, interval=30.0)
    writer.start()
    writer.submit(RUN, running(1), seq=1, terminal=False)
    await until(lambda: len(api.writes) == 1, timeout=5.0)  # at once, not after 30 s
    writer.submit(RUN, running(2), seq=2, terminal=False)  # held: one write per interval
    writer.submit(RUN, {**running(3), "phase": "AwaitingApproval"}, seq=3, terminal=True)
    await until(lambda: len(api.writes) == 2, timeout=5.0)  # a person to ask: at once
    writer.submit(RUN, running(4), seq=4, terminal=False)
    writer.submit(RUN, ended(5), seq=5, terminal=True)
    await until(lambda: len(api.writes) == 3, timeout=5.0)
    await writer.flush_and_stop()
    assert [body["lastEventSequence"] for _, body in api.writes] == [1, 3, 5]


async def test_a_run_s_ordinary_writes_are_at_least_the_interval_apart() -> None:
    api = FakeApi()
    writer = StatusWriter(api, interval=0.3)
    writer.start()
    writer.submit(RUN, running(1), seq=1, terminal=False)
    await until(lambda: len(api.writes) == 1)
    writer.submit(RUN, running(2), seq=2, terminal=False)
    await until(lambda: len(api.writes) == 2)
    await writer.flush_and_stop()
    assert api.written_at[1] - api.written_at[0] >= 0.3  # a lower bound no load can break


async def test_a_slow_patch_holds_the_run_s_next_write_for_the_interval_after_it_landed() -> None:
    """The interval counts from the end of a write, not its start: a first patch that takes
    most of the interval does not let the next one land right after it."""
    api = FakeApi()
    api.slow = [0.25]
    writer = StatusWriter(api, interval=0.3)
    writer.start()
    writer.submit(RUN, running(1), seq=1, terminal=False)
    await until(lambda: len(api.writes) == 1)
    writer.submit(RUN, running(2), seq=2, terminal=False)
    await until(lambda: len(api.writes) == 2)
    await writer.flush_and_stop()
    assert api.written_at[1] - api.written_at[0] >= 0.3


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


async def test_a_write_of_a_run_forgotten_while_it_was_on_its_way_is_not_tried_again() -> None:
    """The first life's end is being written when the run is rerun (its writer's memory of it
    forgotten, its status cleared for the new life): the write that failed meanwhile is not
    retried onto the rerun's object."""
    api = FakeApi(fail_with=500)
    api.slow = [0.2]
    writer = StatusWriter(api, interval=0.05)
    writer.start()
    writer.submit(RUN, ended(9), seq=9, terminal=True)
    await asyncio.sleep(0.05)  # the patch is on its way
    writer.forget(RUN)
    await until(lambda: api.refused >= 1)  # it failed after the run was forgotten
    api.fail_with = None
    await asyncio.sleep(0.3)  # a retry would have landed by now
    await writer.flush_and_stop()
    assert api.writes == []


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
    api.other_writer({})  # kopf's own patch (its annotations) moves the version on
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


class Refusing(FakeApi):
    """Refuses the full status with ``error`` (any exception), the minimal one too when
    ``minimal_too``; counts the attempts."""

    def __init__(self, error: Exception, *, minimal_too: bool = False) -> None:
        super().__init__()
        self.error = error
        self.minimal_too = minimal_too
        self.attempts = 0

    async def patch_status(
        self, ref: Ref, status: Mapping[str, Any], *, uid: str = "", version: str = ""
    ) -> dict[str, Any]:
        self.attempts += 1
        if "usage" in status or self.minimal_too:
            raise self.error
        return await super().patch_status(ref, status, uid=uid, version=version)


FULL = {**ended(4, "model_error"), "phase": "Failed", "usage": {"inputTokens": 1}}


async def test_a_status_too_large_or_unserialisable_gets_the_minimal_one_not_a_retry_loop(
    caplog: Any,
) -> None:
    for error in (ApiError(413, "Request Entity Too Large"), TypeError("not JSON")):
        api = Refusing(error)
        writer = StatusWriter(api, interval=0.0)
        writer.submit(RUN, FULL, seq=4, terminal=True)
        for _ in range(4):
            await writer.flush()
        (written,) = [w[1] for w in api.writes]
        assert (written["terminalReason"], written["lastEventSequence"]) == ("model_error", 4)
        assert "full status refused" in written["message"]
        assert api.attempts == 2  # the full body once, the minimal one once


async def test_a_minimal_status_refused_too_is_dropped_and_logged_once(caplog: Any) -> None:
    api = Refusing(ApiError(422, "Invalid"), minimal_too=True)
    writer = StatusWriter(api, interval=0.0)
    writer.submit(RUN, FULL, seq=4, terminal=True)
    with caplog.at_level("INFO", logger="agentrun.operator.runs.writer"):
        for _ in range(5):
            await writer.flush()
    assert api.attempts == 2 and api.writes == []
    logged = [r.getMessage() for r in caplog.records]
    assert sum("status patch of AgentRun ns/run failed" in m for m in logged) == 1, logged
    assert sum("minimal status of ns/run was refused" in m for m in logged) == 1, logged


async def test_a_transient_failure_is_retried_and_logged_once_until_it_recovers(
    caplog: Any,
) -> None:
    api = FakeApi(fail_with=503)
    writer = StatusWriter(api, interval=0.0)
    writer.submit(RUN, ended(7), seq=7, terminal=True)
    with caplog.at_level("INFO", logger="agentrun.operator.runs.writer"):
        for _ in range(5):
            await writer.flush()
        api.fail_with = None
        await writer.flush()
    assert api.refused == 5 and [w[1]["terminalReason"] for w in api.writes] == ["completed"]
    logged = [r.getMessage() for r in caplog.records if "ns/run" in r.getMessage()]
    assert len(logged) == 2 and "HTTP 503" in logged[0] and "recovered" in logged[1], logged


async def test_a_running_status_refused_for_its_size_hands_the_run_out_once_to_end() -> None:
    api = FakeApi(fail_with=413)
    writer = StatusWriter(api, interval=0.0)
    writer.start()
    body = {**running(5), "answer": "x" * 2000, "message": "m"}
    writer.submit(RUN, body, seq=5, terminal=False)
    async with asyncio.timeout(2):
        run, message = await writer.next_refused()
    assert run == RUN
    assert message.startswith("the run's status (")
    assert (
        "the largest field status.answer, 2002 bytes) was refused by the API server for its "
        "size (HTTP 413: test)"
    ) in message
    await asyncio.sleep(0.1)
    await writer.flush_and_stop()
    assert api.refused == 1  # not retried: the dispatcher ends the run


async def test_a_terminal_status_refused_for_its_size_is_written_minimal() -> None:
    api = FakeApi(fail_with=413)
    writer = StatusWriter(api, interval=0.0)
    body = {**ended(7, "completed"), "answer": "x" * 2000}
    writer.submit(RUN, body, seq=7, terminal=True)
    await writer.flush()
    api.fail_with = None
    await writer.flush()
    (written,) = [w[1] for w in api.writes]
    assert written["terminalReason"] == "completed" and "answer" not in written
    assert written["message"].startswith("full status refused by the API server (HTTP 413")


def test_which_refusals_are_for_size() -> None:
    assert refused_for_size(ApiError(413, "Request Entity Too Large"))
    too_long = '{"message": "status.message: Too long: may not be more than 32768 bytes"}'
    assert refused_for_size(ApiError(422, "Unprocessable Entity", too_long))
    assert not refused_for_size(ApiError(422, "Unprocessable Entity", '{"message": "Invalid"}'))
    assert not refused_for_size(ApiError(500, "Too long a wait"))


async def test_whether_a_run_exists_is_read_once_and_a_gone_one_is_handed_out() -> None:
    """``exists``: a run the writer knows (a watch event, a write) needs no read; one it does
    not is read once, and what was read is kept for its next patch; one whose object is gone or
    replaced is False and handed out by ``next_gone``; an API error reads as there."""
    api = FakeApi()
    writer = StatusWriter(api, interval=0.0)
    assert await writer.exists(RUN) and api.reads == 1
    assert await writer.exists(RUN) and api.reads == 1  # kept
    writer.submit(RUN, running(1), seq=1, terminal=False)
    await writer.flush()
    assert api.reads == 1 and len(api.writes) == 1  # the patch used what was read
    for uid in (None, "uid-of-a-new-object-with-that-name"):
        api = FakeApi(uid="unused")
        api.uid = uid
        writer = StatusWriter(api, interval=0.0)
        assert not await writer.exists(RUN)
        async with asyncio.timeout(1):
            assert await writer.next_gone() == RUN
    api = FakeApi()

    async def away(ref: Ref) -> None:
        raise ApiError(503, "Service Unavailable")

    api.get = away  # type: ignore[method-assign]
    assert await StatusWriter(api, interval=0.0).exists(RUN)
