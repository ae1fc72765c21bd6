"""Processes are started in their own group and stopped, killed and checked by pid."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from agentrun_dev import procs

IGNORES_SIGTERM = textwrap.dedent(
    """
    import signal, sys, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    print("ready", flush=True)
    time.sleep(60)
    """
)


def spec(tmp_path: Path, *argv: str, name: str = "subject") -> procs.ProcessSpec:
    return procs.ProcessSpec(
        name=name, argv=argv, log_path=tmp_path / f"{name}.log", die_with_parent=True
    )


def wait_for_log(path: Path, line: str, *, timeout: float = 10) -> None:
    """Wait until `line` is a whole line of the log (the header echoes argv, so not a substring)."""
    deadline = time.monotonic() + timeout
    while line not in procs.read_log_tail(path).splitlines():
        assert time.monotonic() < deadline, f"{line!r} never appeared in {path}"
        time.sleep(0.05)


def test_a_started_process_runs_in_its_own_process_group(tmp_path: Path) -> None:
    record = procs.start_process(spec(tmp_path, "sleep", "60"))
    try:
        assert procs.is_alive(record)
        assert os.getpgid(record.pid) == record.pid
        assert os.getsid(record.pid) == record.pid
    finally:
        procs.kill_process(record)


def test_stop_ends_a_process_with_sigterm(tmp_path: Path) -> None:
    record = procs.start_process(spec(tmp_path, "sleep", "60"))

    assert procs.stop_process(record) is procs.StopOutcome.STOPPED
    assert not procs.is_alive(record)
    assert procs.exit_code(record) == -15


def test_stop_escalates_to_sigkill_after_the_timeout(tmp_path: Path) -> None:
    record = procs.start_process(spec(tmp_path, sys.executable, "-c", IGNORES_SIGTERM))
    wait_for_log(record.log_path, "ready")

    started = time.monotonic()
    assert procs.stop_process(record, timeout=0.5) is procs.StopOutcome.KILLED
    assert time.monotonic() - started < 5
    assert procs.exit_code(record) == -9


def test_kill_sends_sigkill_at_once(tmp_path: Path) -> None:
    record = procs.start_process(spec(tmp_path, sys.executable, "-c", IGNORES_SIGTERM))
    wait_for_log(record.log_path, "ready")

    assert procs.kill_process(record) is procs.StopOutcome.KILLED
    assert procs.exit_code(record) == -9


def test_stopping_takes_the_children_of_the_process_along(tmp_path: Path) -> None:
    record = procs.start_process(spec(tmp_path, "sh", "-c", "sleep 60 & sleep 60 & wait"))
    deadline = time.monotonic() + 10
    while len(children := psutil.Process(record.pid).children()) < 2:
        assert time.monotonic() < deadline
        time.sleep(0.05)

    procs.stop_process(record)

    assert not any(child.is_running() and child.status() != "zombie" for child in children)


def test_stopping_an_exited_process_reports_not_running(tmp_path: Path) -> None:
    record = procs.start_process(spec(tmp_path, "true"))
    deadline = time.monotonic() + 10
    while procs.is_alive(record):
        assert time.monotonic() < deadline
        time.sleep(0.05)

    assert procs.stop_process(record) is procs.StopOutcome.NOT_RUNNING
    assert procs.exit_code(record) == 0


def test_a_recycled_pid_is_neither_alive_nor_signalled() -> None:
    me = psutil.Process()
    stale = procs.ProcessRecord(
        name="stale", pid=me.pid, create_time=me.create_time() - 1000, log_path=Path("x")
    )

    assert not procs.is_alive(stale)
    assert procs.stop_process(stale) is procs.StopOutcome.PID_REUSED
    assert procs.kill_process(stale) is procs.StopOutcome.PID_REUSED


def test_a_recycled_pid_is_told_apart_by_its_start_ticks() -> None:
    me = psutil.Process()
    record = procs.record_of("me", me.pid, Path("x"))
    assert record.start_ticks > 0 and procs.is_alive(record)
    stale = dataclasses.replace(record, start_ticks=record.start_ticks - 1)

    assert not procs.is_alive(stale)
    assert procs.stop_process(stale) is procs.StopOutcome.PID_REUSED


def test_a_wall_clock_adjustment_does_not_make_a_live_process_look_recycled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """psutil derives a process's create time from the boot time the kernel computes from the
    wall clock, which an adjustment moves (on this kind of machine, in CI: every process of a
    stack looked recycled, was started again beside itself and never stopped). The record's
    start ticks since boot do not move."""
    record = procs.start_process(spec(tmp_path, "sleep", "60"))
    # a record written before start ticks were: judged by its create time, as all were
    old = procs.ProcessRecord.from_dict(
        {k: v for k, v in record.as_dict().items() if k != "start_ticks"}
    )
    try:
        assert old.start_ticks == 0 and procs.is_alive(old)
        created = psutil.Process.create_time
        monkeypatch.setattr(psutil.Process, "create_time", lambda p: created(p) + 2.5)
        assert not procs.is_alive(old)  # the failure: alive, taken for a recycled pid
        assert procs.is_alive(record)
        assert procs.stop_process(record) is procs.StopOutcome.STOPPED
    finally:
        monkeypatch.undo()
        procs.kill_process(record)


def test_start_ticks_of_no_process_raises() -> None:
    with pytest.raises(ProcessLookupError):
        procs.start_ticks(2**22 + 1)  # above the kernel's largest pid


def test_another_process_can_stop_it_from_the_record(tmp_path: Path) -> None:
    record = procs.start_process(spec(tmp_path, "sleep", "60"))
    as_json = json.dumps(json.dumps(record.as_dict()))
    stopper = textwrap.dedent(
        f"""
        import json
        from agentrun_dev import procs
        record = procs.ProcessRecord.from_dict(json.loads({as_json}))
        print(procs.is_alive(record), procs.stop_process(record).value)
        """
    )

    result = subprocess.run(
        [sys.executable, "-c", stopper], capture_output=True, text=True, check=True, timeout=30
    )

    assert result.stdout.split() == ["True", "stopped"]
    assert not procs.is_alive(record)


def test_the_log_gets_a_header_and_both_output_streams(tmp_path: Path) -> None:
    record = procs.start_process(spec(tmp_path, "sh", "-c", "echo out; echo err >&2"))
    wait_for_log(record.log_path, "err")
    wait_for_log(record.log_path, "out")

    lines = procs.read_log_tail(record.log_path).splitlines()
    assert lines[0].startswith("--- agentrun: start subject at ")
    assert sorted(lines[1:]) == ["err", "out"]


@pytest.mark.parametrize("die_with_parent", [True, False], ids=["dies", "outlives"])
def test_die_with_parent_decides_whether_a_process_outlives_its_starter(
    tmp_path: Path, die_with_parent: bool
) -> None:
    starter = textwrap.dedent(
        f"""
        import json, os
        from pathlib import Path
        from agentrun_dev import procs
        record = procs.start_process(procs.ProcessSpec(
            name="orphan", argv=("sleep", "60"), log_path=Path({str(tmp_path / "o.log")!r}),
            die_with_parent={die_with_parent!r}))
        print(json.dumps(record.as_dict()), flush=True)
        os._exit(0)
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", starter], capture_output=True, text=True, check=True, timeout=30
    )
    record = procs.ProcessRecord.from_dict(json.loads(result.stdout))
    try:
        deadline = time.monotonic() + 5
        while procs.is_alive(record) and die_with_parent:
            assert time.monotonic() < deadline, "the child outlived its parent"
            time.sleep(0.05)
        assert procs.is_alive(record) is not die_with_parent
    finally:
        procs.stop_process(record)


def test_a_missing_program_raises_file_not_found(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        procs.start_process(spec(tmp_path, str(tmp_path / "no-such-program")))


@pytest.mark.parametrize(
    "record",
    [
        procs.ProcessSpec(name="a", argv=("x", "-y"), log_path=Path("/l"), env={"K": "V"}),
        procs.ProcessRecord(name="a", pid=12, create_time=1.5, log_path=Path("/l")),
    ],
    ids=["spec", "record"],
)
def test_specs_and_records_survive_a_json_round_trip(
    record: procs.ProcessSpec | procs.ProcessRecord,
) -> None:
    assert type(record).from_dict(json.loads(json.dumps(record.as_dict()))) == record
