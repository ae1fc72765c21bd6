"""Failures that repeat: which ones retrying can fix, and a log that tells each one once.

Every loop of the operator that works on objects one by one (the admission pump, the event
consumer, the status writers, the controllers, the discovery refresher, the ledger sweep)
meets two kinds of failure:

- *transient* ones, which go away by themselves: the API server or NATS away or throttling, a
  conflict, a damaged ledger entry waiting for its repair. Retrying is right, and so is making
  the object wait; logging every retry is not.
- *permanent* ones, which the same attempt meets again: a request the API server refuses as it
  is (HTTP 400, 413, 422), an event over the bus's message cap, a bug. Retrying only repeats the
  log line and keeps the object (and, for a queue, everything behind it) stuck: after
  ``GIVE_UP_AFTER`` attempts the caller ends the object with a typed reason, a condition and an
  Event instead — what that means is the kind's business.

What belongs here: ``transient`` (the classification) and ``Failures`` (per key: counts the
attempts, logs the first failure — with its traceback when it is not transient — and the
recovery, each once, and says when a permanent failure has repeated enough). What does not:
what a kind does with an object whose failure is final (its own module).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Hashable

import cachetools
import nats.errors

from agentrun.ledger import LedgerCorrupt, LedgerUnavailable
from agentrun.natsclient import EventTooLarge

from .kubeapi import ApiError

PERMANENT_STATUSES = frozenset({400, 413, 422})
"""HTTP statuses of a request the API server refuses as it is (bad request, too large,
invalid): sending it again meets the same answer."""
GIVE_UP_AFTER = 2
"""Attempts of an object's work that failed other than transiently before it is ended: one
retry, so a fault that passed meanwhile is not mistaken for a poison object (the worker ends a
turn ``checkpoint_failed`` after the same two)."""
MEMORY = 10_000
"""Keys remembered at most (the oldest failing key is forgotten first)."""


def transient(err: BaseException) -> bool:
    """Whether retrying the same work can succeed once a fault outside the object passed.

    Transient: an ``ApiError`` other than ``PERMANENT_STATUSES`` (no answer, 401/403 until the
    RBAC is fixed, 404/409 races, 429, 5xx), NATS errors other than a payload over the
    server's limit, an unreadable or unavailable ledger entry (repaired by the sweep),
    timeouts and connection errors. Everything else — ``EventTooLarge``, a refused request, a
    ``ValueError`` from the object's own data, a bug — is permanent.
    """
    if isinstance(err, ApiError):
        return err.status not in PERMANENT_STATUSES
    if isinstance(err, EventTooLarge | nats.errors.MaxPayloadError):
        return False
    return isinstance(
        err,
        nats.errors.Error | LedgerUnavailable | LedgerCorrupt | TimeoutError | ConnectionError,
    )


@dataclasses.dataclass(frozen=True, slots=True)
class Failure:
    """What ``Failures.failed`` knows of a key's failure."""

    attempts: int
    """Failed attempts in a row so far, this one included (1 on the first)."""
    transient: bool
    """Whether this failure is transient (``transient``)."""

    @property
    def final(self) -> bool:
        """A permanent failure met ``GIVE_UP_AFTER`` times: end the object, stop retrying."""
        return not self.transient and self.attempts >= GIVE_UP_AFTER


class Failures:
    """Counts and logs the failures of the objects one loop works on, each once.

    The first failure of a key is logged (a warning when transient; an error with its
    traceback otherwise), as is a failure whose message differs from the last one logged for
    the key; repeats go to the debug level. The first success after failures logs the
    recovery with the attempts it took. Not thread-safe; one per loop.
    """

    def __init__(self, logger: logging.Logger, *, what: str) -> None:
        """``logger``: the loop's module logger; ``what``: the work, in the log lines
        (e.g. ``"admission"``)."""
        self.log = logger
        self.what = what
        self._seen: cachetools.LRUCache[Hashable, tuple[int, str]] = cachetools.LRUCache(MEMORY)

    def failed(self, key: Hashable, err: BaseException, *, subject: str) -> Failure:
        """Count a failed attempt of ``key``'s work (``subject`` names the object in the log,
        e.g. ``"AgentRun ns/name"``); returns what is known of it."""
        attempts, told = self._seen.pop(key, (0, ""))
        text = f"{type(err).__name__}: {err}"
        failure = Failure(attempts + 1, transient(err))
        if text != told:
            if failure.transient:
                self.log.warning(
                    "%s of %s failed: %s; retrying (logged once until it recovers)",
                    self.what,
                    subject,
                    text,
                )
            else:
                self.log.error("%s of %s failed: %s", self.what, subject, text, exc_info=err)
        else:
            self.log.debug("%s of %s failed again (%d): %s", self.what, subject, attempts + 1, text)
        self._seen[key] = (failure.attempts, text)  # the least recently failed forgotten
        return failure

    def succeeded(self, key: Hashable, *, subject: str) -> None:
        """``key``'s work succeeded: log the recovery if it had failed, forget it."""
        seen = self._seen.pop(key, None)
        if seen is not None:
            self.log.info(
                "%s of %s recovered after %d failed attempt(s)", self.what, subject, seen[0]
            )

    def forget(self, key: Hashable) -> None:
        """Drop what is known of ``key`` (its object was ended or deleted)."""
        self._seen.pop(key, None)

    def attempts(self, key: Hashable) -> int:
        """Failed attempts of ``key`` in a row so far (0: none, or it recovered)."""
        return self._seen.get(key, (0, ""))[0]
