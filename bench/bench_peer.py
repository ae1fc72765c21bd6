"""The in-process peer: the OpenAI Agents SDK's ``Runner`` on the bench workload, against the
same scripted model server, with its CPU per turn read the way the stack's is.

The SDK runs in a virtualenv of its own (``peer/requirements.txt``, built once per machine
under the agentrun cache directory; never a dependency of agentrun), as ``peer/run_sdk.py``:
``--runs`` agents at once in its one process, tracing off, on the workload of
``harness.workload_scenario``: ``--turns`` turns of one ``calculate`` call, then a final
answer (``--turns`` + 1 model calls a run; each is a turn in the per-turn figures). The
scripted model is ``agentrun.testing.mockllm``, started with ``--no-strict-call-ids``: the SDK
echoes the model's call ids as given, which the strictest providers' id rule (on by default,
and met by agentrun's worker) would refuse; every other rule of ``agentrun.testing.strict``
still holds.

Measured: the peer process's and the model server's CPU seconds from ``/proc`` before the
batch starts and after its result line (their idle rate over ``--idle`` seconds subtracted,
as for the stack), the batch's wall time as the peer timed it, and the turns as the model
server counted them (checked against the workload and the peer's own count of tool calls: a
difference voids the figure).

    cd bench && ../.venv/bin/python bench_peer.py [--runs 100] [--turns 20]
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import platform
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import figures
import venvs
from harness import (
    cpu_seconds,
    cpu_used,
    idle_rates,
    mock_add_scenarios,
    mock_request_count,
    mock_reset,
    workload_scenario,
    write_result,
)

from agentrun_dev import components, stack

HERE = Path(__file__).parent
PEER = HERE / "peer"
REQUIREMENTS = PEER / "requirements.txt"
RUNNER = PEER / "run_sdk.py"


class PeerError(RuntimeError):
    """The peer did not run the workload as asked; the message says what it reported."""


def peer_python() -> Path:
    """The peer virtualenv's python, built on first use. Its directory is keyed by the
    requirements file and this Python's version, so a new pin gets a new virtualenv."""
    key = hashlib.sha256(REQUIREMENTS.read_bytes() + platform.python_version().encode())
    directory = venvs.cache_dir("peer", key.hexdigest()[:16])
    return venvs.ensure_venv(directory, installs=[["-r", str(REQUIREMENTS)]])


def _read_line(stream: IO[str], log: Path) -> dict[str, Any]:
    line = stream.readline()
    if not line:
        raise PeerError(f"the peer exited without answering; its log: {log}")
    record: dict[str, Any] = json.loads(line)
    if record.get("errors"):
        raise PeerError(f"the peer's runs failed: {record['errors']} (log: {log})")
    return record


def measure(
    *, runs: int, turns: int, idle: float = 3.0, warmup: int = 5, timeout: float = 900.0
) -> dict[str, Any]:
    """Run the peer once (killed after ``timeout`` seconds, when it reports nothing); its
    figures.

    Returns ``{"runs", "turns"`` (model calls), ``"tool_calls_per_run", "seconds",
    "turns_per_second", "cpu_ms_per_turn"`` (a
    ``figures.cpu_table`` of ``peer`` and the model server), ``"cpu_ms_per_turn_self"`` (the
    peer's own ``time.process_time``, a cross-check), ``"idle_cpu_percent", "versions"}``.
    Raises PeerError when a run failed or the turn counts disagree, and whatever building the
    virtualenv or starting the model server raises.
    """
    python = peer_python()
    workdir = Path(tempfile.mkdtemp(prefix="agentrun-bench-peer-"))
    launch = components.Launch(log_dir=workdir / "logs", die_with_parent=True)
    mock = stack.start_mockllm(
        [HERE / "scenarios.yaml"], launch=launch, name="mockllm-peer", strict_call_ids=False
    )
    log = workdir / "logs" / "peer.log"
    scenario, goal, document = workload_scenario(turns)
    try:
        base_url = stack.mockllm_url(mock)
        mock_add_scenarios(base_url, document)
        argv = [str(python), str(RUNNER), "--base-url", base_url, "--goal", goal]
        argv += ["--runs", str(runs), "--warmup", str(warmup), "--max-turns", str(turns + 5)]
        with log.open("w") as stderr, _started(argv, stderr, timeout=timeout) as peer:
            assert peer.stdin is not None and peer.stdout is not None
            ready = _read_line(peer.stdout, log)
            pids = {"peer": peer.pid, figures.MODEL_SERVER: mock.record.pid}
            rates = idle_rates(pids, idle)
            mock_reset(base_url)
            before, started = cpu_seconds(pids), time.monotonic()
            peer.stdin.write("go\n")
            peer.stdin.flush()
            done = _read_line(peer.stdout, log)
            used, window = cpu_used(before, cpu_seconds(pids)), time.monotonic() - started
        counted = mock_request_count(base_url, scenario=scenario)
    finally:
        components.stop_component(mock)
    problem = figures.workload_problem(
        runs=runs, turns=turns, model_calls=counted, tool_calls=done["tool_calls"]
    )
    if problem is not None:
        raise PeerError(f"the peer did not run the workload: {problem}")
    shutil.rmtree(workdir, ignore_errors=True)
    per_turn = figures.cpu_per_turn_ms(used, rates, seconds=window, turns=counted)
    return {
        "runs": runs,
        "turns": counted,
        "tool_calls_per_run": done["tool_calls"] / runs,
        "seconds": round(done["seconds"], 3),
        "turns_per_second": round(counted / done["seconds"], 1),
        "cpu_ms_per_turn": figures.cpu_table(per_turn),
        "cpu_ms_per_turn_self": round(done["cpu_seconds"] / counted * 1000, 3),
        "idle_cpu_percent": {k: round(v * 100, 2) for k, v in rates.items()},
        "versions": ready["versions"],
    }


@contextlib.contextmanager
def _started(
    argv: list[str], stderr: IO[str], *, timeout: float
) -> Iterator[subprocess.Popen[str]]:
    """The peer process, piped; killed by its pid after ``timeout`` seconds (its pipe then
    ends, so a read waiting on it returns), else stopped on the way out (stdin closed first,
    so it exits by itself; then SIGTERM, then SIGKILL)."""
    peer = subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, text=True
    )
    watchdog = threading.Timer(timeout, peer.kill)
    watchdog.start()
    try:
        yield peer
    finally:
        watchdog.cancel()
        with contextlib.suppress(OSError):
            assert peer.stdin is not None
            peer.stdin.close()
        try:
            peer.wait(timeout=10)
        except subprocess.TimeoutExpired:
            peer.terminate()
            try:
                peer.wait(timeout=10)
            except subprocess.TimeoutExpired:
                peer.kill()
                peer.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--idle", type=float, default=3.0)
    args = parser.parse_args()
    write_result("peer", measure(runs=args.runs, turns=args.turns, idle=args.idle))


if __name__ == "__main__":
    main()
