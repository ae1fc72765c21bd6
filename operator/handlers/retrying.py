"""How soon kopf tries a failed handler again.

kopf tries a handler that raised anything but its own errors again after
``settings.execution.default_backoff`` (60 s) for ever, and what fails ours is mostly
passing: a NATS request timing out while a freshly formed or restarting cluster elects a
stream's leader, the API server answering 429 while its storage initialises. A minute is
long for those (until the start-up succeeds the process serves nothing; a cancel, approval or
rerun would wait a minute after NATS is back), and a fixed short delay would hammer the API
server and flood the log while a fault lasts. `retrying` turns such an error into
``kopf.TemporaryError`` with a delay that doubles from ``FIRST_DELAY`` up to ``MAX_DELAY``.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import kopf

FIRST_DELAY = 3.0
"""Seconds before the first retry of a failed handler."""
MAX_DELAY = 60.0
"""Seconds between retries at most (kopf's own fixed delay)."""

T = TypeVar("T")


def retry_delay(retry: int) -> float:
    """Seconds before try ``retry + 1`` (``retry``: kopf's count of retries so far, 0 on the
    first failure): ``FIRST_DELAY`` doubled per retry, at most ``MAX_DELAY``."""
    return min(FIRST_DELAY * 2.0 ** min(retry, 16), MAX_DELAY)


def retrying(handler: Callable[..., Awaitable[T]]) -> Callable[..., Awaitable[T]]:
    """Wrap a kopf handler so that an error other than kopf's own is raised as
    ``kopf.TemporaryError`` (the original as its cause) with delay ``retry_delay(retry)``;
    ``kopf.TemporaryError`` and ``kopf.PermanentError`` pass unchanged. The handler is
    called with the keyword arguments kopf passes (``retry`` among them)."""

    @functools.wraps(handler)
    async def wrapped(**kwargs: Any) -> T:
        try:
            return await handler(**kwargs)
        except (kopf.TemporaryError, kopf.PermanentError):
            raise
        except Exception as err:
            delay = retry_delay(int(kwargs.get("retry") or 0))
            raise kopf.TemporaryError(f"{type(err).__name__}: {err}", delay=delay) from err

    return wrapped
