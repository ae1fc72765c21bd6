"""kopf entry points of the AgentEval controller: they only ask it for reconciles.

An AgentEval changed (or was listed at start-up or on a re-list): reconcile it. One of its
runs (labelled ``agentrun.dev/eval``) ended or was deleted: reconcile its suite, which grades
it and starts the next waiting case. An Agent changed: reconcile the suites that run it (a new
round starts when its generation moved). The controller (``evals.EvalController``) is built
by ``wiring`` and carried in kopf's memo; like every handler, these run on the leader only.
"""

from __future__ import annotations

from typing import Any

import kopf

from agentrun import kube

from .evalstatus import EVAL_LABEL
from .wiring import OperatorMemo

EVAL = (kube.GROUP, kube.VERSION, kube.EVALS)
RUN = (kube.GROUP, kube.VERSION, kube.RUNS)
AGENT = (kube.GROUP, kube.VERSION, kube.AGENTS)


@kopf.on.event(*EVAL)
async def eval_changed(
    *, type: str | None, namespace: str | None, name: str, memo: OperatorMemo, **_: Any
) -> None:
    """Reconcile the AgentEval (or forget a deleted one)."""
    if namespace is None:
        return
    controller = memo.running().evals
    if type == "DELETED":
        controller.forget(namespace, name)
        return
    controller.kick(namespace, name)


@kopf.on.event(*RUN, labels={EVAL_LABEL: kopf.PRESENT})
async def eval_run_changed(
    *,
    type: str | None,
    labels: kopf.Labels,
    status: kopf.Status,
    namespace: str | None,
    memo: OperatorMemo,
    **_: Any,
) -> None:
    """A run of a suite ended or went away: reconcile its suite."""
    if namespace is None:
        return
    if type == "DELETED" or status.get("terminalReason"):
        memo.running().evals.kick(namespace, str(labels[EVAL_LABEL]))


@kopf.on.event(*AGENT)
async def eval_agent_changed(
    *, namespace: str | None, name: str, memo: OperatorMemo, **_: Any
) -> None:
    """An Agent changed: reconcile the suites that run it."""
    if namespace is not None:
        memo.running().evals.agent_changed(namespace, name)
