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
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable

import kopf

from agentrun import metrics, process, trust
from agentrun.settings import OperatorSettings

from . import crdcheck, handlers, wiring
from .platform import health, leadership
from .platform.kubeapi import Kube

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
    task.cancel()


async def _lead(settings: OperatorSettings, elector: leadership.LeaderElector) -> None:
    """Run kopf while a thread of its own renews the Lease (``leadership.RenewalThread``: the
    admission of a burst of runs on this event loop cannot starve the renewals)."""

    async def connect() -> tuple[leadership.LeaseStore, Callable[[], Awaitable[None]]]:
        api = await Kube.connect()
        leases = leadership.KubeLeases(
            api, namespace=settings.lease_namespace, name=settings.lease_name
        )
        return leases, api.close

    renewals = leadership.RenewalThread(elector, connect=connect, on_lost=_exit_lost)
    await asyncio.to_thread(renewals.start)
    memo = wiring.OperatorMemo(settings)
    try:
        await kopf.operator(clusterwide=True, standalone=True, memo=memo)
    finally:  # kopf stopped (a graceful stop, or its own failure): renewals end, Lease given up
        await asyncio.to_thread(renewals.stop)


def _exit_lost() -> None:
    """Leadership lost (called from the renewal thread): exit at once, flushing nothing, so
    that only the new leader acts."""
    log.critical("lost the leader Lease; exiting so that only the new leader acts")
    logging.shutdown()
    os._exit(LOST_LEADERSHIP_EXIT)
