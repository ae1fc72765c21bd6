"""The path probe of ``bench_path.py``: loaded by every Python process whose ``PYTHONPATH``
names this folder, it times the steps of a turn's overhead path inside the operator and the
worker when ``AGENTRUN_PATH_PROBE`` names a folder to write to (and does nothing otherwise).

Each record is a step of the path, keyed by the committed event's stream sequence that the
next turn's TurnRequest names (``expected_seq``), with epoch seconds (``time.time``: the same
clock JetStream's timestamps and the scripted model's arrival times use). The records are
written when the process exits (``<role>-<pid>.txt``, one record a line). Wrapping is by
attribute name; a name that no longer exists is listed in ``<role>-<pid>.missing`` rather
than failing the process.
"""

from __future__ import annotations

import atexit
import contextvars
import os
import sys
import time
from typing import Any

_OUT = os.environ.get("AGENTRUN_PATH_PROBE", "")
_ARGV = " ".join(sys.argv)
_ROLE = (
    "operator" if "agentrun-operator" in _ARGV else "worker" if "agentrun-worker" in _ARGV else ""
)
_records: list[tuple[Any, ...]] = []
_missing: list[str] = []
_key: contextvars.ContextVar[int | None] = contextvars.ContextVar("probe_key", default=None)


def _dump() -> None:
    base = os.path.join(_OUT, f"{_ROLE}-{os.getpid()}")
    with open(base + ".txt", "a") as out:
        out.writelines(" ".join(map(str, r)) + "\n" for r in _records)
    if _missing:
        with open(base + ".missing", "w") as out:
            out.write("\n".join(_missing) + "\n")


def _wrap(owner: Any, name: str, make: Any) -> None:
    original = getattr(owner, name, None)
    if original is None:
        _missing.append(f"{getattr(owner, '__name__', owner)}.{name}")
        return
    setattr(owner, name, make(original))


def _timed(step: str) -> Any:
    """An async wrapper recording ``step start end`` under the current turn's key."""

    def make(original: Any) -> Any:
        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            started = time.time()
            try:
                return await original(*args, **kwargs)
            finally:
                _records.append((step, _key.get(), started, time.time()))

        return wrapper

    return make


def _operator() -> None:
    from agentrun.operator.runs import dispatch

    def consume(original: Any) -> Any:
        async def wrapper(self: Any, msg: Any, *args: Any, **kwargs: Any) -> Any:
            meta = msg.metadata
            _records.append(
                ("event_received", meta.sequence.stream, meta.timestamp.timestamp(), time.time())
            )
            return await original(self, msg, *args, **kwargs)

        return wrapper

    def publish(original: Any) -> Any:
        async def wrapper(self: Any, turn: Any) -> Any:
            started = time.time()
            try:
                return await original(self, turn)
            finally:
                _records.append(("publish", turn.request.expected_seq, started, time.time()))

        return wrapper

    _wrap(dispatch.Dispatcher, "_consume", consume)
    _wrap(dispatch.Dispatcher, "publish_ready", publish)


def _worker() -> None:
    import httpcore2._async.http11 as http11

    from agentrun.worker import budget, consumer, model, turn

    def received(original: Any) -> Any:
        async def wrapper(self: Any, msg: Any, request: Any) -> Any:
            _key.set(request.expected_seq)
            stored = msg.metadata.timestamp.timestamp()
            _records.append(("request_received", request.expected_seq, stored, time.time()))
            return await original(self, msg, request)

        return wrapper

    def planned(original: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            started = time.time()
            try:
                return original(*args, **kwargs)
            finally:
                _records.append(("plan", _key.get(), started, time.time()))

        return wrapper

    _wrap(consumer.TurnConsumer, "_turn", received)
    _wrap(consumer.TurnConsumer, "_run_turn", _timed("run_turn"))
    _wrap(turn.kernel, "plan_turn", planned)
    _wrap(budget, "hold_budget", _timed("reserve"))
    _wrap(model.ModelClient, "complete", _timed("model_call"))
    _wrap(http11.AsyncHTTP11Connection, "_send_request_headers", _timed("headers_sent"))


if _OUT and _ROLE:
    atexit.register(_dump)
    (_operator if _ROLE == "operator" else _worker)()
