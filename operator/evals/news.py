"""What an AgentEval's status records, told once: case counts, Events, the pass ratio.

What belongs here: from the rows of a round, what the world hears of them — each graded case
counted in ``agentrun_eval_cases_total`` (and a failed one in a ``CaseFailed`` Event), the
round's start and end Events, the ``agentrun_eval_pass_ratio`` gauge of a complete round — and
the bookkeeping that tells each of them once. They are told only once the status recording
them is written, and once per round: a status write that fails is retried by a reconcile that
grades the case again, but the case graded and not yet told is told once, when a write records
it (or when the retry finds it recorded: a write the API server applied whose reply was lost).
The counts are the cases recorded, never one per grading. What does not belong: the rows and
the status (``status``), reading and writing objects (``store``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from agentrun import metrics

from ..platform.events import EventRecorder, EventType, Involved
from .status import (
    CasePhase,
    CaseRow,
    EvalRef,
    Round,
    failed_cases_text,
    previous_rows,
    verdict,
)

_Key = tuple[str, str]
"""(namespace, name) of an AgentEval."""


@dataclasses.dataclass(slots=True)
class Untold:
    """What a suite's round decided in this process and has not told yet."""

    round: str
    start: bool = False
    """The round's ``EvaluationStarted`` is due."""
    finish: bool = False
    """The round's end (``EvaluationFailed`` or ``EvaluationPassed``) is due."""
    cases: dict[str, CaseRow] = dataclasses.field(default_factory=dict)
    """Cases graded by this process and not counted yet, by name."""


class EvalNews:
    """Tells what AgentEval statuses record, each once (see the module): ``note`` the rows of
    a reconcile before its status write, ``tell`` them once the write went through."""

    def __init__(self, events: EventRecorder) -> None:
        """``events``: where the Kubernetes Events go."""
        self.events = events
        self._untold: dict[_Key, Untold] = {}

    def note(
        self, suite: EvalRef, rows: Sequence[CaseRow], *, round_: str, previous: Mapping[str, Any]
    ) -> None:
        """Note the ``rows`` of ``round_`` a reconcile computed, before the status that records
        them is written: the rows graded now (not read back from ``previous``, the status the
        reconcile read) are due to be counted, the round's start is due when ``previous`` is
        of another round, its end when the rows complete a round ``previous`` did not. An
        earlier round's untold news is dropped (no status will record it)."""
        key = (suite.namespace, suite.name)
        same_round = previous.get("round") == round_
        untold = self._untold.get(key)
        if untold is None or untold.round != round_:
            untold = self._untold[key] = Untold(round_, start=not same_round)
        kept = previous_rows(previous, round_=round_)
        untold.cases.update((r.name, r) for r in rows if r.graded and kept.get(r.name) != r)
        if verdict(rows).complete and not (same_round and previous.get("completionTime")):
            untold.finish = True

    def tell(self, suite: EvalRef, rows: Sequence[CaseRow], *, round_: Round) -> None:
        """Tell what ``rows`` say, now that the status records them (written, or found
        written), each thing once: the round's start, each case noted as graded (counted,
        and a ``CaseFailed`` Event when it failed), the round's end; and set the pass ratio
        of a complete round."""
        untold = self._untold.get((suite.namespace, suite.name))
        if untold is None or untold.round != round_.id:
            return
        if untold.start:
            untold.start = False
            self._started(suite, rows, round_=round_)
        for row in rows:
            graded = untold.cases.get(row.name)
            if graded is not None and row.graded and row.run == graded.run:
                del untold.cases[row.name]
                self._graded(suite, row, round_=round_.id)
        found = verdict(rows)
        if not found.complete:
            return
        metrics.EVAL_PASS_RATIO.labels(namespace=suite.namespace, eval=suite.name).set(
            found.passed / found.total if found.total else 0.0
        )
        if untold.finish:
            untold.finish = False
            self._finished(suite, rows, round_=round_)

    def forget(self, namespace: str, name: str) -> None:
        """AgentEval ``namespace/name`` was deleted: nothing of it is told any more."""
        self._untold.pop((namespace, name), None)

    def _graded(self, suite: EvalRef, row: CaseRow, *, round_: str) -> None:
        failed = row.phase is CasePhase.FAILED
        outcome = "failed" if failed else "passed"
        metrics.EVAL_CASES.labels(namespace=suite.namespace, eval=suite.name, result=outcome).inc()
        if failed:
            self.events.record(
                involved(suite),
                type=EventType.WARNING,
                reason="CaseFailed",
                message=f"case {row.name} (run {row.run}) failed: {row.message}",
                key=(suite.uid, "CaseFailed", round_, row.name),
            )

    def _started(self, suite: EvalRef, rows: Sequence[CaseRow], *, round_: Round) -> None:
        agent = round_.agent
        self.events.record(
            involved(suite),
            type=EventType.NORMAL,
            reason="EvaluationStarted",
            message=(
                f"round {round_.id}: {len(rows)} cases against Agent {agent.name} "
                f"generation {agent.generation} (AgentEval generation {round_.generation})"
            ),
            key=(suite.uid, "EvaluationStarted", round_.id),
        )

    def _finished(self, suite: EvalRef, rows: Sequence[CaseRow], *, round_: Round) -> None:
        found = verdict(rows)
        if found.failed:
            kind, reason, text = EventType.WARNING, "EvaluationFailed", failed_cases_text(rows)
        else:
            kind, reason = EventType.NORMAL, "EvaluationPassed"
            text = f"{found.total} of {found.total} cases passed"
        self.events.record(
            involved(suite),
            type=kind,
            reason=reason,
            message=f"round {round_.id}: {text}",
            key=(suite.uid, "EvaluationFinished", round_.id),
        )


def involved(suite: EvalRef) -> Involved:
    """The AgentEval as the object of an Event."""
    return Involved("AgentEval", suite.name, suite.namespace, suite.uid)
