"""The schedules waiting for a reconcile, taken one share's after another's in turn.

A *share* is whose turn a namespace's schedules take: the AgentTenant that binds the namespace
(every namespace it binds together, so a tenant gets one share however many namespaces it
spans), or the namespace itself when no tenant binds it (``Tenants.party``, as the operator's
other fair queues have it). Inside a share its namespaces take turns in the same way.

What belongs here: that queue (``Turns``), pure bookkeeping with no I/O and no clock. What
does not: which schedules are due (``memory``), running the reconciles (``controller``), which
tenant binds a namespace (``tenants``).
"""

from __future__ import annotations

from collections.abc import Callable, Container, Iterable

from .memory import CronKey


def own_share(namespace: str) -> str:
    """Each namespace a share of its own (no tenant known)."""
    return namespace


class Turns:
    """CronAgentRuns waiting for a reconcile, each once. The shares take turns (the first
    waiting of one, then of the next, ...), and inside a share its namespaces do, each
    namespace's in the order they came. A tenant with hundreds of schedules waiting in each
    of its namespaces delays another tenant's newly due one by one turn of each share
    waiting, not by one of each of its namespaces nor by all of its own."""

    def __init__(self, share_of: Callable[[str], str] = own_share) -> None:
        """``share_of``: the share of a namespace's schedules (``Tenants.party``), asked when
        one of them joins the queue; a schedule keeps the share it joined under until taken."""
        self._share_of = share_of
        self._waiting: dict[str, dict[str, dict[CronKey, None]]] = {}
        """By share, in turn order (the next to take first): its namespaces in turn order,
        each with its keys in order."""
        self._shares: dict[CronKey, str] = {}
        """The share each waiting key joined under."""

    def add(self, keys: Iterable[CronKey]) -> None:
        """Queue ``keys`` (one waiting already keeps its place); a share new to the queue takes
        its turn after those waiting, and a namespace new to its share after its others."""
        for key in keys:
            if key in self._shares:
                continue
            share = self._shares[key] = self._share_of(key[0])
            self._waiting.setdefault(share, {}).setdefault(key[0], {})[key] = None

    def take(self, full: Container[str] = ()) -> CronKey | None:
        """The next key, or ``None``: the first share's (not one of ``full``, which keep their
        place) first namespace's first; that namespace then goes to the end of its share's
        turns, and the share to the end of the turns."""
        share = next((s for s in self._waiting if s not in full), None)
        if share is None:
            return None
        namespaces = self._waiting.pop(share)
        namespace = next(iter(namespaces))
        keys = namespaces.pop(namespace)
        key = next(iter(keys))
        del keys[key]
        del self._shares[key]
        if keys:
            namespaces[namespace] = keys
        if namespaces:
            self._waiting[share] = namespaces
        return key

    def __contains__(self, key: object) -> bool:
        return key in self._shares

    def __len__(self) -> int:
        return len(self._shares)
