"""AgentEval rounds, runs and status, decided without I/O.

What belongs here: the identity of an evaluation round (from the suite's generation and the
generations of the Agents it runs), the deterministic name, labels and manifest of a case's
AgentRun (so an operator restart finds the run it created instead of creating another), what
a finished run's status says for grading, the rows of ``status.cases`` and the whole
``.status`` body (phase, summary, ``Complete`` and ``Passed`` conditions). What does not:
reading or writing objects, reading a run's events (``controller``), grading (``grading``).
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
from collections.abc import Iterable, Mapping, Sequence
from decimal import Decimal, InvalidOperation
from typing import Any

from agentrun import kube

from .. import runs
from ..platform.conditions import rfc3339
from . import grading
from .spec import EvalCase

EVAL_LABEL = "agentrun.dev/eval"
"""On each run of a suite: the AgentEval's name."""
CASE_LABEL = "agentrun.dev/eval-case"
"""On each run of a suite: the case's name."""
ROUND_LABEL = "agentrun.dev/eval-round"
"""On each run of a suite: the round it belongs to (``status.round``)."""
RUN_NAME_LIMIT = 63
"""An AgentRun's name is a DNS-1123 label."""
HASH_CHARS = 8
"""Hex characters of the hash that ends a run's name."""
ROW_MESSAGE_CHARS = 4096
"""Characters of a case's ``status.cases[].message`` at most (cut in the middle with ``…``):
under the CRD's bound of a row, and 200 rows (the CRD's ``maxItems``) of it stay far under
what a status write may carry, however the run's answer and tools made the messages grow."""


class CasePhase(enum.StrEnum):
    """``status.cases[].phase``."""

    PENDING = "Pending"
    """Its run is not created yet (the suite's parallelism)."""
    RUNNING = "Running"
    """Its run exists and has not ended."""
    PASSED = "Passed"
    FAILED = "Failed"


class EvalPhase(enum.StrEnum):
    """``status.phase``."""

    PENDING = "Pending"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


@dataclasses.dataclass(frozen=True, slots=True)
class EvalRef:
    """The AgentEval object a round belongs to."""

    namespace: str
    name: str
    uid: str
    generation: int


@dataclasses.dataclass(frozen=True, slots=True)
class AgentSeen:
    """An Agent as the round found it; ``generation`` 0 and ``digest`` empty when missing."""

    name: str
    generation: int = 0
    digest: str = ""

    def as_dict(self) -> dict[str, Any]:
        """``status.agent``."""
        return {"name": self.name, "generation": self.generation, "digest": self.digest}


def round_id(generation: int, agents: Iterable[AgentSeen]) -> str:
    """The round of a suite at ``generation`` running ``agents``: 10 hex characters, the same
    for the same inputs, new when either changes."""
    seen = ",".join(f"{a.name}={a.generation}" for a in sorted(agents, key=lambda a: a.name))
    return hashlib.sha256(f"{generation}|{seen}".encode()).hexdigest()[:10]


def run_name(suite: EvalRef, case: str, *, round_: str) -> str:
    """The AgentRun of ``case`` in ``round_``: ``<eval>-<case>-<hash>``, the prefix cut so the
    whole is a DNS-1123 label of at most 63 characters; the hash (of the eval's uid, the round
    and the case) keeps names of different rounds, cases and eval objects apart."""
    digest = hashlib.sha256(f"{suite.uid}|{round_}|{case}".encode()).hexdigest()[:HASH_CHARS]
    prefix = f"{suite.name}-{case}"[: RUN_NAME_LIMIT - HASH_CHARS - 1].rstrip("-")
    return f"{prefix}-{digest}"


def run_manifest(suite: EvalRef, case: EvalCase, *, round_: str, ttl: int | None) -> dict[str, Any]:
    """The AgentRun of ``case``: a run of its Agent with its goal and parameters, owned by the
    eval (deleted with it), labelled with the eval, case and round, and held for grading
    (``runs.HOLD_ANNOTATION``: no TTL deletes it before its grade is in the status)."""
    spec: dict[str, Any] = {
        "agentRef": {"name": case.agent, "parameters": dict(case.parameters)},
        "goal": case.goal,
    }
    if not case.parameters:
        del spec["agentRef"]["parameters"]
    if ttl is not None:
        spec["ttlSecondsAfterFinished"] = ttl
    owner = {
        "apiVersion": f"{kube.GROUP}/{kube.VERSION}",
        "kind": "AgentEval",
        "name": suite.name,
        "uid": suite.uid,
        "controller": True,
        "blockOwnerDeletion": False,
    }
    return {
        "apiVersion": f"{kube.GROUP}/{kube.VERSION}",
        "kind": "AgentRun",
        "metadata": {
            "name": run_name(suite, case.name, round_=round_),
            "namespace": suite.namespace,
            "labels": {EVAL_LABEL: suite.name, CASE_LABEL: case.name, ROUND_LABEL: round_},
            "annotations": {runs.HOLD_ANNOTATION: runs.HOLD_GRADING},
            "ownerReferences": [owner],
        },
        "spec": spec,
    }


def run_result(run_status: Mapping[str, Any], *, tools: frozenset[str]) -> grading.RunResult:
    """What a finished run's ``.status`` says for grading, with the ``tools`` its events show
    it called."""
    usage: Mapping[str, Any] = run_status.get("usage") or {}
    try:
        cost = Decimal(str(usage.get("costUSD", "0")))
    except InvalidOperation:
        cost = Decimal(0)
    answer = run_status.get("answer")
    return grading.RunResult(
        reason=str(run_status.get("terminalReason") or ""),
        outcome=str(run_status.get("outcome") or ""),
        cost_usd=cost,
        tokens=int(usage.get("totalTokens") or 0),
        steps=int(usage.get("steps") or 0),
        answer=answer if isinstance(answer, str) else None,
        tools_called=tools,
    )


@dataclasses.dataclass(frozen=True, slots=True)
class CaseRow:
    """One row of ``status.cases``."""

    name: str
    run: str
    phase: CasePhase
    reason: str = ""
    message: str = ""
    cost_usd: str = ""
    tokens: int = 0
    steps: int = 0

    @property
    def graded(self) -> bool:
        """Passed or failed."""
        return self.phase in (CasePhase.PASSED, CasePhase.FAILED)

    def as_dict(self) -> dict[str, Any]:
        """The row as written to ``status.cases``."""
        row: dict[str, Any] = {"name": self.name, "run": self.run, "phase": self.phase.value}
        if self.graded:
            row.update(
                passed=self.phase is CasePhase.PASSED,
                reason=self.reason,
                message=self.message,
                costUSD=self.cost_usd,
                tokens=self.tokens,
                steps=self.steps,
            )
        return row

    @classmethod
    def from_dict(cls, row: Mapping[str, Any]) -> CaseRow | None:
        """A row read back from ``status.cases``; ``None`` when it is not one this module
        wrote."""
        try:
            phase = CasePhase(str(row.get("phase")))
        except ValueError:
            return None
        return cls(
            name=str(row.get("name", "")),
            run=str(row.get("run", "")),
            phase=phase,
            reason=str(row.get("reason", "")),
            message=str(row.get("message", "")),
            cost_usd=str(row.get("costUSD", "")),
            tokens=int(row.get("tokens") or 0),
            steps=int(row.get("steps") or 0),
        )


def graded_row(
    case: str, run: str, result: grading.RunResult, failures: Sequence[grading.Failure]
) -> CaseRow:
    """The row of a graded case: its run's figures and every missed expectation (the message
    at most ``ROW_MESSAGE_CHARS``)."""
    if failures:
        message = "; ".join(f.message for f in failures)
    else:
        message = f"every expectation met (terminal reason {result.reason})"
    return CaseRow(
        name=case,
        run=run,
        phase=CasePhase.FAILED if failures else CasePhase.PASSED,
        reason=result.reason,
        message=grading.shorten(message, ROW_MESSAGE_CHARS),
        cost_usd=format(result.cost_usd, "f"),
        tokens=result.tokens,
        steps=result.steps,
    )


def previous_rows(previous: Mapping[str, Any], *, round_: str) -> dict[str, CaseRow]:
    """The graded rows of ``previous`` (an eval's status now) by case name, if it is of
    ``round_``; empty otherwise."""
    if previous.get("round") != round_:
        return {}
    rows = (CaseRow.from_dict(r) for r in previous.get("cases") or [] if isinstance(r, Mapping))
    return {row.name: row for row in rows if row is not None and row.graded}


def started_runs(previous: Mapping[str, Any], *, round_: str) -> dict[str, str]:
    """The runs ``previous`` (an eval's status now) shows created and not graded, by case name,
    if it is of ``round_``; empty otherwise."""
    if previous.get("round") != round_:
        return {}
    rows = (CaseRow.from_dict(r) for r in previous.get("cases") or [] if isinstance(r, Mapping))
    return {r.name: r.run for r in rows if r is not None and r.phase is CasePhase.RUNNING}


def vanished_row(case: str, run: str) -> CaseRow:
    """The row of a case whose run was deleted before it was graded: Failed, saying so (it is
    not run again in the round: a run that went away is not a reason to pay for another)."""
    return CaseRow(
        name=case,
        run=run,
        phase=CasePhase.FAILED,
        message=f"run {run} was deleted before it was graded (its ttlSecondsAfterFinished, or "
        "its tenant's, shorter than grading took, or deleted by hand); edit the suite to run "
        "the case again",
    )


@dataclasses.dataclass(frozen=True, slots=True)
class Verdict:
    """Where a round stands."""

    phase: EvalPhase
    passed: int
    failed: int
    total: int

    @property
    def complete(self) -> bool:
        """Every case graded."""
        return self.passed + self.failed == self.total


def verdict(rows: Sequence[CaseRow]) -> Verdict:
    """The round's phase and counts from its rows: Failed as soon as a case failed (the
    suite cannot pass; its other cases still run and are graded), Succeeded once every case
    passed, Pending before any run exists, else Running."""
    passed = sum(1 for r in rows if r.phase is CasePhase.PASSED)
    failed = sum(1 for r in rows if r.phase is CasePhase.FAILED)
    if failed:
        phase = EvalPhase.FAILED
    elif passed == len(rows):
        phase = EvalPhase.SUCCEEDED
    elif all(r.phase is CasePhase.PENDING for r in rows):
        phase = EvalPhase.PENDING
    else:
        phase = EvalPhase.RUNNING
    return Verdict(phase, passed, failed, len(rows))


def failed_cases_text(rows: Sequence[CaseRow]) -> str:
    """``2 of 5 cases failed: area (terminal reason max_steps != expected completed); ...``
    (``failed so far`` while cases are still to be graded)."""
    failed = [r for r in rows if r.phase is CasePhase.FAILED]
    listed = "; ".join(f"{r.name} ({r.message})" for r in failed)
    so_far = " so far" if not all(r.graded for r in rows) else ""
    return f"{len(failed)} of {len(rows)} cases failed{so_far}: {listed}"


@dataclasses.dataclass(frozen=True, slots=True)
class Round:
    """The round a status is written for."""

    id: str
    generation: int
    agent: AgentSeen
    """The suite's own Agent (``spec.agentRef``)."""


def eval_status(
    rows: Sequence[CaseRow], *, round_: Round, previous: Mapping[str, Any], now: float
) -> dict[str, Any]:
    """The AgentEval's ``.status`` for ``rows`` of ``round_``. ``previous`` (its status now)
    keeps the round's start time and each condition's ``lastTransitionTime`` while its status
    does not flip; ``now`` (epoch seconds) stamps what changes."""
    found = verdict(rows)
    same_round = previous.get("round") == round_.id
    started = previous.get("startTime") if same_round else None
    body: dict[str, Any] = {
        "phase": found.phase.value,
        "observedGeneration": round_.generation,
        "round": round_.id,
        "agent": round_.agent.as_dict(),
        "startTime": started or rfc3339(now),
        "summary": {"passed": found.passed, "failed": found.failed, "total": found.total},
        "cases": [row.as_dict() for row in rows],
    }
    body["completionTime"] = None  # a merge patch removes an earlier round's
    if found.complete:
        done = previous.get("completionTime") if same_round else None
        body["completionTime"] = done or rfc3339(now)
    graded = found.passed + found.failed
    if found.complete:
        complete = ("True", "Graded", f"{found.total} cases graded")
    else:
        complete = ("False", "Running", f"{graded} of {found.total} cases graded")
    if found.failed:
        passed = ("False", "CasesFailed", failed_cases_text(rows))
    elif found.complete:
        passed = ("True", "AllPassed", f"{found.total} of {found.total} cases passed")
    else:
        passed = ("Unknown", "Running", f"{found.passed} of {found.total} cases passed so far")
    body["conditions"] = _conditions(
        {"Complete": complete, "Passed": passed},
        generation=round_.generation,
        previous=previous,
        now=now,
    )
    return body


RECONCILE_FAILED = "ReconcileFailed"
"""The reason of a suite given up because reconciling it failed twice for a reason that does
not pass (a case's run the API server refuses, a status too large to store, a bug)."""


def invalid_status(
    message: str,
    *,
    generation: int,
    previous: Mapping[str, Any],
    now: float,
    reason: str = "InvalidSpec",
) -> dict[str, Any]:
    """The ``.status`` of a suite the operator cannot run (``message`` names the field or the
    failure; ``reason``: ``InvalidSpec`` or ``RECONCILE_FAILED``): Failed, no cases run.
    ``None`` values remove the field (a merge patch)."""
    return {
        "phase": EvalPhase.FAILED.value,
        "observedGeneration": generation,
        "round": "",
        "agent": None,
        "startTime": None,
        "completionTime": None,
        "summary": {"passed": 0, "failed": 0, "total": 0},
        "cases": [],
        "conditions": _conditions(
            {
                "Complete": ("True", reason, message),
                "Passed": ("False", reason, message),
            },
            generation=generation,
            previous=previous,
            now=now,
        ),
    }


def given_up(previous: Mapping[str, Any], *, generation: int) -> bool:
    """Whether ``previous`` (a suite's status) says this generation was given up
    (``RECONCILE_FAILED``): it is not reconciled again until its spec changes."""
    if previous.get("observedGeneration") != generation:
        return False
    return any(
        c.get("type") == "Complete" and c.get("reason") == RECONCILE_FAILED
        for c in previous.get("conditions") or []
    )


def _conditions(
    wanted: Mapping[str, tuple[str, str, str]],
    *,
    generation: int,
    previous: Mapping[str, Any],
    now: float,
) -> list[dict[str, Any]]:
    old = {c.get("type"): c for c in previous.get("conditions") or [] if isinstance(c, Mapping)}
    conditions = []
    for kind, (flag, reason, message) in wanted.items():
        before = old.get(kind) or {}
        moved = before.get("status") != flag or not before.get("lastTransitionTime")
        conditions.append(
            {
                "type": kind,
                "status": flag,
                "reason": reason,
                "message": message[:32768],
                "lastTransitionTime": rfc3339(now) if moved else before["lastTransitionTime"],
                "observedGeneration": generation,
            }
        )
    return conditions


def unchanged(new: Mapping[str, Any], previous: Mapping[str, Any]) -> bool:
    """Whether writing ``new`` would change nothing in ``previous`` (every key of ``new``
    equal)."""
    return all(previous.get(key) == value for key, value in new.items())


def graded_held(
    namespace: str, rows: Iterable[CaseRow], current: Mapping[str, Mapping[str, Any]]
) -> list[runs.RunKey]:
    """The runs of ``current`` (case name -> run object as listed) still held for grading
    (``runs.HOLD_ANNOTATION``) whose row in ``rows`` is graded (Passed or Failed, naming
    that run): once ``rows`` are in the suite's status, their holds may go."""
    graded = {
        row.name: row.run for row in rows if row.phase in (CasePhase.PASSED, CasePhase.FAILED)
    }
    held: list[runs.RunKey] = []
    for case, run in current.items():
        meta = run.get("metadata") or {}
        name = str(meta.get("name", ""))
        if graded.get(case) == name and runs.HOLD_ANNOTATION in (meta.get("annotations") or {}):
            held.append(runs.RunKey(namespace, name, str(meta.get("uid", ""))))
    return held
