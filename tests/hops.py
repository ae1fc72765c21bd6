"""Count the hops of a single-turn AgentRun: the calls from one module of agentrun into another
on its way from the create handler to the first TurnRequest, and from the worker's commit to
the status write. Rerun with ``.venv/bin/python tests/hops.py [--runs N]``.

How it counts (a runtime trace, not a reading of the code): the operator's parts
(``wiring.start_parts``) and one worker (``TurnConsumer``) run in this one process, on a
nats-server of their own (open bus) and the scripted model, with the in-memory API server of the
suite (``kube_support.FakeKube``) behind the operator's ``KubeApi`` port. ``sys.setprofile``
sees every Python function entered; one AgentRun whose model answers at once is created
through the create handler (``handlers/admission.admit_run``, as kopf calls it).

- A *hop* is a function of an ``agentrun`` module entered from a function of another
  ``agentrun`` module (``agentrun.*``, ``agentrun.operator.*`` and ``agentrun.worker.*`` alike;
  the fake API server counts as ``operator.platform.kubeapi``, the adapter it stands in for,
  so a call into the port is a hop and what the real adapter does inside is not counted).
  Calls inside one module, into the standard library or a third-party library, and C
  functions are not hops, nor are special methods no call in the code shows (``__hash__``,
  ``__eq__``, ``__iter__``…; ``__init__``, ``__call__``, ``__aenter__``/``__aexit__`` are). A
  coroutine counts once, when it is first entered, not at each resumption.
- A *hand-off* is a function of agentrun entered from no agentrun frame: a task started, a
  callback or a message delivered by the event loop, a thread of ``asyncio.to_thread``, a
  library calling back. Counted apart.
- Window 1 runs from the create handler's entry to the entry of ``Bus.publish_turn`` (the
  first TurnRequest); window 2 from the entry of the worker's ``commit_turn`` to the first
  ``patch_status`` after it (the run's terminal status). Everything the process does in a
  window is counted, including a background loop that happens to wake in it (they are idle:
  the sweep and orphan intervals are set long), so the figures can move by a few between
  runs; ``--runs`` repeats the measure and prints each.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import dataclasses
import sys
import tempfile
import threading
import types
from pathlib import Path
from typing import Any

import kopf
from kube_support import FakeKube

from agentrun import kube
from agentrun.bus import Bus, BusSettings
from agentrun.ledger import LedgerStore
from agentrun.operator import wiring
from agentrun.operator.handlers import admission as handlers
from agentrun.settings import OperatorSettings
from agentrun.testing import mockllm, scenario
from agentrun.tools import Calculate, Catalog
from agentrun.trust import Verifier, keys, trust_file
from agentrun.worker.consumer import ConsumerSettings, TurnConsumer
from agentrun.worker.model import ModelClient, RetryPolicy
from agentrun.worker.toolrunner import ToolRunSettings
from agentrun.worker.turn import TurnDeps
from agentrun_dev import demo, natsserver

SCRIPT = """
scenarios:
  - name: one-turn
    turns:
      - content: "done"
        usage: {prompt_tokens: 10, completion_tokens: 2}
"""
PORT_MODULE = "agentrun.operator.platform.kubeapi"
"""The module the fake API server stands in for."""
NAMESPACE = "default"
WRITTEN_SPECIAL = frozenset({"__init__", "__call__", "__aenter__", "__aexit__"})
"""Special methods a reader sees called (a constructor, a call, ``async with``); the others
(hashing, comparison, iteration, ``__post_init__``…) run without a call in the code."""


@dataclasses.dataclass
class Window:
    """What one window counted."""

    hops: int = 0
    handoffs: int = 0
    arrows: collections.Counter[tuple[str, str]] = dataclasses.field(
        default_factory=collections.Counter
    )


class Tracer:
    """The profile hook: counts hops and hand-offs in the open window (see the module)."""

    def __init__(self) -> None:
        self.windows: list[Window] = []
        self.open: Window | None = None
        self.entered: set[types.FrameType] = set()
        self.committed = False

    def module_of(self, frame: types.FrameType | None) -> str | None:
        """The agentrun module ``frame`` runs in (the fake API server's: the port's)."""
        if frame is None:
            return None
        name = str(frame.f_globals.get("__name__", ""))
        if name == "kube_support":
            return PORT_MODULE
        return name if name == "agentrun" or name.startswith("agentrun.") else None

    def __call__(self, frame: types.FrameType, event: str, arg: object) -> None:
        if event != "call" or frame in self.entered:
            return
        self.entered.add(frame)
        name = frame.f_code.co_name
        callee = self.module_of(frame)
        if callee is None or (name.startswith("__") and name not in WRITTEN_SPECIAL):
            return
        self._edges(frame, name, callee)

    def _edges(self, frame: types.FrameType, name: str, callee: str) -> None:
        if self.open is None:
            if name == "admit_run" and callee.endswith("handlers.admission") and not self.windows:
                self.open = Window()
            elif name == "commit_turn" and len(self.windows) == 1:
                self.open = Window()
                self.committed = True
        window = self.open
        if window is None:
            return
        caller = self.module_of(frame.f_back)
        if caller is None:
            window.handoffs += 1
        elif caller != callee:
            window.hops += 1
            window.arrows[(caller, callee)] += 1
        if (name == "publish_turn" and callee == "agentrun.bus") or (
            name == "patch_status" and self.committed and callee == PORT_MODULE
        ):
            self.windows.append(window)
            self.open = None
            self.committed = False


def settings(tmp: Path, url: str) -> OperatorSettings:
    """The operator's settings: this nats-server, fresh run-signing keys, idle loops."""
    signing, trusted = keys.generate(now=0.0)
    (tmp / "signing.json").write_text(signing.text())
    (tmp / "trust.json").write_text(trusted.text())
    return OperatorSettings(
        nats_url=url,
        run_signing_file=tmp / "signing.json",
        run_trust_file=tmp / "trust.json",
        ledger_sweep=3600.0,
        orphan_after=3600.0,
    )


def agent_run(name: str) -> dict[str, Any]:
    """A single-turn AgentRun on the scripted model."""
    return {
        "apiVersion": f"{kube.GROUP}/{kube.VERSION}",
        "kind": "AgentRun",
        "metadata": {"name": name, "namespace": NAMESPACE, "uid": f"uid-{name}", "generation": 1},
        "spec": {"model": demo.MODEL_NAME, "goal": "say done"},
    }


async def run_one(api: FakeKube, parts: Any, name: str) -> None:
    """Create AgentRun ``name`` through the create handler; return once it ended."""
    body = kopf.Body(api.put(kube.RUNS, agent_run(name)))  # what kopf hands its handlers
    memo = types.SimpleNamespace(running=lambda: parts.handling)
    await handlers.admit_run(
        spec=body.spec,
        meta=body.meta,
        status=body.status,
        namespace=NAMESPACE,
        name=name,
        uid=body.meta.uid,
        retry=0,
        memo=memo,
    )
    async with asyncio.timeout(60):
        while (
            not (api.find(kube.RUNS, name, NAMESPACE) or {}).get("status", {}).get("terminalReason")
        ):
            await asyncio.sleep(0.05)


async def worker(server: natsserver.NatsServer, url: str, trust: Path) -> TurnConsumer:
    """One worker on its own connection."""
    bus = await Bus.connect(BusSettings(server.url, auth=None), name="hops-worker")
    deps = TurnDeps(
        model=ModelClient(RetryPolicy(max_retries=0)),
        catalog=Catalog([Calculate()]),
        secrets=types.SimpleNamespace(),  # type: ignore[arg-type]  # the mock takes no key
        tool_settings=ToolRunSettings(),
    )
    ledger = await LedgerStore.open(bus.js, create=False)
    return TurnConsumer(
        bus, deps, ConsumerSettings(), seals=Verifier(trust_file(trust)), ledger=ledger
    )


async def measure(tmp: Path, runs: int) -> list[Window]:
    """Start the stack, trace ``runs`` runs one after the other; their windows."""
    server = natsserver.start_nats_server(tmp / "nats", closed=False)
    try:
        async with mockllm.MockLLM(scenario.parse_scenarios(SCRIPT)) as mock:
            api = FakeKube()
            api.put(kube.MODELS, demo.mock_model(mock.base_url))
            tenant = api.put(kube.TENANTS, demo.default_tenant())
            conf = settings(tmp, server.url)
            parts = await wiring.start_parts(conf, tenant_objects=[tenant], api=api)
            consumer = await worker(server, server.url, tmp / "trust.json")
            consuming = asyncio.create_task(consumer.run())
            await asyncio.sleep(1.0)  # the loops' first passes, before any window
            found: list[Window] = []
            try:
                for i in range(runs):
                    tracer = Tracer()
                    threading.setprofile(tracer)
                    sys.setprofile(tracer)
                    try:
                        await run_one(api, parts, f"hops-{i}")
                    finally:
                        sys.setprofile(None)
                        threading.setprofile(None)  # type: ignore[arg-type]
                    if len(tracer.windows) != 2:
                        raise RuntimeError(f"run {i}: {len(tracer.windows)} windows closed, not 2")
                    found.extend(tracer.windows)
            finally:
                consumer.stop()
                await consuming
                await wiring.stop_parts(parts)
            return found
    finally:
        server.stop()


def main() -> None:
    """Print the hops of each run's two windows, and the arrows of the first run."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--arrows", action="store_true", help="each module arrow and its count")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        windows = asyncio.run(measure(Path(tmp), args.runs))
    names = ("create handler -> first TurnRequest", "worker commit -> status write")
    for i in range(0, len(windows), 2):
        for name, window in zip(names, windows[i : i + 2], strict=True):
            print(f"run {i // 2}: {name}: {window.hops} hops, {window.handoffs} hand-offs")
    if args.arrows:
        for name, window in zip(names, windows[:2], strict=True):
            print(f"\n{name} (run 0):")
            for (caller, callee), count in window.arrows.most_common():
                print(f"  {count:4d}  {caller} -> {callee}")


if __name__ == "__main__":
    main()
