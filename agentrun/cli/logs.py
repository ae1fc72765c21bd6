"""``kubectl agentrun logs``: a run's trajectory, read from its events and printed.

The events are read through the trajectory API with the kubeconfig alone (``trajectoryapi``);
where the cluster does not serve that API, from NATS JetStream directly (``bus``), with the
URL ``kubectl`` resolved and the credentials and CA of ``--nats-creds`` and ``--nats-ca`` (else
``AGENTRUN_NATS_CREDS_FILE``, ``AGENTRUN_NATS_CA_FILE``). ``-f`` prints each event as it
commits until the run ends, or notices from the run's status an end without events.

What belongs here: reading and printing the events of one run. What does not: the parser and
the other commands (``kubectl``), the lines of an event (``trajectory``). ``kubectl`` imports
this module only when ``logs`` runs: NATS and the event model are this command's alone.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import nats.errors

from agentrun import bus, display, kernel, natsclient
from agentrun.cli import control, kubeflags, trajectory, trajectoryapi
from agentrun.protocol import RunEvent

STATUS_POLL_SECONDS = 2.0
"""How often ``logs -f`` re-reads the run's status while no event comes (a run that ends
without events — cancelled while queued, rejected — or is deleted ends the follow)."""


def _print_event(event: RunEvent, *, output: str) -> None:
    if output == "json":
        record = json.loads(event.encode())
        print(json.dumps({"seq": event.seq, **record}), flush=True)
        return
    for line in trajectory.event_lines(event):
        print(line, flush=True)


def _status_end(name: str, status: dict[str, Any]) -> str:
    line = (
        f"end   {status.get('phase')} {status.get('terminalReason')} "
        f"({status.get('outcome', 'partial')}) before admission: {status.get('message', '')}"
    ).rstrip()
    return display.printable(line, newlines=False)


async def _logs(args: argparse.Namespace, *, nats_url: str) -> int:
    async with control.RunClient(args.namespace, kubeflags.KubeOptions.from_args(args)) as runs:
        obj = await runs.get(args.run)  # a missing run: one line, before events are needed
        uid = obj["metadata"]["uid"]
        api = trajectoryapi.TrajectoryApi(runs.api, args.namespace, args.run)
        try:
            if args.follow:
                return await _follow(args, runs, await api.follow(), uid=uid)
            return await _print_all(args, obj, await api.read(), uid=uid)
        except trajectoryapi.NotInstalled as why:
            print(f"{args.prog}: {why}: reading NATS at {nats_url}", file=sys.stderr)
            return await _logs_from_nats(args, runs, obj, url=nats_url)


async def _logs_from_nats(
    args: argparse.Namespace, runs: control.RunClient, obj: dict[str, Any], *, url: str
) -> int:
    """The fallback without the trajectory API: read the run's events from NATS directly."""
    uid = obj["metadata"]["uid"]
    try:
        nc = await asyncio.wait_for(
            bus.connect_nats(url, name="kubectl-agentrun", auth=_nats_auth(args), fail_fast=True),
            10,
        )
    except (TimeoutError, nats.errors.Error, OSError, ValueError) as err:  # refused too
        raise RuntimeError(
            f"cannot reach NATS at {url} ({err!r}); set --nats-url or AGENTRUN_NATS_URL "
            "(and --nats-creds, --nats-ca on a closed bus) "
            "(e.g. kubectl port-forward the chart's NATS service)"
        ) from err
    events = bus.Bus(nc, nc.jetstream(timeout=10), bus.BusSettings(url=url))
    try:
        if args.follow:
            stream = events.follow_events(args.namespace, args.run)
            return await _follow(args, runs, stream, uid=uid)
        found = await events.read_events(args.namespace, args.run)
        return await _print_all(args, obj, found, uid=uid)
    finally:
        await events.close()


def _nats_auth(args: argparse.Namespace) -> natsclient.NatsAuth:
    """The credentials and CA files of the flags, else of the environment."""
    creds = args.nats_creds or os.environ.get("AGENTRUN_NATS_CREDS_FILE")
    ca = args.nats_ca or os.environ.get("AGENTRUN_NATS_CA_FILE")
    return natsclient.NatsAuth(
        creds_file=Path(creds) if creds else None, ca_file=Path(ca) if ca else None
    )


async def _print_all(
    args: argparse.Namespace, obj: dict[str, Any], events: list[RunEvent], *, uid: str
) -> int:
    found = [e for e in events if e.run_uid == uid]
    for event in found:
        _print_event(event, output=args.output)
    status = obj.get("status") or {}
    if not found and args.output != "json":
        if status.get("terminalReason"):
            print(_status_end(args.run, status))
        else:
            waiting = f"{status.get('phase', 'Pending')} {status.get('message', '')}".rstrip()
            print(display.printable(f"{args.run} has no events yet: {waiting}", newlines=False))
    return 0


async def _follow(
    args: argparse.Namespace,
    runs: control.RunClient,
    events: AsyncIterator[RunEvent],
    *,
    uid: str,
) -> int:
    """Print every event, then each new one, until the run's end; a run that ends without
    events (or is deleted) is noticed from its status."""
    queue: asyncio.Queue[RunEvent] = asyncio.Queue()

    async def pump() -> None:
        async for event in events:
            await queue.put(event)

    reader = asyncio.create_task(pump(), name="follow-events")
    seen = False
    try:
        while True:
            try:
                event = await asyncio.wait_for(queue.get(), STATUS_POLL_SECONDS)
            except TimeoutError:
                if reader.done():
                    reader.result()  # raises what stopped it
                    return 1
                status = (await runs.get(args.run)).get("status") or {}
                if status.get("terminalReason") and not seen:
                    if args.output != "json":
                        print(_status_end(args.run, status), flush=True)
                    return 0
                continue
            if event.run_uid != uid:
                continue
            seen = True
            _print_event(event, output=args.output)
            if kernel.conclude(event.summary.phase, steps=event.summary.steps) is not None:
                return 0
    finally:
        reader.cancel()
        with contextlib.suppress(BaseException):
            await reader


def cmd_logs(args: argparse.Namespace, *, nats_url: str) -> int:
    """``logs RUN [-f]``: the trajectory; ``-f`` follows until the run ends. ``nats_url``: the
    server read where the cluster does not serve the trajectory API."""
    return asyncio.run(_logs(args, nats_url=nats_url))
