"""The shard rule (``platform.shards``): a tenant's shard, the Lease names, the fair share, and
what one process takes or gives up given the Leases it sees; and which AgentRuns a process
owns (``RunShards``)."""

from __future__ import annotations

import collections
import hashlib
import subprocess
import sys

import pytest

from agentrun.operator.platform.shards import (
    ALL_OF_ONE,
    Ownership,
    Plan,
    RunShards,
    fair_share,
    lease_name,
    member_lease_name,
    plan,
    shard_of,
)


def test_a_tenants_shard_is_sha256_mod_n_and_one_shard_is_shard_0() -> None:
    digest = hashlib.sha256(b"team-a").digest()
    assert shard_of("team-a", 7) == int.from_bytes(digest[:8], "big") % 7
    assert all(shard_of(name, 1) == 0 for name in ("team-a", "", "x" * 300))
    with pytest.raises(ValueError, match="at least 1"):
        shard_of("team-a", 0)


def test_a_tenants_shard_is_the_same_in_another_interpreter() -> None:
    """Never Python's ``hash`` (salted per process): another process agrees."""
    code = (
        "from agentrun.operator.platform.shards import shard_of;"
        "print([shard_of(f't{i}', 5) for i in range(20)])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == str([shard_of(f"t{i}", 5) for i in range(20)])


def test_tenants_spread_over_every_shard() -> None:
    counts = collections.Counter(shard_of(f"tenant-{i}", 6) for i in range(600))
    assert set(counts) == set(range(6))
    assert min(counts.values()) > 600 / 6 / 2  # no shard starved


def test_lease_names_keep_the_one_lease_of_active_standby() -> None:
    assert lease_name("agentrun-operator", 0, 1) == "agentrun-operator"
    assert lease_name("agentrun-operator", 2, 3) == "agentrun-operator-2"
    assert member_lease_name("agentrun-operator", 1) == "agentrun-operator-member-1"


@pytest.mark.parametrize(
    ("shards", "live", "share"), [(6, 3, 2), (6, 2, 3), (6, 4, 2), (6, 1, 6), (3, 0, 3), (1, 5, 1)]
)
def test_the_fair_share_is_the_ceiling(shards: int, live: int, share: int) -> None:
    assert fair_share(shards, live) == share


def test_a_first_process_takes_every_free_shard_lowest_first() -> None:
    assert plan({0: "", 1: "", 2: ""}, me="a", live=1) == Plan(take=(0, 1, 2))


def test_a_process_takes_free_shards_only_up_to_its_share() -> None:
    holders = {0: "a", 1: "", 2: "b", 3: "", 4: "", 5: "b"}
    assert plan(holders, me="a", live=3) == Plan(take=(1,))  # share 2: holds 1, takes 1


def test_a_dead_processs_shards_are_taken_by_the_survivors() -> None:
    """c died: its Leases expired ("") and its membership too (live 2): a and b, at 2 each
    before, may now hold 3 each."""
    holders = {0: "a", 1: "a", 2: "b", 3: "b", 4: "", 5: ""}
    assert plan(holders, me="a", live=2) == Plan(take=(4,))
    assert plan(holders, me="b", live=2) == Plan(take=(4,))  # the Lease's write picks one
    assert plan({**holders, 4: "a"}, me="b", live=2) == Plan(take=(5,))
    assert not plan({**holders, 4: "a", 5: "b"}, me="a", live=2).changes


def test_a_process_over_its_share_gives_up_its_highest_shards() -> None:
    """A joined (live 3): a held all six, keeps its two lowest."""
    holders = dict.fromkeys(range(6), "a")
    assert plan(holders, me="a", live=3) == Plan(give=(5, 4, 3, 2))


def test_a_process_at_its_share_or_with_nothing_free_does_nothing() -> None:
    holders = {0: "a", 1: "a", 2: "b", 3: "b", 4: "c", 5: "c"}
    for me in "abc":
        assert not plan(holders, me=me, live=3).changes
    assert not plan(holders, me="d", live=4).changes  # nothing free: waits for a give-up
    assert plan({**holders, 5: ""}, me="d", live=4) == Plan(take=(5,))


def test_ownership_of_tenants_and_of_the_cluster_work() -> None:
    mine = Ownership(6, frozenset({shard_of("team-a", 6), 0}))
    assert mine.owns_tenant("team-a")
    assert mine.owns_tenant(None) and mine.owns_tenant("")  # no tenant: shard 0's
    assert mine.cluster_work and not mine.everything
    other = next(f"t{i}" for i in range(100) if shard_of(f"t{i}", 6) not in mine.owned)
    assert not mine.owns_tenant(other)
    not_zero = Ownership(6, frozenset({3}))
    assert not not_zero.cluster_work and not not_zero.owns_tenant(None)
    assert ALL_OF_ONE.everything and ALL_OF_ONE.owns_tenant("anything")


def _run(uid: str, tenant: str | None = None) -> dict[str, object]:
    status = {"tenant": tenant} if tenant else {}
    return {"kind": "AgentRun", "metadata": {"uid": uid}, "status": status}


def test_a_run_is_owned_by_its_admitted_tenant_not_by_what_its_namespace_resolves_to() -> None:
    a = next(f"t{i}" for i in range(100) if shard_of(f"t{i}", 4) == 1)
    b = next(f"t{i}" for i in range(100) if shard_of(f"t{i}", 4) == 2)
    runs = RunShards(Ownership(4, frozenset({1})))
    runs.learn("u1", b)  # the namespace was relabelled to b's after admission under a
    assert runs.owns(_run("u1", a))
    assert not runs.owns(_run("u2", b))


def test_a_run_not_admitted_is_owned_by_the_tenant_learned_for_it_else_by_shard_0() -> None:
    a = next(f"t{i}" for i in range(100) if shard_of(f"t{i}", 4) == 1)
    on_one, on_zero = (
        RunShards(Ownership(4, frozenset({1}))),
        RunShards(Ownership(4, frozenset({0}))),
    )
    assert not on_one.owns(_run("u1")) and on_zero.owns(_run("u1"))  # unknown: shard 0's
    for runs in (on_one, on_zero):
        runs.learn("u1", a)
    assert on_one.owns(_run("u1")) and not on_zero.owns(_run("u1"))
    on_zero.learn("u2", None)  # its namespace resolves to no tenant
    assert on_zero.owns(_run("u2"))
    assert on_one.owns({"kind": "AgentEval", "metadata": {"uid": "e"}})  # only runs are sharded
    assert RunShards(ALL_OF_ONE).owns(_run("u3", a))
