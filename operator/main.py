"""Process wiring of ``agentrun-operator``: probes, the CRD check, the leader Lease, then kopf.

Order at start-up: serve ``/healthz`` and ``/readyz`` (``AGENTRUN_HEALTH_PORT``); wait until
the installed CRDs serve what this operator writes (not ready until then, touching nothing);
wait for the leader Lease (a standby stops here); then run kopf, whose start-up handler starts
every other part (event consumer, queue pumps, ledger sweep). So a standby runs no handler, no
consumer and no loop. The leader renews its Lease from a thread of its own (its own event loop
and API client), so no work on the operator's loop delays a renewal; a leader that cannot
renew its Lease exits at once (status 70), from that thread, without flushing anything: the
next leader rebuilds its view from the run event streams. A graceful
stop (SIGTERM) ends kopf, then releases the Lease so a standby takes over at once.

With ``AGENTRUN_OPERATOR_SHARDS`` > 1 the one Lease becomes one per shard (``_run_sharded``):
the process takes a membership slot, then a fair share of the shard Leases (each renewed by a
thread of its own, exiting with status 70 when one cannot be renewed), and runs kopf for the
shards it holds (``platform.shards.Ownership`` in the memo); kopf is stopped and started again
whenever that set changes (a shard taken over, or given up to a process that joined, after kopf
stopped), its start-up recovering the runs of every shard held.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable, Iterable

import kopf

from agentrun import metrics, process, trust
from agentrun.settings import OperatorSettings

from . import crdcheck, handlers, wiring
from .platform import health, leadership
from .platform.kubeapi import Kube
from .platform.shardleases import LeaseSite, ShardLeases
from .platform.shards import Ownership, lease_name

log = logging.getLogger(__name__)

LOST_LEADERSHIP_EXIT = 70
"""Exit status of a leader that lost its Lease (EX_SOFTWARE): its supervisor restarts it."""


def main() -> None:
    """Console script ``agentrun-operator``: watch AgentRuns in every namespace.

    kopf installs its own SIGTERM/SIGINT handling (a graceful stop of every handler) once this
    process leads; before that, a stop signal ends the process at once.
    """
    config = process.start(OperatorSettings, service="agentrun-operator")
    # the run-signing keys are read before anything else: no operator runs without them
    trust.signing_file(config.signing_path())
    trust.trust_file(config.trust_path())
    metrics.export_operator()  # agentrun_operator_leader 0 until it leads
    metrics.export_store_limit(config.jetstream_store_bytes)
    assert handlers.REGISTERED  # the import registers the handlers with kopf
    process.run(run(config))


def identity(settings: OperatorSettings) -> str:
    """This process's name in the Lease: ``AGENTRUN_IDENTITY``, else ``<hostname>-<pid>``."""
    return settings.identity or f"{socket.gethostname()}-{os.getpid()}"


async def run(settings: OperatorSettings) -> None:
    """Probes, CRD check, leader election, kopf; returns after a graceful stop."""
    probes = health.Health()
    server = None
    if settings.health_port:
        server = await health.serve(probes, host=settings.metrics_addr, port=settings.health_port)
    current = asyncio.current_task()
    assert current is not None
    process.stop_on_signals(functools.partial(_cancel, current))  # kopf's replaces it
    api = await Kube.connect()
    try:
        await crdcheck.wait_until_served(
            api, interval=settings.crd_check_interval, on_ready=probes.set_ready, clock=time.time
        )
        if settings.operator_shards > 1:
            await _run_sharded(settings, api, probes)
            return
        elector = leadership.LeaderElector(
            leadership.KubeLeases(
                api, namespace=settings.lease_namespace, name=settings.lease_name
            ),
            identity=identity(settings),
            timing=leadership.LeaseTiming(
                settings.lease_duration, settings.lease_renew_deadline, settings.lease_retry
            ),
        )
        await elector.acquire()
        probes.role = "leader"
        metrics.lead()
        await _lead(settings, elector)
    except asyncio.CancelledError:
        log.info("stopped before leading")
    finally:
        await api.close()
        if server is not None:
            server.close()


def _cancel(task: asyncio.Task[None]) -> None:
    """Cancel ``task`` (the stop while kopf is not running); a second signal is only logged,
    so that it does not cut the clean-up short (the Leases given up)."""
    process.stop_on_signals(_already_stopping)
    task.cancel()


def _already_stopping() -> None:
    log.info("stop signal: already stopping (giving the shards up)")


async def _lead(settings: OperatorSettings, elector: leadership.LeaderElector) -> None:
    """Run kopf while a thread of its own renews the Lease (``leadership.RenewalThread``: the
    admission of a burst of runs on this event loop cannot starve the renewals)."""

    renewals = leadership.RenewalThread(
        elector, connect=_connector(settings, settings.lease_name), on_lost=_exit_lost
    )
    await asyncio.to_thread(renewals.start)
    memo = wiring.OperatorMemo(settings)
    try:
        await kopf.operator(clusterwide=True, standalone=True, memo=memo)
    finally:  # kopf stopped (a graceful stop, or its own failure): renewals end, Lease given up
        await asyncio.to_thread(renewals.stop)


def _connector(settings: OperatorSettings, name: str) -> leadership.Connect:
    """Opens Lease ``name``'s store over an API client of its own (a renewal thread's)."""

    async def connect() -> tuple[leadership.LeaseStore, Callable[[], Awaitable[None]]]:
        api = await Kube.connect()
        leases = leadership.KubeLeases(api, namespace=settings.lease_namespace, name=name)
        return leases, api.close

    return connect


def _exit_lost() -> None:
    """Leadership lost (called from the renewal thread): exit at once, flushing nothing, so
    that only the new leader acts."""
    log.critical("lost the leader Lease; exiting so that only the new leader acts")
    logging.shutdown()
    os._exit(LOST_LEADERSHIP_EXIT)


# --- shards (AGENTRUN_OPERATOR_SHARDS > 1) ----------------------------------------------------


class _Held:
    """The shard Leases this process holds, each renewed by a thread of its own."""

    def __init__(self, settings: OperatorSettings, leases: ShardLeases) -> None:
        self.settings = settings
        self.leases = leases
        self.threads: dict[int, leadership.RenewalThread] = {}
        self.stopping = asyncio.Event()
        """Set by a stop signal: nothing more is taken, and kopf is not started again."""

    @property
    def owned(self) -> frozenset[int]:
        """The shards held."""
        return frozenset(self.threads)

    async def take(self, shards: Iterable[int]) -> list[int]:
        """Try each of ``shards``; start renewing those won (and announce them)."""
        won = []
        for shard in shards:
            before = self.leases.holder_seen(shard)
            if not await self.leases.take(shard):
                continue
            name = lease_name(self.settings.lease_name, shard, self.leases.shards)
            thread = leadership.RenewalThread(
                self.leases.handed_over(shard),
                connect=_connector(self.settings, name),
                on_lost=_exit_lost,
            )
            self.threads[shard] = thread  # before it starts: a stop meanwhile still stops it
            await asyncio.to_thread(thread.start)
            won.append(shard)
            log.info("took operator shard %d (Lease %s, was %r)", shard, name, before)
            await self.leases.announce(shard, before=before)
        metrics.own_shards(self.owned)
        return won

    async def give(self, shards: Iterable[int]) -> None:
        """Stop renewing ``shards`` and release their Leases (their work has stopped)."""
        given = [s for s in shards if s in self.threads]
        for shard in given:
            await asyncio.to_thread(self.threads.pop(shard).stop)
            log.info("gave operator shard %d up", shard)
        metrics.own_shards(self.owned, given_up=given)


async def _run_sharded(settings: OperatorSettings, api: Kube, probes: health.Health) -> None:
    """Hold a fair share of the shard Leases and run kopf for the shards held; restart it
    (its start-up recovers the runs of every shard held, exactly as a new leader does) each
    time the share changes: a shard taken over, or given up to a process that joined. Returns
    after a graceful stop (every Lease released)."""
    shards = settings.operator_shards
    leases = ShardLeases(
        api,
        LeaseSite(settings.lease_namespace, settings.lease_name, shards),
        identity=identity(settings),
        timing=_timing(settings),
    )
    slot, slot_name = await leases.join()
    membership = leadership.RenewalThread(
        slot, connect=_connector(settings, slot_name), on_lost=_exit_lost
    )
    await asyncio.to_thread(membership.start)
    held = _Held(settings, leases)
    try:
        await asyncio.sleep(settings.lease_retry)  # processes started together see each other
        while True:
            survey = await leases.survey(held.owned)
            await held.give(survey.give)
            await held.take(survey.take)
            if not held.owned:
                await asyncio.sleep(settings.lease_retry)
                continue
            probes.role = "leader"
            metrics.lead()
            if not await _serve(settings, held):
                return
    finally:
        await held.give(list(held.owned))
        for shard in await leases.release_named():
            log.info("released the Lease of shard %d, taken as the stop came", shard)
        await asyncio.to_thread(membership.stop)


async def _serve(settings: OperatorSettings, held: _Held) -> bool:
    """Run kopf for the shards ``held`` until the share changes (True: serve again) or kopf
    stops otherwise (False: a stop signal, or kopf's own failure). Shards beyond the share
    are given up only after kopf stopped (its handlers finished, every loop stopped).

    Once the start-up handler finished, a stop signal goes to ``held.stopping``
    (``OperatorMemo.on_stop_signal``) rather than to kopf's own handler: kopf's drops a signal
    that comes while it stops for a new share, and the process would serve again. Until then
    the share does not change, so kopf's own stop (a signal during start-up) ends it."""
    owned = held.owned
    stop_flag = asyncio.Event()
    handed_over = asyncio.Event()
    change = asyncio.create_task(
        _await_change(held, stop_flag, after=handed_over), name="shard-plan"
    )

    def stop_for_good() -> None:
        log.info("stop signal: stopping kopf, then giving every shard up")
        held.stopping.set()
        stop_flag.set()

    memo = wiring.OperatorMemo(
        settings,
        ownership=Ownership(settings.operator_shards, owned),
        on_stop_signal=stop_for_good,
        signals_handed_over=handed_over,
    )
    log.info("serving operator shards %s", sorted(owned))
    process.stop_on_signals(stop_for_good)  # until kopf installs its own, as it starts
    try:
        await kopf.operator(clusterwide=True, standalone=True, memo=memo, stop_flag=stop_flag)
    finally:
        change.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await change
    if held.stopping.is_set() or not stop_flag.is_set():
        process.stop_on_signals(_already_stopping)  # the clean-up is not cut short
        return False
    current = asyncio.current_task()
    assert current is not None
    process.stop_on_signals(functools.partial(_cancel, current))  # kopf's are gone
    survey = await held.leases.survey(held.owned)
    await held.give(survey.give)
    return True


async def _await_change(held: _Held, stop_flag: asyncio.Event, *, after: asyncio.Event) -> None:
    """Once ``after`` is set (kopf's start-up finished), every ``retry`` seconds: take free
    shards up to the fair share, or notice shards held beyond it; then set ``stop_flag``
    (kopf stops, and is started again for the new share). Takes nothing once the process is
    stopping (``held.stopping``)."""
    retry = held.leases.timing.retry
    await after.wait()
    while True:
        await asyncio.sleep(retry)
        if held.stopping.is_set() or stop_flag.is_set():
            return
        try:
            survey = await held.leases.survey(held.owned)
            changed = bool(survey.give) or bool(await held.take(survey.take))
        except Exception:  # one failed look must not end the rebalancing: look again
            log.exception("could not survey the shard Leases")
            continue
        if changed:
            stop_flag.set()
            return


def _timing(settings: OperatorSettings) -> leadership.LeaseTiming:
    return leadership.LeaseTiming(
        settings.lease_duration, settings.lease_renew_deadline, settings.lease_retry
    )
