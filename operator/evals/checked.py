"""AgentEval specs as checked: each suite's checked once per generation, on the check threads,
and remembered within a bound of memory.

What belongs here: checking a suite's spec as written (``EvalSpec.of``; its cases' answer
schemas each a turn of its own on the check threads, ``FairWork``) and the memory of the specs
checked, by suite, uid and generation, bounded by weight (``SPECS_MEMORY``). What does not: the
spec's rules (``spec``), the answer schemas' check itself (``grading.check_schema``), what a
reconcile does with a spec or its error (``controller``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from agentrun.kernel import schemas

from ..platform.fairwork import FairWork
from ..platform.spec import SpecError
from ..platform.weighed import WeighedCache
from . import grading
from .spec import EvalSpec
from .status import EvalRef

SPECS_MEMORY = 64 * 2**20
"""Bytes of suites' checked specs kept, about (each weighed by ``schemas.footprint`` of the spec
as read, which the checked one holds again; the least recently used forgotten first): whatever
the suites, they cost the operator bounded memory; one forgotten is checked again at its next
reconcile."""


@dataclasses.dataclass(frozen=True, slots=True)
class _Checked:
    """A suite's spec as checked, and which object and generation it was checked from."""

    uid: str
    generation: int
    spec: EvalSpec | SpecError
    weight: int
    """``schemas.footprint`` of the spec as read."""


def _weight(checked: _Checked) -> int:
    return checked.weight


def _answer_schemas(body: Any) -> list[Mapping[str, Any]]:
    """The cases' answer schemas of an AgentEval's ``spec`` as written (objects only; the
    spec's own check says what else is wrong). Each is checked as a turn of its own on the
    check threads, which a running check holds to its end (``FairWork``): a suite checked
    whole held one for all of them, a minute at 200, while other tenants' checks waited."""
    cases = body.get("cases") if isinstance(body, Mapping) else None
    found: list[Mapping[str, Any]] = []
    for case in cases if isinstance(cases, list) else []:
        expect = case.get("expect") if isinstance(case, Mapping) else None
        answer = expect.get("answer") if isinstance(expect, Mapping) else None
        schema = answer.get("jsonSchema") if isinstance(answer, Mapping) else None
        if isinstance(schema, Mapping):
            found.append(schema)
    return found


class CheckedSpecs:
    """Suites' specs as checked (``of``), ``SPECS_MEMORY`` of them at most."""

    def __init__(self, checks: FairWork) -> None:
        """``checks``: the threads a spec is checked on."""
        self.checks = checks
        self.kept: WeighedCache[tuple[str, str], _Checked] = WeighedCache(SPECS_MEMORY, _weight)
        """By (namespace, name): the spec as checked, with the uid and generation it was
        checked from (checked once each while kept)."""

    async def of(self, suite: EvalRef, body: Any) -> EvalSpec | SpecError:
        """The suite's spec checked (``EvalSpec.of``) once per generation, on a thread: its
        answer schemas are checked against their meta-schemas, work bounded by the schemas'
        budget but not free, and the event loop serves every other tenant meanwhile."""
        key = (suite.namespace, suite.name)
        known = self.kept.get(key)
        if known is not None and (known.uid, known.generation) == (suite.uid, suite.generation):
            return known.spec

        def check() -> EvalSpec | SpecError:
            try:
                return EvalSpec.of(body)
            except SpecError as err:
                return err

        for schema in _answer_schemas(body):  # each its own turn: verdicts then remembered
            await self.checks.run(suite.namespace, grading.check_schema, schema)
        checked = await self.checks.run(suite.namespace, check)
        weight = schemas.footprint(body)
        self.kept[key] = _Checked(suite.uid, suite.generation, checked, weight)
        return checked

    def forget(self, namespace: str, name: str) -> None:
        """AgentEval ``namespace/name`` was deleted: its checked spec goes."""
        self.kept.pop((namespace, name), None)
