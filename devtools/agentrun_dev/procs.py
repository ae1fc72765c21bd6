"""Child processes of the local stack, started in their own process group and stopped by pid.

A process is described by a `ProcessSpec` (argv, extra environment, log file) and, once
started, identified by a `ProcessRecord` (pid plus the kernel's start time, so a recycled pid
is never mistaken for ours). Records are plain data: a later CLI invocation can stop a process
that an earlier one started. Stopping signals the process group whose id is the recorded pid,
so helpers the process spawned go with it.

What belongs here: process lifecycle only. Ports, readiness probes and what the processes are
live in `probes`, `components` and the modules that start specific services.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import datetime
import enum
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import psutil

_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}
"""Processes started by this Python process, kept so their exit status is reaped."""

_PR_SET_PDEATHSIG = 1
_POLL_SECONDS = 0.05


class StopOutcome(enum.StrEnum):
    """What stopping (or killing) a recorded process found and did."""

    STOPPED = "stopped"
    """It exited after SIGTERM within the timeout."""
    KILLED = "killed"
    """It needed SIGKILL."""
    NOT_RUNNING = "not-running"
    """It had already exited; any members left in its process group were killed."""
    PID_REUSED = "pid-reused"
    """The pid now belongs to another process, which was left alone."""


@dataclasses.dataclass(frozen=True, slots=True)
class ProcessSpec:
    """How to start one process; enough to start it again after it died."""

    name: str
    """Component name, e.g. ``"etcd"`` or ``"worker-1"``; used in messages and the log header."""
    argv: tuple[str, ...]
    """Program and arguments; ``argv[0]`` is an absolute path or a name on PATH."""
    log_path: Path
    """File that receives stdout and stderr (appended to; parent dirs are created)."""
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """Variables set on top of the starting process's own environment."""
    cwd: Path | None = None
    """Working directory; ``None`` keeps the caller's."""
    die_with_parent: bool = False
    """Linux only: SIGKILL the process when the thread that started it exits (for tests, so a
    killed pytest leaves nothing behind). The CLI's processes outlive the CLI, so it is off."""

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form, read back by `from_dict`."""
        return {
            "name": self.name,
            "argv": list(self.argv),
            "log_path": str(self.log_path),
            "env": dict(self.env),
            "cwd": None if self.cwd is None else str(self.cwd),
            "die_with_parent": self.die_with_parent,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ProcessSpec:
        """Inverse of `as_dict`. Raises KeyError or TypeError on a malformed mapping."""
        cwd = data.get("cwd")
        return cls(
            name=str(data["name"]),
            argv=tuple(str(a) for a in data["argv"]),
            log_path=Path(data["log_path"]),
            env={str(k): str(v) for k, v in dict(data.get("env", {})).items()},
            cwd=None if cwd is None else Path(cwd),
            die_with_parent=bool(data.get("die_with_parent", False)),
        )


@dataclasses.dataclass(frozen=True, slots=True)
class ProcessRecord:
    """Identity of a started process: its pid and the kernel's start time for that pid."""

    name: str
    pid: int
    """Also the id of its process group (it was started as a session leader)."""
    create_time: float
    """Start time as reported by psutil, seconds since the epoch (for people; a record without
    `start_ticks` also tells a recycled pid apart by it, within `CREATE_TIME_SLACK`)."""
    log_path: Path
    start_ticks: int = 0
    """The kernel's start time of the pid in clock ticks since boot (``/proc/<pid>/stat``
    field 22; 0: not recorded, as by an older version): what tells a recycled pid apart. It
    never moves, where psutil's `create_time` is derived from the wall clock's boot time and
    moved by a clock adjustment: a stack's live processes once all looked recycled, so they
    were started again beside themselves and never stopped."""

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form, read back by `from_dict`."""
        return {
            "name": self.name,
            "pid": self.pid,
            "create_time": self.create_time,
            "log_path": str(self.log_path),
            "start_ticks": self.start_ticks,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ProcessRecord:
        """Inverse of `as_dict`. Raises KeyError, TypeError or ValueError if malformed."""
        return cls(
            name=str(data["name"]),
            pid=int(data["pid"]),
            create_time=float(data["create_time"]),
            log_path=Path(data["log_path"]),
            start_ticks=int(data.get("start_ticks", 0)),
        )


CREATE_TIME_SLACK = 0.05
"""Seconds a record's `create_time` may differ from psutil's now and still be the same process
(records without `start_ticks` only)."""


def start_ticks(pid: int) -> int:
    """The kernel's start time of process `pid` in clock ticks since boot (``/proc/<pid>/stat``
    field 22). Raises ProcessLookupError when there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError) as err:
        raise ProcessLookupError(pid) from err
    # the command (field 2) is in parentheses and may hold spaces or parentheses itself
    fields = stat[stat.rindex(")") + 2 :].split()
    return int(fields[19])  # fields[0] is field 3 (state)


def record_of(name: str, pid: int, log_path: Path) -> ProcessRecord:
    """The record of the running process `pid` (its start time read now). Raises
    psutil.NoSuchProcess or ProcessLookupError when there is none."""
    return ProcessRecord(
        name, pid, psutil.Process(pid).create_time(), log_path, start_ticks=start_ticks(pid)
    )


class _State(enum.Enum):
    ALIVE = enum.auto()
    GONE = enum.auto()
    REUSED = enum.auto()


def start_process(spec: ProcessSpec) -> ProcessRecord:
    """Start `spec` as a new session (own process group), output appended to its log file.

    Returns its record at once; it does not wait for the program to be ready (see `probes`).
    Raises FileNotFoundError if the program does not exist, PermissionError if it is not
    executable.
    """
    spec.log_path.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, **spec.env}
    with spec.log_path.open("ab") as log:
        stamp = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
        log.write(f"--- agentrun: start {spec.name} at {stamp}: {' '.join(spec.argv)}\n".encode())
        log.flush()
        popen = subprocess.Popen(
            spec.argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=spec.cwd,
            start_new_session=True,
            preexec_fn=_die_with_parent_hook(os.getpid()) if spec.die_with_parent else None,
        )
    _CHILDREN[popen.pid] = popen
    return record_of(spec.name, popen.pid, spec.log_path)


def is_alive(record: ProcessRecord) -> bool:
    """Whether the recorded process still runs (a zombie or a recycled pid counts as dead)."""
    return _state(record) is _State.ALIVE


def stop_process(record: ProcessRecord, *, timeout: float = 10.0) -> StopOutcome:
    """SIGTERM the record's process group, then SIGKILL it if still alive after `timeout` s.

    Never signals a process whose pid was recycled. Raises RuntimeError if the process
    survives SIGKILL for 10 s (e.g. stuck in uninterruptible I/O).
    """
    settled = _settled(record)
    if settled is not None:
        return settled
    _signal_group(record, signal.SIGTERM)
    if _wait_gone(record, timeout=timeout):
        _signal_orphans(record)
        return StopOutcome.STOPPED
    return _kill_and_wait(record, outcome=StopOutcome.KILLED)


def kill_process(record: ProcessRecord) -> StopOutcome:
    """SIGKILL the record's process group at once (a crash, as tests need) and wait for it.

    Returns KILLED, NOT_RUNNING or PID_REUSED (then nothing was signalled). Raises
    RuntimeError if the process survives SIGKILL for 10 s.
    """
    settled = _settled(record)
    if settled is not None:
        return settled
    return _kill_and_wait(record, outcome=StopOutcome.KILLED)


def _settled(record: ProcessRecord) -> StopOutcome | None:
    """Why there is nothing to stop (PID_REUSED, or NOT_RUNNING after its orphans were
    signalled), or None when the recorded process is alive."""
    state = _state(record)
    if state is _State.REUSED:
        return StopOutcome.PID_REUSED
    if state is _State.GONE:
        _signal_orphans(record)
        return StopOutcome.NOT_RUNNING
    return None


def exit_code(record: ProcessRecord) -> int | None:
    """Exit status of a process this Python process started, once it exited; else None.

    Negative values are signals (``-9`` is SIGKILL), as in `subprocess`. Processes started by
    another invocation are not our children, so their status is unknown (None).
    """
    popen = _CHILDREN.get(record.pid)
    return None if popen is None else popen.poll()


def read_log_tail(path: Path, *, lines: int = 40) -> str:
    """Last `lines` lines of a log file as text ('' if it does not exist); for error messages."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return ""
    return "\n".join(data.decode(errors="replace").splitlines()[-lines:])


def _kill_and_wait(record: ProcessRecord, *, outcome: StopOutcome) -> StopOutcome:
    _signal_group(record, signal.SIGKILL)
    if not _wait_gone(record, timeout=10.0):
        raise RuntimeError(f"{record.name} (pid {record.pid}) survived SIGKILL for 10 s")
    _signal_orphans(record)
    return outcome


def _state(record: ProcessRecord) -> _State:
    popen = _CHILDREN.get(record.pid)
    if popen is not None and popen.poll() is not None:
        return _State.GONE
    try:
        proc = psutil.Process(record.pid)
        if record.start_ticks:
            if start_ticks(record.pid) != record.start_ticks:
                return _State.REUSED
        elif abs(proc.create_time() - record.create_time) > CREATE_TIME_SLACK:
            return _State.REUSED
        if proc.status() == psutil.STATUS_ZOMBIE:
            return _State.GONE
    except (psutil.NoSuchProcess, ProcessLookupError):
        return _State.GONE
    return _State.ALIVE


def _wait_gone(record: ProcessRecord, *, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while _state(record) is _State.ALIVE:
        if time.monotonic() >= deadline:
            return False
        time.sleep(_POLL_SECONDS)
    return True


def _signal_group(record: ProcessRecord, sig: signal.Signals) -> None:
    """Signal the group led by the record's pid (or just the pid if it left its group)."""
    with contextlib.suppress(ProcessLookupError):
        if os.getpgid(record.pid) == record.pid:
            os.killpg(record.pid, sig)
        else:
            os.kill(record.pid, sig)


def _signal_orphans(record: ProcessRecord) -> None:
    """SIGKILL what is left of the group after its leader exited.

    Safe: while any member of group N exists the kernel does not hand pid N to a new
    process, so a group with this id can only hold descendants of our process.
    """
    if _state(record) is _State.REUSED:
        return
    try:
        os.killpg(record.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        return
    _wait_group_dead(record.pid, timeout=5.0)


def _wait_group_dead(pgid: int, *, timeout: float) -> None:
    """Wait until every member of group `pgid` has died (exited or a zombie), at most
    `timeout` s: a SIGKILLed process can still show as running for a moment after
    ``killpg`` returns, and callers expect the group gone once stopping returns."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        living = []
        for proc in psutil.process_iter():
            with contextlib.suppress(psutil.Error, OSError):
                if os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE:
                    living.append(proc)
        if not living:
            return
        time.sleep(_POLL_SECONDS)


def _die_with_parent_hook(parent_pid: int) -> Callable[[], None] | None:
    """A preexec_fn that asks Linux to SIGKILL the child when its parent exits."""
    if not sys.platform.startswith("linux"):
        return None

    def hook() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent_pid:  # the parent died before prctl took effect
            os._exit(1)

    return hook


def run_captured(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None,
    input: str | None,
    timeout: float,
    error: type[subprocess.CalledProcessError] | None,
) -> subprocess.CompletedProcess[str]:
    """Run a command to completion in text mode, capturing stdout and stderr.

    ``error`` (a ``CalledProcessError`` subclass) is raised on a non-zero exit; ``None``
    returns the result whatever the exit status. Raises ``subprocess.TimeoutExpired`` when it
    runs longer than ``timeout`` seconds.
    """
    result = subprocess.run(
        list(argv),
        input=input,
        capture_output=True,
        text=True,
        env=None if env is None else dict(env),
        timeout=timeout,
        check=False,
    )
    if error is not None and result.returncode != 0:
        raise error(result.returncode, result.args, result.stdout, result.stderr)
    return result
