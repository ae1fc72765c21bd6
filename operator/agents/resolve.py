"""Agents: an AgentRun with ``spec.agentRef`` resolved against its Agent into a full spec.

What belongs here: the resolution rule (which fields come from the Agent, which from the run,
how ``{{ params.NAME }}`` references are substituted), the digest of a resolved spec, and
whether an Agent can be run (its ``Ready`` condition), all pure; reading and recording the
resolution on the run (``status.agent``, ``status.resolvedSpec``, so a run executes the Agent as
it was when the run was created) is ``store``. What does not: tenant policy and admission
(``tenants``, ``admission``), which apply to the resolved spec like to any other.

The rule: the Agent gives ``model``, ``instructions``, ``tools``, ``output``, ``approval`` and
``budget``; the run gives ``goal`` and may override the budget's caps (``maxSteps``,
``maxToolCalls``, ``maxTokens``, ``maxCostUSD``, ``timeout``). ``onExhausted`` and
``noProgress`` always come from the Agent (the API server fills the run's own with defaults,
so they cannot tell an intent). References are substituted in the run's goal and the Agent's
instructions.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections.abc import Collection, Mapping
from typing import Any

from agentrun.kernel import schemas

from .. import runs
from ..platform.conditions import condition as make_condition
from ..platform.spec import ObjectMeta, SpecError, not_found, parse, with_hints
from .spec import AgentSpec

OPEN, CLOSE = "{{", "}}"
"""What starts and ends a placeholder."""
PLACEHOLDER = re.compile(r"\s*params\.([A-Za-z_][A-Za-z0-9_]*)\s*")
"""What a placeholder holds: ``params.NAME``, spaces around it optional."""
FROM_AGENT = ("model", "instructions", "tools", "output", "approval")
"""Spec fields a run of an Agent takes from the Agent as written."""
RUN_CAPS = ("maxSteps", "maxToolCalls", "maxTokens", "maxCostUSD", "timeout")
"""Budget fields a run of an Agent may set over the Agent's."""
MAX_RENDERED_CHARS = 65_536
"""Longest goal or instructions after substitution: the AgentRun CRD's bound on the same field
written in full (``maxLength``), so a resolved spec is never larger than a run could be
written. Placeholders multiply text (64 Ki characters of instructions referencing one 64 Ki
parameter thousands of times), so the render stops here instead of building the whole."""


class InvalidRef(Exception):
    """The run's ``spec.agentRef`` cannot be resolved; the message names the field."""


@dataclasses.dataclass(frozen=True, slots=True)
class Template:
    """A text with ``{{ params.NAME }}`` placeholders, parsed (``parse_template``)."""

    pieces: tuple[str, ...]
    """Literal text and parameter names alternating, starting and ending with literal text
    (possibly empty): ``"a {{ params.x }} b"`` is ``("a ", "x", " b")``."""

    @property
    def names(self) -> frozenset[str]:
        """The parameter names the text references."""
        return frozenset(self.pieces[1::2])

    def render(self, values: Mapping[str, str], *, limit: int = MAX_RENDERED_CHARS) -> str:
        """The text with each placeholder replaced by ``values[NAME]``, at most ``limit``
        characters: the render stops at the first piece past it (memory stays bounded by
        ``limit``) and raises ``TooLong``. Raises ``KeyError`` for a name ``values`` lacks
        (check ``names`` first)."""
        size = 0
        out: list[str] = []
        for index, piece in enumerate(self.pieces):
            text = values[piece] if index % 2 else piece
            size += len(text)
            if size > limit:
                raise TooLong(limit)
            out.append(text)
        return "".join(out)


class TooLong(Exception):
    """A rendered template went past its limit (``args[0]``, characters)."""


def parse_template(text: str, *, field: str) -> Template:
    """``text`` split at its placeholders; raises ``InvalidRef`` naming ``field`` for a
    malformed one: a ``{{`` with no ``}}`` after it, or a ``{{ ... }}`` that does not hold
    exactly ``params.NAME`` (NAME: a letter or ``_``, then letters, digits, ``_``)."""
    pieces: list[str] = []
    done = 0
    while (start := text.find(OPEN, done)) >= 0:
        end = text.find(CLOSE, start + len(OPEN))
        if end < 0:
            raise InvalidRef(
                f"{field}: {OPEN!r} at character {start} has no matching {CLOSE!r} "
                f"(a placeholder is {{{{ params.NAME }}}})"
            )
        found = PLACEHOLDER.fullmatch(text, start + len(OPEN), end)
        if found is None:
            written = text[start : end + len(CLOSE)]
            raise InvalidRef(
                f"{field}: placeholder {written!r} at character {start} is not "
                f"{{{{ params.NAME }}}}"
            )
        pieces += [text[done:start], found.group(1)]
        done = end + len(CLOSE)
    pieces.append(text[done:])
    return Template(tuple(pieces))


def check_names(template: Template, declared: Collection[str], *, field: str) -> None:
    """Raise ``InvalidRef`` naming ``field`` if ``template`` references a parameter not in
    ``declared``."""
    unknown = sorted(template.names - set(declared))
    if unknown:
        names = ", ".join(f"{{{{ params.{name} }}}}" for name in unknown)
        listed = ", ".join(sorted(declared)) or "none"
        raise InvalidRef(
            f"{field}: references {names}, not a parameter of the Agent (declared: {listed})"
        )


@dataclasses.dataclass(frozen=True, slots=True)
class Resolution:
    """A run's ``spec.agentRef`` resolved: the spec it executes and where it came from."""

    spec: dict[str, Any]
    """The AgentRun spec as if written in full (no ``agentRef``)."""
    agent: str
    """The Agent's name."""
    generation: int
    """The Agent's ``metadata.generation`` at resolution."""
    digest: str
    """``sha256:<hex>`` of ``spec`` (``digest_of``)."""

    def status(self) -> dict[str, Any]:
        """The run's ``status.agent`` and ``status.resolvedSpec``."""
        return {
            "agent": {"name": self.agent, "generation": self.generation, "digest": self.digest},
            "resolvedSpec": self.spec,
        }


def digest_of(spec: Mapping[str, Any]) -> str:
    """``sha256:<64 hex>`` of ``spec`` as canonical JSON (keys sorted, no spaces, UTF-8)."""
    canonical = json.dumps(spec, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


def substitute(text: str, values: Mapping[str, str], *, field: str) -> str:
    """``text`` with each ``{{ params.NAME }}`` replaced by ``values[NAME]``; raises
    ``InvalidRef`` naming ``field`` for a malformed placeholder (``parse_template``), a name
    ``values`` lacks (an undeclared parameter), or a result over ``MAX_RENDERED_CHARS``."""
    template = parse_template(text, field=field)
    check_names(template, values, field=field)
    try:
        return template.render(values)
    except TooLong as err:
        raise InvalidRef(
            f"{field}: with its parameters substituted it is longer than {err.args[0]} "
            "characters (the limit of the field written in full); shorten it or the "
            "parameter values it references"
        ) from None


def parameter_values(agent: str, spec: AgentSpec, given: Mapping[str, str]) -> dict[str, str]:
    """Every declared parameter's value: given, else its default, else ``""``; raises
    ``InvalidRef`` naming ``spec.agentRef.parameters.<name>`` for an undeclared or a missing
    required one."""
    declared = {p.name: p for p in spec.parameters}
    for name in sorted(given):
        if name not in declared:
            raise InvalidRef(
                f"spec.agentRef.parameters.{name}: Agent {agent!r} declares no parameter "
                f"{name!r} (it declares: {', '.join(sorted(declared)) or 'none'})"
            )
    values: dict[str, str] = {}
    for name, param in declared.items():
        if name in given:
            values[name] = given[name]
        elif param.required:
            hint = f" ({param.description})" if param.description else ""
            raise InvalidRef(
                f"spec.agentRef.parameters.{name}: required by Agent {agent!r} and not given{hint}"
            )
        else:
            values[name] = param.default or ""
    return values


def resolve(run_spec: Mapping[str, Any], agent: Mapping[str, Any]) -> Resolution:
    """The spec a run of ``agent`` (an Agent object as a dict) executes; raises ``InvalidRef``
    naming the field (an invalid reference, parameter or Agent spec)."""
    try:
        ref = parse(runs.AgentRefSpec, run_spec.get("agentRef"), where="spec.agentRef")
        meta = ObjectMeta.of(agent)
        parsed = AgentSpec.of(meta.name, agent.get("spec"))
    except SpecError as err:
        raise InvalidRef(str(err)) from None
    written: Mapping[str, Any] = agent.get("spec") or {}
    _check_output_size(ref.name, written)
    values = parameter_values(ref.name, parsed, ref.parameters)
    spec: dict[str, Any] = {key: written[key] for key in FROM_AGENT if key in written}
    spec["goal"] = substitute(str(run_spec.get("goal", "")), values, field="spec.goal")
    if parsed.instructions is not None:
        where = f"Agent {ref.name!r} spec.instructions"
        spec["instructions"] = substitute(parsed.instructions, values, field=where)
    budget = dict(written.get("budget") or {})
    own: Mapping[str, Any] = run_spec.get("budget") or {}
    budget.update({cap: own[cap] for cap in RUN_CAPS if cap in own})
    if budget:
        spec["budget"] = budget
    return Resolution(spec, ref.name, meta.generation, digest_of(spec))


def _check_output_size(agent: str, written: Mapping[str, Any]) -> None:
    """Raise ``InvalidRef`` when the Agent's output schema is over ``MAX_SCHEMA_BYTES``: the
    resolved spec is written to the run's status, where it must fit (the schema's full check
    is admission's, ``admission.lookup``)."""
    output = written.get("output")
    if not isinstance(output, Mapping) or "schema" not in output:
        return
    size = len(json.dumps(output["schema"], separators=(",", ":"), ensure_ascii=False).encode())
    if size > schemas.MAX_SCHEMA_BYTES:
        raise InvalidRef(
            f"Agent {agent!r} spec.output.schema: {size} bytes as JSON, over the "
            f"{schemas.MAX_SCHEMA_BYTES}-byte limit"
        )


def recorded(status: Mapping[str, Any]) -> Resolution | None:
    """The resolution recorded in a run's status, or ``None`` if there is none (or it does
    not match its digest)."""
    agent = status.get("agent")
    spec = status.get("resolvedSpec")
    if not isinstance(agent, Mapping) or not isinstance(spec, Mapping):
        return None
    resolution = Resolution(
        dict(spec), str(agent.get("name", "")), int(agent.get("generation") or 0), digest_of(spec)
    )
    return resolution if agent.get("digest") == resolution.digest else None


@dataclasses.dataclass(frozen=True, slots=True)
class Readiness:
    """Whether runs of an Agent can be admitted as far as the Agent decides: its ``Ready``
    condition."""

    ready: bool
    reason: str
    """CamelCase: ``Ready``, ``InvalidSpec``, ``ModelNotFound``, ``UnknownTools``."""
    message: str


def readiness(
    agent: Mapping[str, Any], *, model_found: bool, known_tools: Collection[str]
) -> Readiness:
    """Check an Agent object (as a dict) against what exists: its AgentModel (``model_found``)
    and the worker's tool catalog (``known_tools``); ``InvalidSpec`` also covers instructions
    with a malformed placeholder or one naming an undeclared parameter, and an output schema
    its runs could not use (``schemas.schema_problem``: too large, a pattern RE2 refuses,
    invalid). Pure; checking the schema takes bounded but real CPU: call it off the event
    loop."""
    name = str((agent.get("metadata") or {}).get("name", ""))
    try:
        spec = AgentSpec.of(name, agent.get("spec"))
    except SpecError as err:
        return Readiness(False, "InvalidSpec", str(err))
    output = (agent.get("spec") or {}).get("output") or {}
    if "schema" in output:
        problem = schemas.known_problem(output["schema"])
        if problem is not None:
            return Readiness(False, "InvalidSpec", f"spec.output.schema: {problem}")
    if spec.instructions is not None:
        try:
            template = parse_template(spec.instructions, field="spec.instructions")
            check_names(template, [p.name for p in spec.parameters], field="spec.instructions")
        except InvalidRef as err:
            return Readiness(False, "InvalidSpec", str(err))
    if not model_found:
        return Readiness(
            False, "ModelNotFound", f"spec.model: {not_found('AgentModel', spec.model)}"
        )
    unknown = sorted(set(spec.tools) - set(known_tools))
    if unknown:
        return Readiness(
            False,
            "UnknownTools",
            f"spec.tools: unknown tool(s) {with_hints(unknown, known_tools)}; the worker's "
            "catalog has "
            f"{', '.join(sorted(known_tools))}",
        )
    return Readiness(True, "Ready", f"AgentModel {spec.model!r} and every tool exist")


def ready_status(
    found: Readiness,
    *,
    generation: int,
    previous: Mapping[str, Any],
    now: float,
    condition: str = "Ready",
) -> dict[str, Any] | None:
    """The Agent's ``.status`` for ``found`` (or another object's, with its one ``condition``
    type), or ``None`` when ``previous`` (its status now) already says so.
    ``lastTransitionTime`` moves only when the condition's status flips."""
    kind = condition
    old = next((c for c in previous.get("conditions") or [] if c.get("type") == kind), None)
    flag = "True" if found.ready else "False"
    if (
        old is not None
        and previous.get("observedGeneration") == generation
        and (old.get("status"), old.get("reason"), old.get("message"))
        == (flag, found.reason, found.message)
    ):
        return None
    made = make_condition(
        kind,
        status=found.ready,
        reason=found.reason,
        message=found.message,
        at=now,
        generation=generation,
    )
    if old is not None and old.get("status") == flag and old.get("lastTransitionTime"):
        made["lastTransitionTime"] = old["lastTransitionTime"]
    return {"observedGeneration": generation, "conditions": [made]}
