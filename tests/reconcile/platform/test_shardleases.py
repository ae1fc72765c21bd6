"""The shard Leases as processes see and hold them (``platform.shardleases``) over a fake API
server: a first process takes every shard, one that joins is counted live and gets the shards
given up for it, a dead process's shards are free only once they stood still for the Lease
duration, and a takeover is announced by an Event on the Lease."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from kube_support import FakeKube

from agentrun.operator.platform.leadership import LeaderElector
from agentrun.operator.platform.shardleases import LeaseSite, ShardLeases
from agentrun.operator.platform.shards import Plan

from .test_leadership import TIMING, Clock


def process(api: FakeKube, identity: str, clock: Clock) -> ShardLeases:
    site = LeaseSite("agentrun", "agentrun-operator", 6)
    return ShardLeases(api, site, identity=identity, timing=TIMING, clock=clock)


async def take_all(leases: ShardLeases, shards: tuple[int, ...]) -> dict[int, LeaderElector]:
    held = {}
    for shard in shards:
        assert await leases.take(shard)
        held[shard] = leases.handed_over(shard)
    return held


async def two_halves(
    api: FakeKube, clock: Clock, first: str, second: str
) -> tuple[ShardLeases, ShardLeases]:
    """Two processes, both members, holding shards 0-2 and 3-5."""
    one, two = process(api, first, clock), process(api, second, clock)
    await one.join()
    await two.join()
    await take_all(one, (0, 1, 2))
    await take_all(two, (3, 4, 5))
    return one, two


def holder(api: FakeKube, name: str) -> str:
    lease = api.objects[("leases", "agentrun", name)]
    return str(lease["spec"].get("holderIdentity") or "")


async def test_the_first_takes_all_a_second_joins_and_gets_what_the_first_gives_up() -> None:
    api, clock = FakeKube(), Clock()
    a, b = process(api, "a", clock), process(api, "b", clock)
    await a.join()
    first = await a.survey(frozenset())
    assert first == Plan(take=(0, 1, 2, 3, 4, 5))
    held = await take_all(a, first.take)
    assert holder(api, "agentrun-operator-3") == "a"
    await b.join()
    assert not (await b.survey(frozenset())).changes  # all held: b waits
    assert await a.survey(frozenset(held)) == Plan(give=(5, 4, 3))  # b counted live
    for shard in (5, 4, 3):
        await held.pop(shard).release()
    assert await b.survey(frozenset()) == Plan(take=(3, 4, 5))  # released: free at once
    await take_all(b, (3, 4, 5))
    assert not (await a.survey(frozenset(held))).changes
    assert not (await b.survey(frozenset({3, 4, 5}))).changes


async def test_a_dead_processs_shards_are_free_only_after_the_lease_duration() -> None:
    api, clock = FakeKube(), Clock()
    a, _ = await two_halves(api, clock, "a", "c")
    assert not (await a.survey(frozenset({0, 1, 2}))).changes  # c is live: share 3
    clock.now += TIMING.duration - 1  # c stopped renewing (SIGKILL), a's slot too (not here)
    assert not (await a.survey(frozenset({0, 1, 2}))).changes
    clock.now += 2
    plan = await a.survey(frozenset({0, 1, 2}))
    assert plan == Plan(take=(3, 4, 5))  # c's membership expired too: a alone, share 6
    before = a.holder_seen(3)
    assert before == "c"  # as last read: expired, but named
    assert await a.take(3)
    await a.announce(3, before=before)
    event = api.events[-1]
    assert event["reason"] == "ShardTakenOver"
    assert event["involvedObject"]["kind"] == "Lease"
    assert event["involvedObject"]["name"] == "agentrun-operator-3"
    assert "now owned by a (was c)" in event["message"]


async def test_membership_slots_are_taken_one_per_process() -> None:
    api, clock = FakeKube(), Clock()
    names = []
    for identity in "abc":
        _, name = await process(api, identity, clock).join()
        names.append(name)
    assert names == [f"agentrun-operator-member-{k}" for k in range(3)]


async def test_a_process_restarted_under_its_name_takes_its_earlier_shards_back_at_once() -> None:
    """A restarted container keeps its pod's name: the Leases its earlier process held name
    this identity but are renewed by nobody. They count as free (not as held, which would
    leave them unserved for ever) and are taken back without waiting for them to expire."""
    api, clock = FakeKube(), Clock()
    _, other = await two_halves(api, clock, "a", "b")
    after = process(api, "a", clock)  # same identity, nothing held yet
    await after.join()
    plan = await after.survey(frozenset())
    assert plan == Plan(take=(0, 1, 2))
    assert await after.take(0)  # named "a": taken at once, not after the Lease duration
    assert not (await other.survey(frozenset({3, 4, 5}))).changes  # b keeps its share


async def test_at_a_stop_every_lease_naming_the_process_is_released() -> None:
    """A take cut off by the stop (written, but never handed to a renewal thread) leaves a
    Lease naming the process: the stop releases it too, so its shard is free at once."""
    api, clock = FakeKube(), Clock()
    a, b = process(api, "a", clock), process(api, "b", clock)
    await a.join()
    await take_all(b, (0, 1, 2))
    assert await a.take(4)  # the stop came before its renewal thread started
    assert await a.release_named() == [4]
    assert holder(api, "agentrun-operator-4") == ""
    assert holder(api, "agentrun-operator-1") == "b"  # others' Leases untouched
    assert await b.take(4)  # free at once, not after the Lease duration


async def test_a_restarted_process_rejoins_in_its_own_slot_and_counts_once() -> None:
    """The earlier process of this name held slot 1 and slot 0 is free (its holder stopped):
    the restarted one takes slot 1 back, not slot 0, so it is never two members; and slots
    naming one identity count as one live process."""
    api, clock = FakeKube(), Clock()
    a, b = process(api, "a", clock), process(api, "b", clock)
    slot_a, _ = await a.join()
    await b.join()  # slot 1
    await slot_a.release()  # a stopped: slot 0 free
    again = process(api, "b", clock)
    _, name = await again.join()
    assert name == "agentrun-operator-member-1"
    third = process(api, "c", clock)
    await third.join()  # slot 0
    await third.elector("agentrun-operator-member-2").try_acquire_or_renew()  # c twice
    assert await again.survey(frozenset()) == Plan(take=(0, 1, 2))  # live 2: share 3, not 2


class SlowKube(FakeKube):
    """Every Lease read takes ``delay`` seconds, as on an API server saturated by a bulk apply;
    counts how many reads were in flight at once."""

    def __init__(self, delay: float) -> None:
        super().__init__()
        self.delay = delay
        self.in_flight = 0
        self.most_in_flight = 0

    async def read_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.delay)
            return await super().read_lease(namespace, name)
        finally:
            self.in_flight -= 1


async def test_a_survey_reads_the_leases_at_once_not_one_after_another() -> None:
    """A survivor's look at 6 shard and 6 membership Leases costs one slow read, not twelve:
    on an API server answering each read in a second, twelve in a row would delay a takeover
    by twelve seconds beyond the Lease duration."""
    api, clock = SlowKube(delay=0.0), Clock()
    a, _ = await two_halves(api, clock, "a", "c")
    api.delay = 0.3
    began = time.monotonic()
    plan = await a.survey(frozenset({0, 1, 2}))
    assert not plan.changes
    assert api.most_in_flight == 3 + 6  # c's three shards and every membership slot
    assert time.monotonic() - began < 4 * api.delay  # 9 reads in a row take 2.7 s
