"""The probes of ``bench_path.py`` and ``bench_objects.py --memory``: loaded by every Python
process whose ``PYTHONPATH`` names this folder. The path probe times the steps of a turn's
overhead path inside the operator and the worker when ``AGENTRUN_PATH_PROBE`` names a folder
to write to; the memory probe (``AGENTRUN_MEMORY_PROBE``: a folder) traces the operator's
allocations and, on ``SIGUSR2``, writes what is held, by the line that allocated it
(``_memory``). The collector probe (``AGENTRUN_GC_PROBE``: a folder) counts the cyclic
garbage collector's passes by generation and the CPU time they took (the collecting thread's
clock), written every second as ``<role>-<pid>.gc.json`` (``_collector``). None does
anything when its variable is unset.

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


_MEMORY = os.environ.get("AGENTRUN_MEMORY_PROBE", "")
_MEMORY_FRAMES = int(os.environ.get("AGENTRUN_MEMORY_FRAMES") or 0)
"""Frames kept of each traced allocation's stack (0: no tracing, which costs memory itself)."""


def _mappings() -> dict[str, float]:
    """The process's resident memory (MiB) by kind of mapping: ``heap`` (the C allocator's
    main heap), ``anonymous`` (other private mappings: pymalloc's arenas, the C allocator's
    large blocks and thread arenas, thread stacks), ``files`` (code and data of files)."""
    kinds = {"heap": 0.0, "anonymous": 0.0, "files": 0.0}
    kind = "files"
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            head = line.split()
            if head and "-" in head[0] and not head[0].endswith(":"):
                name = head[5] if len(head) > 5 else ""
                kind = "heap" if name == "[heap]" else "anonymous" if not name else "files"
            elif head and head[0] == "Rss:":
                kinds[kind] += int(head[1]) / 1024
    return {k: round(v, 1) for k, v in kinds.items()}


def _pymalloc() -> dict[str, float]:
    """pymalloc's arenas of 1 MiB (``sys._debugmallocstats``, which writes to the C stderr):
    those held now and at most, MiB in blocks in use, free in pools in use, in unused pools."""
    import re
    import tempfile

    with tempfile.TemporaryFile() as out:
        saved = os.dup(2)
        try:
            os.dup2(out.fileno(), 2)
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        out.seek(0)
        text = out.read().decode(errors="replace")
    figures = {}
    for label, pattern in (
        ("arenas_held", r"# arenas highwater mark\s*=\s*([\d,]+)"),
        ("arenas_now", r"# arenas allocated current\s*=\s*([\d,]+)"),
        ("in_blocks_mib", r"# bytes in allocated blocks\s*=\s*([\d,]+)"),
        ("free_in_pools_mib", r"# bytes in available blocks\s*=\s*([\d,]+)"),
        ("free_pools_mib", r"\d+ unused pools \* \d+ bytes\s*=\s*([\d,]+)"),
    ):
        found = re.search(pattern, text)
        if found:
            value = float(found.group(1).replace(",", ""))
            figures[label] = round(value / 2**20, 1) if label.endswith("mib") else value
    return figures


def _memory() -> None:
    """On ``SIGUSR2`` write ``operator-<pid>.memory.json``: the process's RSS (``rss_mib``),
    its resident memory by kind of mapping (``mappings``), pymalloc's arenas (``pymalloc``)
    and, when ``AGENTRUN_MEMORY_FRAMES`` traces allocations (from this process's start), what
    tracemalloc traces (``traced_mib``, ``peak_mib``) and the 40 largest holders grouped by
    the allocating line, each with the stack that made the most of it (``top``: ``mib``,
    ``blocks``, ``where``, ``stack``)."""
    import json
    import signal
    import tracemalloc

    if _MEMORY_FRAMES:
        tracemalloc.start(_MEMORY_FRAMES)

    def traced() -> dict[str, Any]:
        snapshot = tracemalloc.take_snapshot().filter_traces(
            [tracemalloc.Filter(False, tracemalloc.__file__)]
        )
        stacks: dict[Any, Any] = {}
        for stat in snapshot.statistics("traceback"):
            line = stat.traceback[0]
            known = stacks.get((line.filename, line.lineno))
            if known is None or stat.size > known.size:
                stacks[(line.filename, line.lineno)] = stat
        top = []
        for stat in snapshot.statistics("lineno")[:40]:
            frame = stat.traceback[0]
            heaviest = stacks.get((frame.filename, frame.lineno))
            top.append(
                {
                    "mib": round(stat.size / 2**20, 2),
                    "blocks": stat.count,
                    "where": f"{frame.filename}:{frame.lineno}",
                    "stack": [f"{f.filename}:{f.lineno}" for f in heaviest.traceback]
                    if heaviest
                    else [],
                }
            )
        now, peak = tracemalloc.get_traced_memory()
        return {"traced_mib": round(now / 2**20, 1), "peak_mib": round(peak / 2**20, 1), "top": top}

    def dump(*_: object) -> None:
        try:
            write()
        except Exception as err:  # a signal handler's error would land in the operator's code
            print(f"memory probe: {err!r}", file=sys.stderr, flush=True)

    def write() -> None:
        import gc

        gc.collect()
        with open("/proc/self/status") as status:
            rss = next(int(x.split()[1]) for x in status if x.startswith("VmRSS"))
        out: dict[str, Any] = {
            "rss_mib": round(rss / 1024, 1),
            "mappings": _mappings(),
            "pymalloc": _pymalloc(),
        }
        if tracemalloc.is_tracing():
            out |= traced()
        path = os.path.join(_MEMORY, f"{_ROLE}-{os.getpid()}.memory.json")
        with open(path + ".part", "w") as file:
            json.dump(out, file, indent=1)
        os.replace(path + ".part", path)

    signal.signal(signal.SIGUSR2, dump)


_GC = os.environ.get("AGENTRUN_GC_PROBE", "")


def _collector() -> None:
    import gc
    import json
    import threading

    passes = {generation: [0, 0.0] for generation in range(3)}  # passes, CPU seconds
    started = [0.0]

    def timed(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[0] = time.thread_time()
        else:
            totals = passes[info["generation"]]
            totals[0] += 1
            totals[1] += time.thread_time() - started[0]

    def write() -> None:
        path = os.path.join(_GC, f"{_ROLE}-{os.getpid()}.gc.json")
        while True:
            with open(path + ".part", "w") as file:
                json.dump({"pid": os.getpid(), "passes": passes}, file)
            os.replace(path + ".part", path)
            time.sleep(1.0)

    gc.callbacks.append(timed)
    threading.Thread(target=write, name="gc-probe", daemon=True).start()


if _MEMORY and _ROLE == "operator":
    _memory()

if _GC and _ROLE:
    _collector()

if _OUT and _ROLE:
    atexit.register(_dump)
    (_operator if _ROLE == "operator" else _worker)()
