"""Which AgentTenant binds a namespace: the one rule the operator admits runs by and the
trajectory API shares its places by.

An AgentTenant binds the namespaces its ``spec.namespaces`` lists by name and those its
``spec.namespaceSelector`` (a Kubernetes ``LabelSelector``) matches; a name is more specific
than a label match. What belongs here: that rule, pure (the caller passes the tenants and the
namespace's labels). What does not: reading AgentTenants or namespaces (each program's own
client), what a tenant allows (``agentrun.operator.tenants.policy``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any, Protocol, TypeVar

__all__ = ["Ambiguous", "Binding", "Binds", "resolve", "selector_matches"]


def selector_matches(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """A Kubernetes ``LabelSelector`` (matchLabels AND matchExpressions) against ``labels``.

    An empty selector matches everything (as in the Kubernetes API). Operators: In, NotIn,
    Exists, DoesNotExist; an unknown operator matches nothing.
    """
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expression in selector.get("matchExpressions") or ():
        key = expression.get("key")
        values = set(expression.get("values") or ())
        operator = expression.get("operator")
        present = key in labels
        if operator == "In":
            ok = present and labels[key] in values
        elif operator == "NotIn":
            ok = not present or labels[key] not in values
        elif operator == "Exists":
            ok = present
        elif operator == "DoesNotExist":
            ok = not present
        else:
            ok = False
        if not ok:
            return False
    return True


class Binds(Protocol):
    """What the rule reads of a tenant: its name, the namespaces it lists, its selector."""

    @property
    def name(self) -> str: ...

    @property
    def namespaces(self) -> frozenset[str]: ...

    @property
    def selector(self) -> Mapping[str, Any] | None: ...


@dataclasses.dataclass(frozen=True, slots=True)
class Binding:
    """The binding part of one AgentTenant. Build with ``Binding.of``."""

    name: str
    namespaces: frozenset[str]
    """``spec.namespaces``."""
    selector: Mapping[str, Any] | None
    """``spec.namespaceSelector`` (``None``: selects nothing)."""

    @classmethod
    def of(cls, obj: Mapping[str, Any]) -> Binding:
        """An AgentTenant object's binding, read leniently: a malformed list or selector binds
        nothing by it (the operator refuses such a tenant's runs and says why; this only
        groups namespaces)."""
        meta = obj.get("metadata")
        spec = obj.get("spec")
        spec = spec if isinstance(spec, Mapping) else {}
        listed = spec.get("namespaces")
        selector = spec.get("namespaceSelector")
        return cls(
            name=str(meta.get("name") or "") if isinstance(meta, Mapping) else "",
            namespaces=frozenset(map(str, listed))
            if isinstance(listed, list | tuple)
            else frozenset(),
            selector=selector if isinstance(selector, Mapping) else None,
        )


def binds(tenant: Binds, namespace: str, labels: Mapping[str, str]) -> bool:
    """Whether ``tenant`` binds ``namespace`` (with these labels): listed, or selected."""
    if namespace in tenant.namespaces:
        return True
    return tenant.selector is not None and selector_matches(tenant.selector, labels)


class Ambiguous(Exception):
    """More than one AgentTenant binds the namespace (``tenants``: their names, sorted)."""

    def __init__(self, message: str, *, tenants: tuple[str, ...]) -> None:
        super().__init__(message)
        self.tenants = tenants


T = TypeVar("T", bound=Binds)


def resolve(
    tenants: Iterable[T], namespace: str, labels: Mapping[str, str], *, default: str | None = None
) -> T | None:
    """The tenant ``namespace`` belongs to: the one AgentTenant listing it by name in
    ``spec.namespaces``, else the one whose ``namespaceSelector`` matches it, else the
    ``default`` tenant (by name), else ``None``. A name is more specific than a label match, so
    a broad selector added later cannot take or block a namespace another tenant lists.

    Raises ``Ambiguous`` when several AgentTenants list the namespace, or none lists it and
    several select it (a budget must never be chosen by accident).
    """
    pool = list(tenants)
    bound = [t for t in pool if namespace in t.namespaces]
    if not bound:
        bound = [t for t in pool if binds(t, namespace, labels)]
    if len(bound) > 1:
        names = tuple(sorted(t.name for t in bound))
        raise Ambiguous(
            f"namespace {namespace!r} is bound by several AgentTenants: {', '.join(names)}",
            tenants=names,
        )
    if bound:
        return bound[0]
    if default:
        return next((t for t in pool if t.name == default), None)
    return None
