"""The AgentEval controller's API calls: ``EvalStore``, over the API server port.

What belongs here: reading a suite, the Agents it runs (``AgentSeen``: one GET each, or one list
of the namespace for a suite of many) and its runs; deleting its runs of other rounds; creating
a case's run; writing its ``.status``; each translating the API server's answers (a missing
object: ``None`` or missing; a status write to an object gone or replaced: done). What does
not: any decision (``controller``: which runs to create, what the status says; ``status``: the
rounds, names and bodies).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from agentrun import kube

from .. import agents, runs
from ..platform.kubeapi import NOT_FOUND, ApiError, KubeApi, Ref
from .status import CASE_LABEL, EVAL_LABEL, ROUND_LABEL, AgentSeen, EvalRef

EVALS = kube.EVALS
"""The plural of ``AgentEval``."""
AGENTS_BY_GET = 8
"""Agents a suite may run and still have read one GET each; a suite running more has its
namespace's Agents read in one list instead (``KubeApi.list_kept``: in pages of
``LIST_PAGE``, each page's Agents dropped but the suite's, as ``AgentSeen``). A suite of 201
Agents cost 201 GETs at every reconcile, and a suite is reconciled again as each of its runs
ends. The list costs one request per ``LIST_PAGE`` Agents of the namespace and reads them all:
for a suite of a few Agents in a namespace of thousands, a few GETs cost the API server less,
so the list is taken only past this count (it costs fewer requests than the GETs while the
namespace holds fewer than ``AGENTS_BY_GET * LIST_PAGE`` Agents, 4,000)."""


def _seen(name: str, agent: Mapping[str, Any] | None) -> AgentSeen:
    """Agent ``name`` as a round finds it: ``agent`` (``None``: missing)."""
    if agent is None:
        return AgentSeen(name)
    generation = int((agent.get("metadata") or {}).get("generation") or 1)
    return AgentSeen(name, generation, agents.digest_of(agent.get("spec") or {}))


def _seen_of(names: frozenset[str], agent: Mapping[str, Any]) -> AgentSeen | None:
    """``list_kept``'s ``keep``: a listed Agent as seen when it is one of ``names``."""
    name = str((agent.get("metadata") or {}).get("name", ""))
    return _seen(name, agent) if name in names else None


RUN_STATUS_READ = ("terminalReason", "outcome", "usage", "answer")
"""The fields of a case's run's ``.status`` the controller reads (``status.run_result``)."""


def slim_run(run: Mapping[str, Any]) -> dict[str, Any]:
    """What the controller reads of a listed run: its name, uid, labels, owner references,
    deletion time and grading hold (``runs.HOLD_ANNOTATION``), and its status's
    ``RUN_STATUS_READ``. A run's object holds its resolved
    Agent spec and its goal and parameters besides; held whole, a reconcile held every run of
    the suite decoded for as long as it graded them (reading each one's events)."""
    meta = run.get("metadata") or {}
    found = run.get("status") or {}
    kept = ("name", "uid", "labels", "ownerReferences", "deletionTimestamp")
    slim = {k: meta[k] for k in kept if k in meta}
    if runs.HOLD_ANNOTATION in (meta.get("annotations") or {}):
        slim["annotations"] = {runs.HOLD_ANNOTATION: meta["annotations"][runs.HOLD_ANNOTATION]}
    return {"metadata": slim, "status": {k: found[k] for k in RUN_STATUS_READ if k in found}}


class EvalStore:
    """The API calls of the AgentEval controller; each raises ``ApiError`` on a failed request
    (but for the answers its docstring names)."""

    def __init__(self, api: KubeApi) -> None:
        self.api = api

    async def get_suite(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The AgentEval ``namespace/name``; ``None`` when there is none."""
        return await self.api.get(Ref(EVALS, name, namespace))

    async def agents_seen(self, namespace: str, names: frozenset[str]) -> dict[str, AgentSeen]:
        """The Agents ``names`` of ``namespace`` as found now, by name (``AgentSeen(name)`` for
        one missing): up to ``AGENTS_BY_GET`` read one GET each, more in one list of the
        namespace's Agents."""
        if len(names) <= AGENTS_BY_GET:
            found = [
                _seen(name, await agents.get_agent(self.api, namespace, name))
                for name in sorted(names)
            ]
        else:
            try:
                found = await self.api.list_kept(
                    kube.AGENTS, functools.partial(_seen_of, names), namespace=namespace
                )
            except ApiError as err:
                if err.status != NOT_FOUND:
                    raise
                found = []  # as a GET's 404 reads: every one missing
        seen = {agent.name: agent for agent in found}
        return {name: seen.get(name) or AgentSeen(name) for name in sorted(names)}

    async def runs_of_round(self, suite: EvalRef, round_: str) -> dict[str, dict[str, Any]]:
        """The suite's runs of ``round_`` by case, each as ``slim_run`` keeps it; its runs of
        any other round are deleted (a run still going is stopped by its deletion)."""
        listed = await self.api.list_kept(
            runs.RUNS,
            slim_run,
            namespace=suite.namespace,
            label_selector=f"{EVAL_LABEL}={suite.name}",
        )
        current: dict[str, dict[str, Any]] = {}
        for run in listed:
            meta = run.get("metadata") or {}
            owners = meta.get("ownerReferences") or []
            if not any(o.get("uid") == suite.uid for o in owners):
                continue  # a run of an earlier AgentEval of the same name
            labels = meta.get("labels") or {}
            if labels.get(ROUND_LABEL) == round_ and round_:
                current[str(labels.get(CASE_LABEL, ""))] = run
            elif not meta.get("deletionTimestamp"):
                run_key = runs.RunKey(suite.namespace, str(meta["name"]), str(meta.get("uid", "")))
                await self.api.delete(run_key.ref, uid=run_key.uid)
        return current

    async def create_run(self, manifest: dict[str, Any]) -> None:
        """Create a case's run; one created before (a restart, a lost reply) is the same run."""
        await self.api.create(runs.RUNS, manifest)

    async def release_run(self, run: runs.RunKey) -> None:
        """Remove ``run``'s grading hold: its grade is in the suite's status, so its TTL may
        delete it now (``runs.release_hold``)."""
        await runs.release_hold(self.api, run)

    async def write_status(self, suite: EvalRef, body: Mapping[str, Any]) -> None:
        """Merge ``body`` into the suite's ``.status``; a suite gone, or replaced by a new
        object of its name, is left alone."""
        try:
            await self.api.patch_status(
                Ref(EVALS, suite.name, suite.namespace), body, uid=suite.uid
            )
        except ApiError as err:
            if err.status not in (404, 409):  # gone, or replaced by a new object of the name
                raise
