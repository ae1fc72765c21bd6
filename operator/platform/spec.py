"""What every spec shares: the base model, the value types, object metadata, the one spec error.

What belongs here: ``SpecModel`` (frozen, camelCase on the wire, unknown fields ignored),
``Duration`` and USD amounts, ``ObjectMeta`` (the part of ``metadata`` the operator reads),
``parse`` (a mapping as a model) and the conversion of a validation error into one message
naming the field (``spec.budget.maxCostUSD: 'lots' is not a decimal number``), and
``SpecError``, the one exception for a spec that cannot be used as written. What does not: any
kind's spec (each kind's ``spec`` module).

The API server already checks most of a spec against its CRD schema; parsing again keeps the
operator safe from objects written before a schema change, or without one (tests).
"""

from __future__ import annotations

import dataclasses
import difflib
import itertools
from collections.abc import Iterable, Mapping
from decimal import Decimal, InvalidOperation
from typing import Annotated, Any, TypeVar

import pydantic
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PlainValidator

from agentrun import protocol


class SpecError(ValueError):
    """A spec that cannot be used as written (it does not parse, or it asks for what is not
    there or not allowed); the message names the field."""


class ReferenceMissing(SpecError):
    """An object the spec names does not exist now (its AgentModel, an AgentToolServer); the
    message names the field (``not_found``). A new run naming it is rejected; a run already
    queued, accepted while it existed, waits for it to be made again (an object deleted and
    applied again, as a GitOps tool replacing it does, loses no queued run)."""


def not_found(kind: str, name: str, *, namespace: str | None = None) -> str:
    """The message for a referenced object that does not exist, with the command that lists
    the objects of ``kind`` there: ``AgentModel 'gpt-5' not found (cluster-scoped):
    `kubectl get agentmodels` lists those there``. ``namespace``: ``None`` for a
    cluster-scoped kind."""
    plural = f"{kind.lower()}s"
    if namespace is None:
        where, flag = "(cluster-scoped)", ""
    else:
        where, flag = f"in namespace {namespace}", f" -n {namespace}"
    return f"{kind} {name!r} not found {where}: `kubectl get {plural}{flag}` lists those there"


HINT_CHOICES = 1_000
"""At most this many choices are compared for a ``hint`` (a tool server chooses how many
tools it lists; beyond this none is suggested)."""
HINT_COMPARISONS = 2_000
"""Most (name, choice) pairs one message's hints look at (``difflib``'s cheap bounds, linear
in the names' length), whatever the number of names and choices a tenant wrote."""
HINT_RATIOS = 100
"""Most full ``difflib`` ratios (quadratic in the names' length: names with the same letters
in another order pass the cheap bounds) one message's hints compute."""
HINT_CUTOFF = 0.75
"""The ratio a choice needs to be suggested."""


@dataclasses.dataclass(slots=True)
class _HintWork:
    """What is left of one message's hint work (``HINT_COMPARISONS``, ``HINT_RATIOS``)."""

    comparisons: int = HINT_COMPARISONS
    ratios: int = HINT_RATIOS


def hint(name: str, choices: Iterable[str], *, work: _HintWork | None = None) -> str:
    """`` (did you mean 'calculator'?)`` when one of ``choices`` is close enough to ``name`` to
    be a misspelling of it (``difflib``'s ratio at least ``HINT_CUTOFF``, compared as written;
    the first of the closest in sorted order); ``""`` otherwise, when there are more than
    ``HINT_CHOICES`` choices, or for what ``work`` (one message's, shared by its names) no
    longer covers. Bounded: a tenant writes the names, and may write the choices."""
    known = sorted(set(itertools.islice(choices, HINT_CHOICES + 1)))
    if len(known) > HINT_CHOICES:
        return ""
    work = work if work is not None else _HintWork()
    matcher = difflib.SequenceMatcher(b=name)
    best, best_ratio = "", 0.0
    for choice in known:
        if work.comparisons <= 0:
            break
        work.comparisons -= 1
        matcher.set_seq1(choice)
        needed = max(best_ratio, HINT_CUTOFF)
        if matcher.real_quick_ratio() < needed or matcher.quick_ratio() < needed:
            continue
        if work.ratios <= 0:
            break
        work.ratios -= 1
        if (ratio := matcher.ratio()) >= needed and ratio > best_ratio:
            best, best_ratio = choice, ratio
    return f" (did you mean {best!r}?)" if best else ""


def with_hints(names: Iterable[str], choices: Iterable[str]) -> str:
    """``names`` sorted and comma-separated, each with its ``hint`` among ``choices`` (one
    work bound for them all): ``calcualtor (did you mean 'calculator'?), rm_rf``."""
    known, work = tuple(choices), _HintWork()
    return ", ".join(name + hint(name, known, work=work) for name in sorted(set(names)))


@dataclasses.dataclass(frozen=True, slots=True, order=True)
class Duration:
    """A Go-style duration (``90s``, ``1h30m``, ``250ms``): compared by its seconds, printed
    as written."""

    seconds: float
    text: str = dataclasses.field(compare=False)

    def __str__(self) -> str:
        return self.text

    @classmethod
    def parse(cls, value: Any) -> Duration:
        """Raises ``ValueError`` for anything but a duration (a number alone has no unit)."""
        if isinstance(value, Duration):
            return value
        text = str(value).strip()
        try:
            return cls(protocol.duration_seconds(text), text)
        except ValueError:
            raise ValueError(f"{value!r} is not a duration like 90s, 10m or 1h30m") from None


def _usd(value: Any) -> Decimal:
    """A non-negative decimal amount (USD); raises ``ValueError``."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a decimal number")
    try:
        number = Decimal(str(value))
    except InvalidOperation as err:
        raise ValueError(f"{value!r} is not a decimal number") from err
    if not number.is_finite() or number < 0:
        raise ValueError(f"{value!r} must be a non-negative decimal")
    return number


DurationField = Annotated[Duration, PlainValidator(Duration.parse)]
USD = Annotated[Decimal, PlainValidator(_usd)]


class SpecModel(BaseModel):
    """The base of every spec model: frozen, camelCase on the wire, unknown fields ignored (the
    CRD schema prunes them)."""

    model_config = ConfigDict(frozen=True, extra="ignore", populate_by_name=True)


M = TypeVar("M", bound=SpecModel)


def parse(model: type[M], data: Mapping[str, Any] | None, *, where: str) -> M:
    """``data`` as ``model``; raises ``SpecError`` naming the first bad field under ``where``
    (e.g. ``spec``)."""
    try:
        return model.model_validate(dict(data or {}))
    except pydantic.ValidationError as err:
        raise SpecError(describe(err, where=where)) from None


def describe(err: pydantic.ValidationError, *, where: str) -> str:
    """The first error as ``<where>.<field path>: <what is wrong>``."""
    first = err.errors()[0]
    path = ".".join([where, *(str(part) for part in first["loc"])])
    if first["type"] == "value_error":
        return f"{path}: {first['ctx']['error']}"
    return f"{path}: {first['input']!r} is invalid ({first['msg'][0].lower()}{first['msg'][1:]})"


Generation = Annotated[int, BeforeValidator(lambda value: value or 1)]
"""``metadata.generation``; an object that has none (a stand-in, an old fixture) is at 1."""


class ObjectMeta(SpecModel):
    """The part of ``metadata`` the operator reads."""

    name: str = ""
    uid: str = ""
    generation: Generation = 1
    annotations: dict[str, str] = Field(default_factory=dict)

    @classmethod
    def of(cls, obj: Mapping[str, Any]) -> ObjectMeta:
        """The metadata of a Kubernetes object (as a dict); raises ``SpecError``."""
        return parse(cls, obj.get("metadata"), where="metadata")
