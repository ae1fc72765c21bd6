"""``CronAgentRun.spec`` as a pydantic model, checked into a ``Checked`` schedule, and the
AgentRun a schedule time creates.

What belongs here, pure: parsing the spec (errors name the field, ``spec.runTemplate.spec.goal``
and the like: the run template is checked by the same model as an AgentRun's spec), the names
the schedule marks its runs with (label, annotation, owner reference) and the manifest of a
scheduled run. What does not: the planning rule (``plan``), the API calls (``store``).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

import pydantic
from pydantic import BaseModel, ConfigDict, Field

from agentrun import kube

from .. import runs
from ..platform.conditions import rfc3339
from ..platform.spec import SpecError, describe, parse
from . import plan

CRONS = "cronagentruns"
"""The plural of ``CronAgentRun``."""
KIND = "CronAgentRun"
CRON_LABEL = "agentrun.dev/cronagentrun"
"""Label on every run a CronAgentRun created: the CronAgentRun's name."""
SCHEDULED_ANNOTATION = "agentrun.dev/scheduled-time"
"""Annotation on every run a CronAgentRun created: the schedule time it is for (RFC 3339)."""
DEFAULT_SUCCESSFUL_HISTORY = 3
DEFAULT_FAILED_HISTORY = 1


class _Spec(BaseModel):
    """Frozen, camelCase on the wire, unknown fields ignored (the CRD schema prunes them)."""

    model_config = ConfigDict(frozen=True, extra="ignore", populate_by_name=True)


class TemplateMeta(_Spec):
    """``spec.runTemplate.metadata``: copied onto every run."""

    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)


class RunTemplate(_Spec):
    """``spec.runTemplate``: the AgentRun each schedule time creates."""

    metadata: TemplateMeta = Field(default_factory=TemplateMeta)
    spec: dict[str, Any] = Field(default_factory=dict)


class CronAgentRunSpec(_Spec):
    """``CronAgentRun.spec``. Parse with ``CronAgentRunSpec.of``."""

    schedule: str
    time_zone: str | None = Field(default=None, alias="timeZone")
    concurrency_policy: plan.ConcurrencyPolicy = Field(
        default=plan.ConcurrencyPolicy.ALLOW, alias="concurrencyPolicy"
    )
    starting_deadline_seconds: int | None = Field(
        default=None, alias="startingDeadlineSeconds", ge=0
    )
    suspend: bool = False
    successful_runs_history_limit: int = Field(
        default=DEFAULT_SUCCESSFUL_HISTORY, alias="successfulRunsHistoryLimit", ge=0
    )
    failed_runs_history_limit: int = Field(
        default=DEFAULT_FAILED_HISTORY, alias="failedRunsHistoryLimit", ge=0
    )
    run_template: RunTemplate = Field(alias="runTemplate")

    @classmethod
    def of(cls, spec: Mapping[str, Any] | None) -> CronAgentRunSpec:
        """Parse a CronAgentRun's spec; raises ``SpecError`` naming the field."""
        try:
            return cls.model_validate(dict(spec or {}))
        except pydantic.ValidationError as err:
            raise SpecError(describe(err, where="spec")) from None


@dataclasses.dataclass(frozen=True, slots=True)
class Checked:
    """A CronAgentRun spec that can run: its schedule parsed, its policy, its template."""

    schedule: plan.Schedule
    policy: plan.Policy
    spec: CronAgentRunSpec


class Invalid(Exception):
    """A CronAgentRun that cannot run as written; ``reason`` is its ``Ready=False`` reason
    (``InvalidSchedule``, ``InvalidTimeZone``, ``InvalidRunTemplate``, ``InvalidSpec``), the
    message names the field."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def check(spec: Mapping[str, Any] | None) -> Checked:
    """Parse and check a CronAgentRun's spec; raises ``Invalid``."""
    try:
        parsed = CronAgentRunSpec.of(spec)
    except SpecError as err:
        raise Invalid("InvalidSpec", str(err)) from None
    try:
        schedule = plan.Schedule.parse(parsed.schedule, time_zone=parsed.time_zone)
    except plan.ScheduleError as err:
        reason = "InvalidTimeZone" if str(err).startswith("spec.timeZone") else "InvalidSchedule"
        raise Invalid(reason, str(err)) from None
    check_template_metadata(parsed.run_template.metadata)
    check_template(parsed.run_template.spec)
    policy = plan.Policy(
        concurrency=parsed.concurrency_policy,
        starting_deadline=(
            float(parsed.starting_deadline_seconds)
            if parsed.starting_deadline_seconds is not None
            else None
        ),
        suspend=parsed.suspend,
    )
    return Checked(schedule, policy, parsed)


LABEL_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
"""The name part of a Kubernetes qualified name (a label or annotation key): at most 63
characters (apimachinery's ``IsQualifiedName``)."""
KEY_PREFIX = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
"""A qualified name's optional prefix: a DNS-1123 subdomain of at most 253 characters."""
LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?")
"""A label value: empty, or at most 63 characters (apimachinery's ``IsValidLabelValue``)."""
ANNOTATIONS_MAX_BYTES = 262_144
"""Kubernetes' limit on one object's annotations, keys and values together (UTF-8 bytes)."""
RUN_ANNOTATIONS_ROOM = 4096
"""Bytes of ``ANNOTATIONS_MAX_BYTES`` a template leaves its runs for the annotations they are
given later (``agentrun.dev/admitted-uid``, ``cancel``, ``approve``/``deny`` and ``reviewer``,
``rerun``, kopf's progress records, which quote an error): a run created full had each refused."""


def qualified_name(key: str) -> bool:
    """Whether ``key`` is a Kubernetes qualified name: ``[prefix/]name`` as a label or an
    annotation key must be (the API server refuses an object with another)."""
    prefix, slash, name = key.rpartition("/")
    if slash and not (len(prefix) <= 253 and KEY_PREFIX.fullmatch(prefix)):
        return False
    return LABEL_NAME.fullmatch(name) is not None


def go_lower(key: str) -> str:
    """``key`` lower-cased as apimachinery's ``ValidateAnnotations`` checks an annotation key
    (Go's ``strings.ToLower``): as ``str.lower``, but for the two letters whose lower case is
    ASCII, U+0130 ('i' in Go, 'i' and a combining dot in Python) and U+212A KELVIN SIGN ('k')."""
    return key.replace("\u0130", "i").lower()


def check_template_metadata(meta: TemplateMeta) -> None:
    """``spec.runTemplate.metadata`` by the rules the API server applies to the run it is
    copied onto (keys qualified names, label values at most 63 characters of a restricted
    set, annotations at most ``ANNOTATIONS_MAX_BYTES`` less ``RUN_ANNOTATIONS_ROOM`` with the
    schedule's own); raises
    ``Invalid`` (``InvalidRunTemplate``) naming the field and the key. The CRD refuses the
    same at apply; this covers objects stored before it did."""
    where = "spec.runTemplate.metadata"
    for field, keys in (("labels", meta.labels), ("annotations", meta.annotations)):
        for key in sorted(keys):
            if not qualified_name(go_lower(key) if field == "annotations" else key):
                raise Invalid(
                    "InvalidRunTemplate",
                    f"{where}.{field}: key {key!r} is not a Kubernetes qualified name "
                    "(an optional DNS subdomain prefix and '/', then at most 63 letters, "
                    "digits, '-', '_' or '.', starting and ending with a letter or digit)",
                )
    for key, value in sorted(meta.labels.items()):
        if not LABEL_VALUE.fullmatch(value):
            raise Invalid(
                "InvalidRunTemplate",
                f"{where}.labels[{key!r}]: {value!r} is not a label value (empty, or at most "
                "63 letters, digits, '-', '_' or '.', starting and ending with a letter or "
                "digit)",
            )
    size = sum(len(k.encode()) + len(v.encode()) for k, v in meta.annotations.items())
    size += len(SCHEDULED_ANNOTATION) + len("2026-01-01T00:00:00Z")
    size += len(runs.HOLD_ANNOTATION) + len(runs.HOLD_SCHEDULE)
    most = ANNOTATIONS_MAX_BYTES - RUN_ANNOTATIONS_ROOM
    if size > most:
        raise Invalid(
            "InvalidRunTemplate",
            f"{where}.annotations: {size} bytes with {SCHEDULED_ANNOTATION}, over the {most} "
            f"a run's template may take of the {ANNOTATIONS_MAX_BYTES} Kubernetes allows on an "
            f"object ({RUN_ANNOTATIONS_ROOM} are left for the annotations a run is given later)",
        )


def check_template(spec: Mapping[str, Any]) -> None:
    """``spec.runTemplate.spec`` by the rules of an AgentRun's spec; raises ``Invalid``."""
    where = "spec.runTemplate.spec"
    try:
        run = parse(runs.AgentRunSpec, spec, where=where)
    except SpecError as err:
        raise Invalid("InvalidRunTemplate", str(err)) from None
    if bool(run.model) == (run.agent_ref is not None):
        raise Invalid(
            "InvalidRunTemplate",
            f"{where}: set exactly one of model (a run written in full) and agentRef "
            "(a run of an Agent)",
        )
    if not run.goal:
        raise Invalid("InvalidRunTemplate", f"{where}.goal: required")


def run_manifest(cron: Mapping[str, Any], checked: Checked, *, scheduled: float) -> dict[str, Any]:
    """The AgentRun ``cron`` (a CronAgentRun object as a dict) creates for the schedule time
    ``scheduled`` (epoch seconds): named by ``plan.run_name``, the template's labels and
    annotations plus ``CRON_LABEL``, ``SCHEDULED_ANNOTATION`` and ``runs.HOLD_ANNOTATION`` (no
    TTL deletes it before the schedule's status counted its end), owned by ``cron``
    (controller, blocking its deletion until the run is gone)."""
    meta = cron.get("metadata") or {}
    name = str(meta.get("name", ""))
    template = checked.spec.run_template
    return {
        "apiVersion": f"{kube.GROUP}/{kube.VERSION}",
        "kind": "AgentRun",
        "metadata": {
            "name": plan.run_name(name, scheduled),
            "namespace": str(meta.get("namespace", "")),
            "labels": {**template.metadata.labels, CRON_LABEL: name},
            "annotations": {
                **template.metadata.annotations,
                SCHEDULED_ANNOTATION: rfc3339(scheduled),
                runs.HOLD_ANNOTATION: runs.HOLD_SCHEDULE,
            },
            "ownerReferences": [owner_reference(cron)],
        },
        "spec": dict(template.spec),
    }


def owner_reference(cron: Mapping[str, Any]) -> dict[str, Any]:
    """The ``ownerReferences`` entry naming ``cron`` as its runs' controller."""
    meta = cron.get("metadata") or {}
    return {
        "apiVersion": f"{kube.GROUP}/{kube.VERSION}",
        "kind": KIND,
        "name": str(meta.get("name", "")),
        "uid": str(meta.get("uid", "")),
        "controller": True,
        "blockOwnerDeletion": True,
    }
