"""kopf entry points of the AgentEval controller: they only ask it for reconciles.

An AgentEval changed (or was listed at start-up or on a re-list): reconcile it. One of its
runs (labelled ``agentrun.dev/eval``) ended or was deleted: reconcile its suite, which grades
it and starts the next waiting case (``runs.owned_run_changed``, shared with the CronAgentRun
controller). An Agent changed: reconcile the suites that run it (``agents.eval_agent_changed``).
The controller (``evals.controller.EvalController``) is built by ``wiring`` and carried in
kopf's memo; like every handler, these run on the leader only.
"""

from __future__ import annotations

from typing import Any

import kopf

from agentrun import kube

from ..wiring import OperatorMemo

EVAL = (kube.GROUP, kube.VERSION, kube.EVALS)


@kopf.on.event(*EVAL)
async def eval_changed(
    *, type: str | None, namespace: str | None, name: str, memo: OperatorMemo, **_: Any
) -> None:
    """Reconcile the AgentEval (or forget a deleted one), its namespace's tenant learnt first
    (``Tenants.learn``): its reconcile takes its tenant's place (``Tenants.party``)."""
    if namespace is None:
        return
    parts = memo.running()
    if type == "DELETED":
        parts.evals.forget(namespace, name)
        return
    await parts.tenants.tenants.learn(namespace)
    parts.evals.kick(namespace, name)
