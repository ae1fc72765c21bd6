"""Many keys of many namespaces put in turn by *party*, then by namespace inside each party.

A party is whose share a namespace's work takes: the AgentTenant binding it, every namespace
it binds together (``Tenants.party``), or the namespace itself when no tenant binds it. Taken
in turn by namespace alone, a tenant spanning five namespaces got five places of each round
against another tenant's one; taken by party, each tenant gets one place a round, and its
namespaces share its places in turn.

What belongs here: that order, pure (no I/O, no clock). What does not: which keys are due and
what is done with them (the callers: the status writer's passes, the waiting-run check).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

K = TypeVar("K")


def own_party(namespace: str) -> str:
    """Each namespace a party of its own (no tenant known)."""
    return namespace


def in_turn(
    keys: Iterable[K], *, namespace: Callable[[K], str], party: Callable[[str], str] = own_party
) -> Iterator[K]:
    """``keys`` in rounds: one of each party's a round, the parties in the order their first
    key came; inside a party, its namespaces in turn the same way (the first of each, then the
    second of each, …), each namespace's keys in the order given. ``namespace`` names a key's
    namespace, ``party`` a namespace's party (asked once a namespace). Lazy: take what a pass
    needs (``itertools.islice``)."""
    parties: dict[str, dict[str, list[K]]] = {}
    spaces: dict[str, list[K]] = {}
    for key in keys:
        where = namespace(key)
        found = spaces.get(where)
        if found is None:
            found = spaces[where] = parties.setdefault(party(where), {}).setdefault(where, [])
        found.append(key)
    return _alternate(_alternate(queues.values()) for queues in parties.values())


def _alternate(queues: Iterable[Iterable[K]]) -> Iterator[K]:
    """The first of each of ``queues``, then the next of each, …, until all are empty."""
    going = [iter(queue) for queue in queues]
    while going:
        left: list[Iterator[K]] = []
        for queue in going:
            for key in itertools.islice(queue, 1):
                yield key
                left.append(queue)
        going = left
