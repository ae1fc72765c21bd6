"""The Leases of the operator shards (``AGENTRUN_OPERATOR_SHARDS`` > 1), as one process sees
and holds them.

Each shard ``i`` is owned through the Lease ``<lease_name>-<i>``, judged and written by the
rule of ``leadership.LeaderElector`` (its own monotonic clock, writes conditioned on the
``resourceVersion`` read). Each process also holds one membership Lease
(``<lease_name>-member-<slot>``, a free slot among N) while it runs, so the others count it
live before it owns any shard; ``shards.plan`` then says what to take or give up for a fair
share. What does not belong here: the rule (``shards``), what a process runs for the shards
it holds (``main``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable

from .kubeapi import KubeApi
from .leadership import KubeLeases, LeaderElector, LeaseTiming, micro_time
from .shards import Plan, lease_name, member_lease_name, plan

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, slots=True)
class LeaseSite:
    """Where an install's shard Leases are: namespace, base name and shard count."""

    namespace: str
    """``AGENTRUN_LEASE_NAMESPACE``."""
    base: str
    """``AGENTRUN_LEASE_NAME``."""
    shards: int
    """``AGENTRUN_OPERATOR_SHARDS``."""


class ShardLeases:
    """Electors for every shard Lease and membership slot of one process (``identity``)."""

    def __init__(
        self,
        api: KubeApi,
        site: LeaseSite,
        *,
        identity: str,
        timing: LeaseTiming,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``site``: where the Leases are and how many; ``clock``: monotonic seconds, to age
        what this process observed of each Lease."""
        self.api = api
        self.namespace, self.base, self.shards = site.namespace, site.base, site.shards
        self.identity = identity
        self.timing = timing
        self.clock = clock
        base, shards = site.base, site.shards
        self._electors = {s: self.elector(lease_name(base, s, shards)) for s in range(shards)}
        self._members = {k: self.elector(member_lease_name(base, k)) for k in range(shards)}

    def elector(self, name: str) -> LeaderElector:
        """A fresh elector of Lease ``name`` for this process."""
        store = KubeLeases(self.api, namespace=self.namespace, name=name)
        return LeaderElector(store, identity=self.identity, timing=self.timing, clock=self.clock)

    def handed_over(self, shard: int) -> LeaderElector:
        """Shard ``shard``'s elector, which just won its Lease, for its renewal thread; a fresh
        one replaces it here (to judge the Lease once it is given up)."""
        won = self._electors[shard]
        self._electors[shard] = self.elector(lease_name(self.base, shard, self.shards))
        return won

    async def join(self) -> tuple[LeaderElector, str]:
        """Take a free membership slot, the one an earlier process of this name held first
        (so one process never holds two); waits, retrying every ``retry`` seconds, while all N
        are held. Returns its elector, for a renewal thread of its own, and its Lease's name."""
        while True:
            named: set[int] = set()
            for slot, elector in self._members.items():
                if await _peek(elector, "") == self.identity:
                    named.add(slot)
            for slot in sorted(self._members, key=lambda k: k not in named):
                elector = self._members[slot]
                try:
                    if await elector.try_acquire_or_renew():
                        log.info("member slot %d taken by %s", slot, self.identity)
                        name = member_lease_name(self.base, slot)
                        self._members[slot] = self.elector(name)
                        return elector, name
                except Exception as err:  # API server away: try the next, then again
                    log.warning("could not read or take member slot %d: %r", slot, err)
            await asyncio.sleep(self.timing.retry)

    async def survey(self, held: frozenset[int]) -> Plan:
        """What to take or give up now, given the shards ``held`` (renewed elsewhere). A Lease
        that cannot be read counts as held by someone (nothing is taken on a guess); one that
        names this process's identity but is not in ``held`` was left by an earlier process of
        that name (identities are unique among live processes: a restarted container keeps
        its pod's name), so it counts as free and is taken back at once.

        The Leases are read at once (2N GETs in flight together), so a takeover is not delayed
        by N sequential reads from an API server slowed by load."""
        free = [s for s in self._electors if s not in held]
        shard_seen = _peek_all([self._electors[s] for s in free], "?")
        member_seen = _peek_all(list(self._members.values()), "")
        seen, members = await asyncio.gather(shard_seen, member_seen)
        holders = dict.fromkeys(held, self.identity)
        for shard, holder in zip(free, seen, strict=True):
            holders[shard] = "" if holder == self.identity else holder
        others = {h for h in members if h and h != self.identity}  # a process counts once
        return plan(holders, me=self.identity, live=1 + len(others))

    async def take(self, shard: int) -> bool:
        """One attempt at shard ``shard``'s Lease; True when won (then ``handed_over``)."""
        try:
            return await self._electors[shard].try_acquire_or_renew()
        except Exception as err:
            log.warning("could not take the Lease of shard %d: %r", shard, err)
            return False

    async def release_named(self) -> list[int]:
        """Give up every shard Lease that names this process at a graceful stop, after the
        held ones were released: a take cut off by the stop may have been written without
        this process learning it, and its shard would otherwise wait a Lease duration for
        another process. Best effort (failures logged); returns the shards released."""
        released = []
        for shard, elector in self._electors.items():
            try:
                if await elector.peek() == self.identity:
                    await elector.release()
                    released.append(shard)
            except Exception as err:
                log.warning("could not release the Lease of shard %d: %r", shard, err)
        return released

    async def announce(self, shard: int, *, before: str) -> None:
        """Post a Normal ``ShardTakenOver`` (or ``ShardAcquired`` for a free one) Event on
        shard ``shard``'s Lease naming this process; best effort (logged)."""
        name = lease_name(self.base, shard, self.shards)
        reason = "ShardTakenOver" if before else "ShardAcquired"
        message = f"operator shard {shard} is now owned by {self.identity}"
        if before:
            message += f" (was {before})"
        stamp = micro_time()[:19] + "Z"
        event = {
            "metadata": {"generateName": f"{name}.", "namespace": self.namespace},
            "involvedObject": {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "name": name,
                "namespace": self.namespace,
            },
            "type": "Normal",
            "reason": reason,
            "message": message,
            "count": 1,
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "source": {"component": "agentrun-operator", "host": self.identity},
        }
        try:
            await self.api.create_event(self.namespace, event)
        except Exception as err:
            log.warning("could not post the Event of shard %d: %r", shard, err)

    def holder_seen(self, shard: int) -> str:
        """Who shard ``shard``'s Lease named when last read here (``""``: nobody)."""
        return self._electors[shard].holder


async def _peek_all(electors: list[LeaderElector], unreadable: str) -> list[str]:
    """`_peek` of each of ``electors``, concurrently, in their order."""
    return list(await asyncio.gather(*(_peek(e, unreadable) for e in electors)))


async def _peek(elector: LeaderElector, unreadable: str) -> str:
    try:
        return await elector.peek()
    except Exception as err:
        log.warning("could not read a shard Lease: %r", err)
        return unreadable
