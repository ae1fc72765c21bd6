"""The AgentTenants the operator knows, and the binding of namespaces to them.

What belongs here: keeping that registry current (a kopf watch puts and removes AgentTenants)
and answering "which tenant" for a namespace, or why none. What does not: the policy itself
(``policy``), queues, the ledger and status writes (``admission``, ``writer``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import cachetools

from agentrun import metrics
from agentrun.ledger import UsageFloor
from agentrun.protocol import DEFAULT_TENANT, UrlRule

from ..platform.kubeapi import ApiError, KubeApi
from ..platform.spec import ObjectMeta, not_found
from . import policy as rules
from .policy import TenantPolicy
from .status import usage_seen
from .waits import QueueWait, WaitReason

log = logging.getLogger(__name__)


class NoTenant(LookupError):
    """The run's namespace is bound to no AgentTenant (and no default tenant applies)."""


class Tenants:
    """The AgentTenants the operator knows (kept current by a kopf watch) and the binding of
    namespaces to them."""

    def __init__(
        self, api: KubeApi, *, default: str | None = None, default_turns: int | None = None
    ) -> None:
        """``api`` reads namespace labels for selectors; ``default`` is the tenant charged for
        namespaces no AgentTenant binds; ``default_turns`` the ``maxConcurrentTurns`` of a
        tenant that sets none (``None`` or 0: none)."""
        self.api = api
        self.default = default or None
        self.default_turns = default_turns or None
        for known in {DEFAULT_TENANT, self.default or DEFAULT_TENANT}:
            metrics.know_tenant(known)  # runs no tenant binds are counted under the default
        self.policies: dict[str, TenantPolicy] = {}
        self.invalid: dict[str, tuple[int, str]] = {}
        """AgentTenants that cannot be enforced: (generation, why), shown in their status."""
        self._ambiguous: dict[str, Mapping[str, str]] = {}
        """Namespaces found bound by several tenants when a run came: namespace → its labels
        as read then (``ambiguous_of`` judges them again on the tenants as they are now)."""
        self.seen: dict[str, UsageFloor] = {}
        """What each AgentTenant's status last said its window used (``status.usage_seen``):
        the floor of its ledger entry until the operator has read the entry itself."""
        self._invalid_namespaces: dict[str, frozenset[str]] = {}
        self._resolved: cachetools.LRUCache[str, str] = cachetools.LRUCache(10_000)
        """The tenant each namespace was last resolved to (``party``)."""
        self._listing: dict[str, list[str]] | None = None
        """namespace → the valid AgentTenants listing it by name (``party``), made again after
        a binding changed (``_rebound``)."""
        self._shared: dict[str, tuple[str, ...]] | None = None
        """namespace → the AgentTenants binding it when several do (``ambiguous_of``), made
        again after a binding changed or a namespace was found shared or no longer."""
        self._unbound_learnt: cachetools.LRUCache[str, None] = cachetools.LRUCache(10_000)
        """Namespaces ``learn`` found bound to no tenant (or to several): not read again on
        their objects' every event, until an AgentTenant's binding changes (``_rebound``)."""
        self.bindings = 0
        """How many times a binding changed (``_rebound``): the queue pump looks at the
        namespaces of queued runs again when it moved (``admission.rebinding``)."""

    def put(self, obj: Mapping[str, Any]) -> TenantPolicy | None:
        """Add or replace an AgentTenant; an invalid one binds nothing (its runs are rejected
        with the reason rather than run unbudgeted)."""
        meta = ObjectMeta.of(obj)  # kopf's watch hands over well-formed metadata
        name = meta.name
        metrics.know_tenant(name)  # its run-end counters exist from now on, at 0
        seen = usage_seen(obj.get("status"))
        if seen is not None:
            self.seen[name] = seen
        try:
            policy = TenantPolicy.of(obj)
        except rules.InvalidTenant as err:
            was = self.invalid.get(name)
            self._rebound(name in self.policies or was is None or was[0] != meta.generation)
            self.policies.pop(name, None)
            self.invalid[name] = (meta.generation, str(err))
            self._invalid_namespaces[name] = rules.bound_namespaces(obj)
            return None
        was_valid = self.policies.get(name)
        self._rebound(was_valid is None or _binding(was_valid) != _binding(policy))
        self.invalid.pop(name, None)
        self._invalid_namespaces.pop(name, None)
        self.policies[name] = policy
        return policy

    def remove(self, name: str) -> None:
        """Forget a deleted AgentTenant (its ledger entry stays until its runs end)."""
        self._rebound(name in self.policies or name in self.invalid)
        self.policies.pop(name, None)
        self.invalid.pop(name, None)
        self._invalid_namespaces.pop(name, None)

    def _rebound(self, changed: bool) -> None:
        """Forget every namespace's resolved tenant (``party``) when an AgentTenant's binding
        ``changed`` (made, its namespaces or selector edited, made invalid, deleted): it may
        now bind namespaces resolved to another tenant, or no longer bind its own. Each is
        resolved again by its next run, AgentEval or CronAgentRun (``learn``, which reads a
        namespace it found bound to no tenant again too); a status update, or an edit of its
        budgets, forgets nothing. Counted in ``bindings``: runs queued but not admitted move
        to the tenant that binds their namespace now (``admission.rebinding``)."""
        if changed:
            self.bindings += 1
            self._resolved.clear()
            self._unbound_learnt.clear()
            self._listing = None
            self._shared = None

    def _listed(self) -> dict[str, list[str]]:
        """namespace → the valid AgentTenants listing it by name: made once after a binding
        changed, O(namespaces listed), so ``party`` costs O(1) whatever the tenants' number."""
        if self._listing is None:
            self._listing = {}
            for policy in self.policies.values():
                for namespace in policy.namespaces:
                    self._listing.setdefault(namespace, []).append(policy.name)
        return self._listing

    def _shared_now(self) -> dict[str, tuple[str, ...]]:
        """namespace → the valid AgentTenants (sorted, two or more) binding it: every namespace
        several list by name, and each found shared by selectors when a run came, judged on the
        tenants as they are now with its labels as read then. Made once after a binding or
        ``_ambiguous`` changed, so a status write costs O(1) in tenants and namespaces."""
        if self._shared is None:
            listed = self._listed().items()
            shared = {ns: tuple(sorted(t)) for ns, t in listed if len(t) > 1}
            for namespace, labels in self._ambiguous.items():
                if namespace in shared:
                    continue
                try:
                    rules.resolve(self.policies.values(), namespace, labels)
                except rules.Ambiguous as err:
                    shared[namespace] = err.tenants
            self._shared = shared
        return self._shared

    def max_concurrent_turns(self, tenant: str) -> int | None:
        """``spec.maxConcurrentTurns`` of AgentTenant ``tenant`` (``runs.TurnCaps``); the
        platform's ``default_turns`` when it sets none or is not known (a deleted tenant's
        runs finish within it); ``None``: no cap."""
        policy = self.policies.get(tenant)
        own = None if policy is None else policy.max_concurrent_turns
        return self.default_turns if own is None else own

    def why_missing(self, tenant: str) -> QueueWait:
        """Why runs queued in ``tenant`` wait when it has no policy (invalid or deleted) and
        they have not moved to the tenant their namespace binds now (``admission.rebinding``:
        it is invalid, or what their namespace binds cannot be read now)."""
        invalid = self.invalid.get(tenant)
        if invalid is not None:
            return QueueWait(
                WaitReason.TENANT_INVALID, f"AgentTenant {tenant!r} is invalid: {invalid[1]}"
            )
        return QueueWait(WaitReason.TENANT_MISSING, not_found("AgentTenant", tenant))

    async def _labels(self, namespace: str) -> Mapping[str, str]:
        if not any(p.selector is not None for p in self.policies.values()):
            return {}
        return await self.api.namespace_labels(namespace)

    async def resolve(self, namespace: str) -> TenantPolicy:
        """The tenant of runs in ``namespace``; raises ``NoTenant`` with a message for the run's
        status when none (or several) applies, ``ApiError`` if the namespace is unreadable.
        The namespace's labels are read first, and every tenant looked at after: a tenant made
        invalid while they are read still rejects the namespace's runs. A namespace last
        resolved to another tenant (relabelled since) counts as a binding changed
        (``_rebound``)."""
        labels = await self._labels(namespace)
        was = self._resolved.get(namespace)
        try:
            found = self._resolve_labelled(namespace, labels)
        except NoTenant:
            self._rebound(was is not None)
            raise
        self._rebound(was is not None and was != found.name)
        self._resolved[namespace] = found.name
        return found

    def falls_back(self, policy: TenantPolicy, namespace: str) -> bool:
        """Whether ``policy``, which ``namespace`` resolved to, is the platform's default
        tenant charged only because no AgentTenant binds the namespace (the default neither
        lists it nor selects by label)."""
        return (
            policy.name == self.default
            and namespace not in policy.namespaces
            and policy.selector is None
        )

    def _resolve_labelled(self, namespace: str, labels: Mapping[str, str]) -> TenantPolicy:
        """The tenant of ``namespace`` labelled ``labels`` (see ``resolve``); raises
        ``NoTenant``."""
        for name, namespaces in self._invalid_namespaces.items():
            if namespace in namespaces:  # never fall through to another tenant's budget
                raise NoTenant(
                    f"AgentTenant {name!r} binds namespace {namespace!r} but is invalid: "
                    f"{self.invalid[name][1]}"
                )
        try:
            found = rules.resolve(self.policies.values(), namespace, labels, default=self.default)
        except rules.Ambiguous as err:
            self._ambiguous[namespace] = labels
            self._shared = None
            raise NoTenant(str(err)) from err
        if self._ambiguous.pop(namespace, None) is not None:
            self._shared = None
        if found is None:
            raise NoTenant(self._unbound(namespace))
        return found

    def ambiguous_of(self, tenant: str) -> dict[str, tuple[str, ...]]:
        """The namespaces ``tenant`` shares with other tenants now (their runs are rejected):
        every namespace several valid AgentTenants list by name, known before any run comes,
        and each one found shared by selectors when a run or a tool server there was resolved,
        judged again on the tenants as they are now with its labels as read then, so a
        conflict undone shows so at once. namespace → the other tenants, by name. Shown in
        its ``NamespacesAmbiguous`` condition; never reads the API server."""
        return {
            namespace: tuple(t for t in tenants if t != tenant)
            for namespace, tenants in sorted(self._shared_now().items())
            if tenant in tenants
        }

    async def tool_server_rules(self, namespace: str) -> tuple[str, tuple[UrlRule, ...]]:
        """The tenant of ``namespace`` and the URLs its AgentToolServers may have
        (``spec.toolServers.allow``); raises ``NoTenant`` (a ``LookupError``) or ``ApiError``
        as ``resolve`` does."""
        policy = await self.resolve(namespace)
        return policy.name, policy.tool_server_rules

    def party(self, namespace: str) -> str:
        """Whose share of what the operator shares out (its Events, the turns of its checks'
        threads: ``platform.fairwork``, its AgentEval reconciles, its CronAgentRuns' turns, its
        status writes) ``namespace``'s objects take: the AgentTenant's that binds it
        (``tenant/<name>``: no namespace is named so), shared by every namespace it binds, as
        last resolved (``resolve``, ``learn``), else the one valid AgentTenant that lists it by
        name (a name wins over any selector: no labels needed); its own when it falls to the
        default tenant (usually many teams' namespaces, not one party's), when several list it,
        or until one selecting it by label has been resolved. Never reads the API server."""
        tenant = self._resolved.get(namespace)
        if tenant is None:
            listing = self._listed().get(namespace, ())
            tenant = listing[0] if len(listing) == 1 else None
        if tenant is None or tenant == self.default:
            return namespace
        return f"tenant/{tenant}"

    async def learn(self, namespace: str) -> None:
        """Resolve ``namespace``'s tenant (``resolve``: its labels read when a tenant selects
        by label) unless it was resolved before, or found bound to no tenant (or several)
        since the AgentTenants' bindings last changed, so its objects take their tenant's
        ``party`` before any run of theirs is admitted (an AgentEval whose suite fails its check
        creates none), at one read of its labels, not one an event of its objects. Never
        raises: a namespace no tenant binds, or one that cannot be read now (read again next
        time), keeps its party (logged at debug level)."""
        if namespace in self._resolved or namespace in self._unbound_learnt:
            return
        try:
            await self.resolve(namespace)
        except NoTenant as err:
            self._unbound_learnt[namespace] = None
            log.debug("namespace %s is bound to no one tenant: %s", namespace, err)
        except ApiError as err:
            log.debug("the tenant of namespace %s is not known: %s", namespace, err)

    def _unbound(self, namespace: str) -> str:
        if self.default and self.default in self.invalid:
            return (
                f"default AgentTenant {self.default!r} is invalid: {self.invalid[self.default][1]}"
            )
        if self.default:
            return (
                f"namespace {namespace!r} is bound to no AgentTenant and the default tenant "
                f"{self.default!r} does not exist"
            )
        return (
            f"namespace {namespace!r} is bound to no AgentTenant; a platform admin must list it "
            "in an AgentTenant's spec.namespaces or match it with spec.namespaceSelector"
        )


def _binding(policy: TenantPolicy) -> tuple[frozenset[str], Mapping[str, Any] | None]:
    """What of ``policy`` says which namespaces it binds: its names and its selector."""
    return policy.namespaces, policy.selector
