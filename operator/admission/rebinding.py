"""Which tenant's queue a run not yet admitted belongs in: the tenant its namespace binds now,
not the one it was queued under.

A namespace's binding changes when an AgentTenant is made, edited (``spec.namespaces``,
``spec.namespaceSelector``), made invalid or deleted (``Tenants.bindings`` counts these), and
when the namespace is relabelled (noticed by no watch: its labels are read again at a queue's
first pass ``RECHECK_EVERY`` seconds after the last look, the ledger sweep pumping every queue
every few seconds, and at once by a new run there, ``Tenants.resolve``). The queue pump
looks at the namespaces of a tenant's queued runs again at its next pass after either
(``due``), and each run's fate follows from what its namespace binds now (``fate``):

- the tenant it was queued under: it stays where it is;
- another tenant (a default tenant included): it moves to that tenant's queue, in the place
  its creation time gives it there, as a new run would be queued — but not to the default
  tenant while the tenant it was queued under was deleted less than ``DELETED_GRACE``
  seconds ago (it waits, as below);
- no tenant (or several): it ends as a new run there is rejected (``invalid_spec``, naming
  why, charged to no tenant), unless the tenant it was queued under is invalid, or was
  deleted less than ``DELETED_GRACE`` seconds ago: such a run waits (``TenantInvalid``,
  ``TenantMissing``) until its tenant is fixed, applied again (a delete and a create, as
  Argo CD's Replace with Force or ``kubectl replace --force`` do) or deleted for good;
- another operator shard's tenant: it leaves the queue and is handed to that shard's owner
  (``Bound.here`` false: its status names the tenant and shows no phase, so the owner's kopf
  admits it as a new run); before, it stayed for ever, ``TenantMissing`` once its tenant was
  deleted, no process queueing it;
- unknown (the namespace could not be read): it stays, and is looked at again at the next
  pass due.

Runs already admitted are in no queue: they stay charged to the tenant that admitted them.

What belongs here (pure): those rules. What does not: reading the bindings
(``tenants.Tenants.resolve``), moving or ending the runs (``pump``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping

from agentrun.ledger import QueuedRun

RECHECK_EVERY = 30.0
"""Seconds after which a queue's namespaces are read again though no AgentTenant's binding
changed: how late a relabelled namespace's queued runs move, at worst (one read of its labels
per namespace in the queue, and only when some AgentTenant selects by label)."""

DELETED_GRACE = RECHECK_EVERY
"""Seconds a deleted AgentTenant's queued runs whose namespace binds no tenant (or falls to
the default tenant) wait for it to be applied again before they end (or move to the default
tenant), counted from the first look at its queue that found it gone. A delete and a create
of the same tenant (a GitOps replace) kept none of them before: the pass the deletion kicked
ended them all, or moved them to the default tenant's queue and budget, the tenant back a
moment later."""


@dataclasses.dataclass(frozen=True, slots=True)
class Bound:
    """The namespace binds AgentTenant ``tenant`` now."""

    tenant: str
    fallback: bool = False
    """``tenant`` is the platform's default tenant, charged only because no AgentTenant binds
    the namespace (one listing it or selecting it by label binds it as any other does)."""
    here: bool = True
    """``tenant`` is one of this operator process's shards' (else its owner admits the run:
    the run is handed over)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Unbound:
    """The namespace binds no tenant now (or several, or an invalid one)."""

    message: str
    """Why (``tenants.NoTenant``'s message): what a new run there ends with."""


@dataclasses.dataclass(frozen=True, slots=True)
class Unknown:
    """What the namespace binds cannot be told now (its labels unreadable)."""


Binding = Bound | Unbound | Unknown
"""What a namespace was found to bind when a queue's namespaces were looked at."""


Fate = Bound | Unbound
"""What becomes of a queued run whose namespace's binding changed (one that stays has none):
``Bound``, it moves to that tenant's queue (or to its shard's owner: ``Bound.here``);
``Unbound``, it ends unadmitted as a new run in its namespace would (``invalid_spec``, with the
message)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Checked:
    """When a tenant's queue's namespaces were last looked at."""

    bindings: int
    """``Tenants.bindings`` then."""
    at: float
    """Epoch seconds."""


def due(
    last: Checked | None,
    *,
    bindings: int,
    now: float,
    every: float = RECHECK_EVERY,
    grace_ends: float | None = None,
) -> bool:
    """Whether a queue last looked at ``last`` (``None``: never, in this process) is looked at
    again at a pass at ``now`` (epoch seconds), ``bindings`` the AgentTenants' binding count
    then: after any binding changed, ``every`` seconds after the last look, or at the first
    pass at or after ``grace_ends`` (a deleted tenant's ``DELETED_GRACE`` ends then: its runs
    bound to no tenant end) when the last look was before it."""
    if last is None or last.bindings != bindings or now - last.at >= every:
        return True
    return grace_ends is not None and last.at < grace_ends <= now


def namespaces(queue: Iterable[QueuedRun]) -> list[str]:
    """The namespaces of the runs in ``queue``, each once, sorted."""
    return sorted({run.namespace for run in queue})


def fate(queued_in: str, binding: Binding, *, waits: bool) -> Fate | None:
    """What becomes of a run queued in ``queued_in`` whose namespace binds ``binding`` now;
    ``waits``: whether ``queued_in`` is an invalid AgentTenant, or one deleted less than
    ``DELETED_GRACE`` seconds ago (``deleted_lately``), whose runs bound to no tenant (or to
    the default tenant only for that: ``Bound.fallback``) wait.
    ``None``: it stays (see the module docstring)."""
    if isinstance(binding, Bound):
        stays = binding.tenant == queued_in or (binding.fallback and waits)
        return None if stays else binding
    if isinstance(binding, Unbound) and not waits:
        return binding
    return None


def fates(
    queued_in: str,
    queue: Iterable[QueuedRun],
    bindings: Mapping[str, Binding],
    *,
    waits: bool,
) -> list[tuple[QueuedRun, Fate]]:
    """The runs of ``queued_in``'s ``queue`` that leave it, head first, each with its fate
    (``fate``; ``waits`` as there), ``bindings`` what each run's namespace binds now (a
    namespace not in it: ``Unknown``)."""
    left: list[tuple[QueuedRun, Fate]] = []
    for run in queue:
        found = fate(queued_in, bindings.get(run.namespace, Unknown()), waits=waits)
        if found is not None:
            left.append((run, found))
    return left


def deleted_lately(
    missing_since: float | None, *, now: float, grace: float = DELETED_GRACE
) -> bool:
    """Whether a tenant first found deleted at ``missing_since`` (epoch seconds; ``None``: it
    is not deleted) was deleted less than ``grace`` seconds before ``now``."""
    return missing_since is not None and now - missing_since < grace
