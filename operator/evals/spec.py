"""``AgentEval.spec`` as pydantic models, converted once into frozen values the controller uses.

What belongs here: the shape of an AgentEval's spec, its defaults (``parallelism``), the checks
the API server cannot make (a ``pattern`` the linear-time engine refuses, a ``jsonSchema`` that
is not a valid JSON Schema, holds such a pattern or is too large, duplicate case names when no
schema enforced them) and their messages, each naming the field
(``spec.cases[2].expect.answer.pattern: ...``). What does not: grading
(``grading``), rounds, runs and status (``status``, ``controller``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import pydantic
from pydantic import BaseModel, ConfigDict, Field

from agentrun import kernel
from agentrun.kernel import schemas

from ..platform.spec import USD, SpecError
from . import grading

DEFAULT_PARALLELISM = 2
"""Unfinished runs of one suite at once when ``spec.parallelism`` is unset."""


class _Spec(BaseModel):
    """Frozen, camelCase on the wire, unknown fields ignored (the CRD schema prunes them)."""

    model_config = ConfigDict(frozen=True, extra="ignore", populate_by_name=True)


class EvalAgentRef(_Spec):
    """``spec.agentRef`` and ``spec.cases[].agentRef``."""

    name: str = Field(min_length=1)


class AnswerSpec(_Spec):
    """``expect.answer``: exactly one of ``jsonSchema`` and ``pattern``."""

    json_schema: dict[str, Any] | None = Field(default=None, alias="jsonSchema")
    pattern: str | None = None


class ExpectSpec(_Spec):
    """``spec.cases[].expect``."""

    reason: kernel.TerminalReason = kernel.TerminalReason.COMPLETED
    outcome: kernel.Outcome | None = None
    max_cost_usd: USD | None = Field(default=None, alias="maxCostUSD")
    max_tokens: int | None = Field(default=None, alias="maxTokens", ge=0)
    max_steps: int | None = Field(default=None, alias="maxSteps", ge=0)
    tools_called: tuple[str, ...] = Field(default=(), alias="toolsCalled")
    tools_not_called: tuple[str, ...] = Field(default=(), alias="toolsNotCalled")
    answer: AnswerSpec | None = None


class CaseSpec(_Spec):
    """``spec.cases[]``."""

    name: str = Field(min_length=1, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    goal: str = Field(min_length=1)
    agent_ref: EvalAgentRef | None = Field(default=None, alias="agentRef")
    parameters: dict[str, str] = Field(default_factory=dict)
    expect: ExpectSpec = Field(default_factory=ExpectSpec)


class AgentEvalSpec(_Spec):
    """``AgentEval.spec`` as written."""

    agent_ref: EvalAgentRef = Field(alias="agentRef")
    cases: tuple[CaseSpec, ...] = Field(min_length=1)
    parallelism: int = Field(default=DEFAULT_PARALLELISM, ge=1, le=100)
    ttl_seconds_after_finished: int | None = Field(
        default=None, alias="ttlSecondsAfterFinished", ge=0
    )


@dataclasses.dataclass(frozen=True, slots=True)
class EvalCase:
    """One case, ready to run and grade."""

    name: str
    agent: str
    """The Agent it runs (the case's ``agentRef``, else the suite's)."""
    goal: str
    parameters: Mapping[str, str]
    expect: grading.Expectations


@dataclasses.dataclass(frozen=True, slots=True)
class EvalSpec:
    """An AgentEval's spec, checked. Parse with ``EvalSpec.of``."""

    agent: str
    """``spec.agentRef.name``."""
    cases: tuple[EvalCase, ...]
    parallelism: int
    ttl_seconds_after_finished: int | None

    @property
    def agents(self) -> frozenset[str]:
        """Every Agent a case runs."""
        return frozenset({self.agent, *(case.agent for case in self.cases)})

    @classmethod
    def of(cls, spec: Mapping[str, Any] | None) -> EvalSpec:
        """Parse and check an AgentEval's spec; raises ``SpecError`` naming the first bad field
        (``spec.cases[2].expect.answer.pattern: ...``)."""
        try:
            parsed = AgentEvalSpec.model_validate(dict(spec or {}))
        except pydantic.ValidationError as err:
            raise SpecError(_describe(err)) from None
        seen: set[str] = set()
        cases = []
        for index, case in enumerate(parsed.cases):
            where = f"spec.cases[{index}]"
            if case.name in seen:
                raise SpecError(f"{where}.name: {case.name!r} names an earlier case too")
            seen.add(case.name)
            cases.append(
                EvalCase(
                    name=case.name,
                    agent=(case.agent_ref or parsed.agent_ref).name,
                    goal=case.goal,
                    parameters=dict(case.parameters),
                    expect=expectations(case.expect, where=f"{where}.expect"),
                )
            )
        return cls(
            agent=parsed.agent_ref.name,
            cases=tuple(cases),
            parallelism=parsed.parallelism,
            ttl_seconds_after_finished=parsed.ttl_seconds_after_finished,
        )


def expectations(expect: ExpectSpec, *, where: str) -> grading.Expectations:
    """``expect`` as grading's ``Expectations``; raises ``SpecError`` naming the field under
    ``where`` (e.g. ``spec.cases[0].expect``)."""
    both = sorted(set(expect.tools_called) & set(expect.tools_not_called))
    if both:
        raise SpecError(f"{where}.toolsNotCalled: {', '.join(both)} also in {where}.toolsCalled")
    return grading.Expectations(
        reason=expect.reason,
        outcome=expect.outcome,
        max_cost_usd=expect.max_cost_usd,
        max_tokens=expect.max_tokens,
        max_steps=expect.max_steps,
        tools_called=expect.tools_called,
        tools_not_called=expect.tools_not_called,
        answer=_answer_check(expect.answer, where=f"{where}.answer"),
    )


def _answer_check(answer: AnswerSpec | None, *, where: str) -> grading.AnswerCheck | None:
    if answer is None:
        return None
    if (answer.json_schema is None) == (answer.pattern is None):
        raise SpecError(f"{where}: set exactly one of jsonSchema and pattern")
    if answer.pattern is not None:
        problem = schemas.pattern_problem(answer.pattern)
        if problem is not None:
            raise SpecError(f"{where}.pattern: {problem}")
        return grading.PatternAnswer(answer.pattern)
    assert answer.json_schema is not None
    problem = grading.check_schema(answer.json_schema)
    if problem is not None:
        raise SpecError(f"{where}.jsonSchema: not a valid JSON Schema: {problem}")
    return grading.JsonSchemaAnswer(answer.json_schema)


def _describe(err: pydantic.ValidationError) -> str:
    """The first error as ``spec.cases[2].expect.maxSteps: <what is wrong>``."""
    first = err.errors()[0]
    path = "spec"
    for part in first["loc"]:
        path += f"[{part}]" if isinstance(part, int) else f".{part}"
    if first["type"] == "value_error":
        return f"{path}: {first['ctx']['error']}"
    if first["type"] == "missing":
        return f"{path}: required"
    return f"{path}: {first['input']!r} is invalid ({first['msg'][0].lower()}{first['msg'][1:]})"
