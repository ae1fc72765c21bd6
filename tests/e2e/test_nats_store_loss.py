"""Losing the whole NATS store, as an on-call engineer meets it (docs/operations.md, "Disaster
recovery"): nats-server stopped, its entire JetStream store directory deleted, started again.

- Without a backup, and without any manual step: the operator notices that the store it
  started on is gone (``platform.storewatch``), logs it once and exits; started again (the e2e
  stack does not supervise: ``restart_dead`` starts what exited, as the operator's Deployment
  does), it makes every stream and bucket again; a run that was running ends
  ``checkpoint_failed`` with the rerun hint and the model is not asked for it again; finished
  runs keep their status; the tenant's usage is rebuilt from the runs; a new run completes on
  the workers that were never restarted.
- nats-server stopped and started with its store intact (a transient outage): the operator
  does not exit and a run in flight completes.
- With a backup (``nats backup stream`` of AGENTRUN_EVENTS and the two KV buckets, taken with
  the operator and the workers stopped while a run is in flight, then ``nats backup restore
  stream`` after the wipe, before they start): the run resumes from its checkpoint and
  completes, no committed turn asked of the model twice, the tenant's usage the runs' sum.

The ``nats`` commands are those docs/operations.md gives, run with the pinned natscli (the
binary the NATS image ships) and the operator's NATS identity, as the chart's runbooks do."""

from __future__ import annotations

import concurrent.futures
import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentrun.natsauth.permissions import Role, inbox_prefix
from agentrun.operator.platform import storewatch
from agentrun_dev import components, stack
from agentrun_dev.natsserver import NatsServer

from .conftest import ORPHAN_AFTER, E2EStack, run_manifest, wait_consuming
from .events import read_book, read_events, turn_numbers
from .test_tenants import day_tenant, list_runs, wait_tenant

pytestmark = pytest.mark.e2e

RERUN = "agentrun.dev/rerun"
BACKED_UP = ("AGENTRUN_EVENTS", "KV_AGENTRUN_LEDGER", "KV_AGENTRUN_EFFECTS")
"""The streams docs/operations.md says to back up (AGENTRUN_TURNS holds nothing durable)."""
GONE = "the NATS store this operator started on is gone"
"""The operator's one ERROR when it notices the store lost (``storewatch.exit_store_lost``)."""
NOTICED_WITHIN = 30.0
"""Seconds the operator may take to notice the store lost and exit: its bound is about two
probes (``storewatch.WATCH_SECONDS`` apart, each at most ``storewatch.PROBE_SECONDS``), with a
wide margin for a busy machine."""
KEPT = ("phase", "terminalReason", "answer", "usage", "completionTime", "message")
"""What a finished run's status must still show after the store is lost."""


@pytest.fixture
def team(stack_: E2EStack, test_namespace: str) -> Iterator[str]:
    """An AgentTenant of ``test_namespace`` alone (24h windows), so its usage is these runs'."""
    with day_tenant(stack_, f"dr-{test_namespace}", test_namespace, outlive=120) as name:
        yield name


def requests_for(stack_: E2EStack, goal: str) -> int:
    """How many requests the scripted model got for the run with ``goal``."""
    return sum(goal in json.dumps(r["body"]) for r in stack_.mock_requests())


def wait_asked(stack_: E2EStack, goal: str, calls: int, *, timeout: float = 60.0) -> None:
    """Wait until the scripted model got ``calls`` requests for the run with ``goal`` (the
    turns before the last committed, the last one in flight): the model's log sees a turn at
    once, the status only when the operator writes it, which on a loaded machine was after
    the run had ended (an E2E-LONG run takes about 5 s)."""
    end = time.monotonic() + timeout
    while (asked := requests_for(stack_, goal)) < calls:
        assert time.monotonic() < end, f"the model was asked {asked} times in {timeout} s"
        time.sleep(0.1)


def used_tokens(status: dict[str, Any]) -> int:
    return int(((status.get("budget") or {}).get("tokens") or {}).get("used") or 0)


def nats(cli: Path, server: NatsServer, *args: str, identity: str = "operator") -> str:
    """The pinned ``nats`` CLI `cli` (``natscli_binary``) against `server` with `identity`'s
    credentials (the operator's, as docs/operations.md has it, with its inbox prefix;
    ``admin``: the dev server's account-wide user, for what no agentrun identity may do, such
    as listing streams); its output. Raises CalledProcessError (with the output) when it fails."""
    assert server.auth_dir is not None
    argv = [str(cli), "--server", server.url]
    argv += ["--creds", str(server.auth_dir / f"{identity}.creds")]
    argv += ["--tlsca", str(server.auth_dir / "ca.crt"), "--no-context"]
    if identity == "operator":
        argv += ["--inbox-prefix", inbox_prefix(Role.OPERATOR)]
    argv += args
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    if done.returncode != 0:
        raise subprocess.CalledProcessError(done.returncode, argv, done.stdout, done.stderr)
    return done.stdout


def log_from(component: components.Component, offset: int) -> str:
    """`component`'s log from byte `offset` on (its size before what the test does)."""
    with component.spec.log_path.open("rb") as log:
        log.seek(offset)
        return log.read().decode(errors="replace")


def wait_exited(component: components.Component, *, timeout: float) -> None:
    """Wait until `component`'s process has ended; AssertionError after `timeout` seconds."""
    end = time.monotonic() + timeout
    while component.is_alive():
        assert time.monotonic() < end, f"{component.name} still runs after {timeout}s"
        time.sleep(0.2)


def stop_agentrun(stack_: E2EStack) -> None:
    """Scale the operator and the workers to 0, as scaling both Deployments does: SIGTERM to
    all at once, the workers draining their turns. (One after the other, the workers still
    running took the run's next turns while the first stopped.)"""
    parts = [*stack_.workers, stack_.operator]
    with concurrent.futures.ThreadPoolExecutor(len(parts)) as pool:
        list(pool.map(lambda part: components.stop_component(part, timeout=20), parts))


def test_a_wiped_store_ends_running_runs_keeps_finished_ones_and_rebuilds_usage(
    stack_: E2EStack,
    test_namespace: str,
    team: str,
    nats_server: NatsServer,
    natscli_binary: Path,
) -> None:
    ns = test_namespace
    stack_.apply(ns, run_manifest("finished", f"E2E-LONG job (done before the wipe) {ns}"))
    finished = stack_.wait_terminal(ns, "finished", timeout=60)
    assert finished["terminalReason"] == "completed"
    goal = f"E2E-LONG job (running at the wipe) {ns}"
    stack_.apply(ns, run_manifest("running", goal))
    wait_asked(stack_, goal, 2)

    operator = stack_.operator
    logged = operator.spec.log_path.stat().st_size
    workers = [worker.record.pid for worker in stack_.workers]
    nats_server.restart(wipe_store=True)
    wiped = time.monotonic()
    # no manual step: the operator exits by itself, once
    wait_exited(operator, timeout=NOTICED_WITHIN)
    noticed = time.monotonic() - wiped
    said = log_from(operator, logged)
    assert said.count(GONE) == 1, said[-3000:]
    assert "KV_AGENTRUN_LEDGER" in said.split(GONE)[1].splitlines()[0]
    # the e2e stack does not supervise: starting what exited is what the Deployment does
    stack_.restart_dead()
    assert [worker.record.pid for worker in stack_.workers] == workers  # never restarted

    status = stack_.wait_terminal(ns, "running", timeout=60)
    assert status["terminalReason"] == "checkpoint_failed", status
    assert status["message"].startswith("not resumed: this run was admitted before")
    assert f"kubectl annotate agentrun running -n {ns} {RERUN}=true" in status["message"]
    asked = requests_for(stack_, goal)
    assert set(
        nats(natscli_binary, nats_server, "stream", "ls", "--names", identity="admin").split()
    ) >= {
        "AGENTRUN_EVENTS",
        "AGENTRUN_TURNS",
        "KV_AGENTRUN_LEDGER",
        "KV_AGENTRUN_EFFECTS",
    }
    kept = stack_.get(ns, "finished")["status"]  # type: ignore[index]
    assert [kept[k] for k in KEPT] == [finished[k] for k in KEPT]

    runs = list_runs(stack_, ns)
    recorded = sum(int((s.get("usage") or {}).get("totalTokens") or 0) for s in runs.values())
    rebuilt = wait_tenant(stack_, team, lambda s: used_tokens(s) >= recorded, timeout=20)
    book = read_book(nats_server, team)
    assert book is not None and book.used_tokens >= recorded > 0, rebuilt

    stack_.apply(ns, run_manifest("after", f"E2E-LONG job (after the wipe) {ns}"))
    assert stack_.wait_terminal(ns, "after", timeout=40)["terminalReason"] == "completed"
    time.sleep(2 * ORPHAN_AFTER)  # a turn of the lost run dispatched again would be asked now
    assert requests_for(stack_, goal) == asked
    assert read_events(nats_server, ns, "running") == []
    assert noticed < NOTICED_WITHIN


def test_a_nats_restart_with_its_store_intact_is_not_taken_for_a_lost_store(
    stack_: E2EStack, test_namespace: str, nats_server: NatsServer
) -> None:
    ns = test_namespace
    goal = f"E2E-LONG job (through a NATS restart) {ns}"
    stack_.apply(ns, run_manifest("through", goal))
    wait_asked(stack_, goal, 2)
    operator = stack_.operator
    logged = operator.spec.log_path.stat().st_size

    nats_server.restart()
    # several times what noticing a lost store takes (two probes, WATCH_SECONDS apart)
    time.sleep(5 * storewatch.WATCH_SECONDS)
    assert operator.is_alive(), log_from(operator, logged)[-3000:]
    status = stack_.wait_terminal(ns, "through", timeout=60)
    assert (status["terminalReason"], status["usage"]["steps"]) == ("completed", 5), status
    assert operator.is_alive() and GONE not in log_from(operator, logged)


def test_a_store_restored_from_stream_backups_resumes_runs_without_paying_twice(
    stack_: E2EStack,
    test_namespace: str,
    team: str,
    nats_server: NatsServer,
    tmp_path: Path,
    natscli_binary: Path,
) -> None:
    ns = test_namespace
    goal = f"E2E-LONG job (in flight at the backup) {ns}"
    stack_.apply(ns, run_manifest("inflight", goal))
    wait_asked(stack_, goal, 2)

    # docs/operations.md, "Backing up and restoring NATS", in its order
    stop_agentrun(stack_)
    for stream in BACKED_UP:
        nats(
            natscli_binary,
            nats_server,
            "backup",
            "stream",
            stream,
            str(tmp_path / stream),
            "--no-progress",
        )
    committed = turn_numbers(read_events(nats_server, ns, "inflight"))
    assert 2 <= len(committed) < 5 and requests_for(stack_, goal) == len(committed)

    nats_server.restart(wipe_store=True)
    for stream in BACKED_UP:
        nats(
            natscli_binary,
            nats_server,
            "backup",
            "restore",
            "stream",
            str(tmp_path / stream),
            "--no-progress",
        )
    assert turn_numbers(read_events(nats_server, ns, "inflight")) == committed
    stack_.operator = stack.start_operator(stack_.env, launch=stack_.launch)
    stack_.workers = [stack.start_worker(i, env=stack_.env, launch=stack_.launch) for i in (1, 2)]
    for worker in stack_.workers:
        wait_consuming(worker)

    status = stack_.wait_terminal(ns, "inflight", timeout=40)
    assert (status["terminalReason"], status["usage"]["steps"]) == ("completed", 5), status
    assert turn_numbers(read_events(nats_server, ns, "inflight")) == [0, 1, 2, 3, 4]
    assert requests_for(stack_, goal) == 5  # each turn asked once: none committed paid twice
    total = int(status["usage"]["totalTokens"])
    settled = wait_tenant(
        stack_, team, lambda s: s.get("activeRuns") == 0 and used_tokens(s) == total, timeout=20
    )
    book = read_book(nats_server, team)
    assert book is not None and book.used_tokens == total, settled
