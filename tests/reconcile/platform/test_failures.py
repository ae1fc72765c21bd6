"""Failures that repeat: the ones retrying can fix are told from the ones it cannot, and a loop
that retries an object logs its failure once and its recovery once."""

from __future__ import annotations

import logging

import nats.errors
import pytest

from agentrun.bus import EventTooLarge
from agentrun.ledger import LedgerCorrupt, LedgerUnavailable
from agentrun.operator.platform.failures import GIVE_UP_AFTER, Failures, transient
from agentrun.operator.platform.kubeapi import ApiError

TRANSIENT = {
    "no answer": ApiError(0, "ClientConnectorError"),
    "forbidden until RBAC is fixed": ApiError(403, "Forbidden"),
    "conflict": ApiError(409, "Conflict"),
    "throttled": ApiError(429, "TooManyRequests"),
    "server error": ApiError(503, "Unavailable"),
    "nats timeout": nats.errors.TimeoutError(),
    "nats no servers": nats.errors.NoServersError(),
    "ledger unavailable": LedgerUnavailable("t"),
    "ledger corrupt": LedgerCorrupt("t"),
    "timeout": TimeoutError(),
    "connection reset": ConnectionResetError(),
}
PERMANENT = {
    "bad request": ApiError(400, "BadRequest"),
    "too large": ApiError(413, "RequestEntityTooLarge"),
    "invalid": ApiError(422, "Invalid"),
    "event too large": EventTooLarge(2_000_000, 1_044_480),
    "payload over the server's": nats.errors.MaxPayloadError(),
    "bad data": ValueError("not a number"),
    "a bug": KeyError("phase"),
}


@pytest.mark.parametrize("err", TRANSIENT.values(), ids=TRANSIENT.keys())
def test_what_passes_by_itself_is_transient(err: BaseException) -> None:
    assert transient(err)


@pytest.mark.parametrize("err", PERMANENT.values(), ids=PERMANENT.keys())
def test_what_the_same_attempt_meets_again_is_permanent(err: BaseException) -> None:
    assert not transient(err)


def test_a_permanent_failure_is_final_on_its_second_attempt_a_transient_one_never(
    caplog: pytest.LogCaptureFixture,
) -> None:
    failures = Failures(logging.getLogger("test.failures"), what="work")
    assert GIVE_UP_AFTER == 2
    first = failures.failed("a", ValueError("bad"), subject="A")
    assert (first.attempts, first.transient, first.final) == (1, False, False)
    assert failures.failed("a", ValueError("bad"), subject="A").final
    for _ in range(10):
        assert not failures.failed("b", ApiError(503, "down"), subject="B").final
    assert failures.attempts("b") == 10 and failures.attempts("c") == 0


def test_each_failure_is_logged_once_with_its_recovery(caplog: pytest.LogCaptureFixture) -> None:
    failures = Failures(logging.getLogger("test.failures"), what="work")
    with caplog.at_level(logging.DEBUG, logger="test.failures"):
        for _ in range(5):
            failures.failed("a", ApiError(503, "down"), subject="A")
        failures.failed("a", ApiError(500, "broken"), subject="A")  # another error: told
        failures.succeeded("a", subject="A")
        failures.succeeded("a", subject="A")  # nothing failed since: nothing to tell
        failures.failed("b", ValueError("bad"), subject="B")
    told = [(r.levelname, r.getMessage()) for r in caplog.records if r.levelno >= logging.INFO]
    retrying = "; retrying (logged once until it recovers)"
    assert told == [
        ("WARNING", f"work of A failed: ApiError: HTTP 503: down{retrying}"),
        ("WARNING", f"work of A failed: ApiError: HTTP 500: broken{retrying}"),
        ("INFO", "work of A recovered after 6 failed attempt(s)"),
        ("ERROR", "work of B failed: ValueError: bad"),
    ]
    assert caplog.records[-1].exc_info is not None  # a permanent one comes with its traceback


def test_what_is_remembered_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    from agentrun.operator.platform import failures as module

    monkeypatch.setattr(module, "MEMORY", 3)
    failures = Failures(logging.getLogger("test.failures"), what="work")
    for key in "abcd":
        failures.failed(key, ValueError("bad"), subject=key)
    assert failures.attempts("a") == 0 and failures.attempts("d") == 1
