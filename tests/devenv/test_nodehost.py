"""The host cleanup a node relies on: it finds and removes what a node adds, nothing else.

Root only. Holds the machine's node claim, so it waits while a node (of any test run) is up."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from agentrun_dev import node, nodehost, procs

CHAIN = "KUBE-AGENTRUN-CLEANUP-TEST"
IPSET = "KUBE-SRC-AGENTRUNTEST"
OWN_TABLE = "agentrun_cleanup_test"
"""An nftables table of the kind a component creates for itself."""
SHARED_TABLES = ("security", "raw")
"""Names iptables-nft uses (tested in family inet, which iptables-nft never uses)."""
pytestmark = pytest.mark.timeout(1200)  # waits for another run's node to stop


def run(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, timeout=30)


def undo(*commands: tuple[str, ...]) -> None:
    """Run each command, ignoring failures: removes what a test made that the clean-up under
    test did not (it failed first), so a failing test leaves the shared host as it was."""
    for argv in commands:
        with contextlib.suppress(OSError):  # a tool this host lacks made nothing to remove
            subprocess.run(argv, check=False, capture_output=True, timeout=30)


@pytest.fixture
def claimed(tmp_path: Path) -> Iterator[Path]:
    """This machine's node claim, so no real node adds host state during the test."""
    me = psutil.Process(os.getpid())
    owner = procs.record_of("test", me.pid, tmp_path / "owner.log")
    nodehost.claim_host(tmp_path, owner=owner, wait=900.0)
    yield tmp_path
    nodehost.release_host(tmp_path)


def test_leftovers_name_new_mounts_links_rules_sets_tables_and_changed_sysctls() -> None:
    before = nodehost.HostSnapshot(
        mounts=("/a",), links=("veth1",), iptables=("ipv4 nat :KUBE-X -",),
        sysctls=(("net/ipv4/ip_forward", "0"),), nftables=("ip nat",), ipsets=("theirs",),
    )  # fmt: skip
    after = nodehost.HostSnapshot(
        mounts=("/a", "/a/b"), links=("veth1", "veth2"),
        iptables=("ipv4 nat :KUBE-X -", "ipv4 nat -A KUBE-X -j ACCEPT"),
        sysctls=(("net/ipv4/ip_forward", "1"),),
        nftables=("ip filter", "ip nat"), ipsets=("KUBE-SRC-ABC", "theirs"),
    )  # fmt: skip
    assert nodehost.leftovers(before, before) == []
    assert nodehost.leftovers(before, after) == [
        "mount /a/b",
        "link veth2",
        "iptables ipv4 nat -A KUBE-X -j ACCEPT",
        "sysctl net/ipv4/ip_forward=1 (was 0)",
        "nftables table ip filter",
        "ipset KUBE-SRC-ABC",
    ]
    assert nodehost.HostSnapshot.from_dict(after.as_dict()) == after


def test_cleanup_removes_a_new_tmpfs_veth_and_iptables_chain_and_keeps_the_old(
    claimed: Path,
) -> None:
    kept = claimed / "kept"
    kept.mkdir()
    run("mount", "-t", "tmpfs", "tmpfs", str(kept))
    try:
        before = nodehost.take_snapshot(claimed)
        added = claimed / "containerd-like" / "rootfs"
        added.mkdir(parents=True)
        run("mount", "-t", "tmpfs", "tmpfs", str(added))
        run("ip", "link", "add", "vethagtest0", "type", "veth", "peer", "name", "vethagtest1")
        run("iptables", "-t", "nat", "-N", CHAIN)
        run("iptables", "-t", "nat", "-A", "POSTROUTING", "-m", "comment", "--comment",
            "agentrun cleanup test", "-j", CHAIN)  # fmt: skip
        assert len(nodehost.leftovers(before, nodehost.take_snapshot(claimed))) >= 5
        left = nodehost.cleanup_host(claimed, before=before, log=print)
        assert left == []
        assert nodehost.take_snapshot(claimed) == before
        assert str(kept) in nodehost.take_snapshot(claimed).mounts
    finally:
        undo(
            ("umount", str(claimed / "containerd-like" / "rootfs")),
            ("ip", "link", "delete", "vethagtest0"),
            ("iptables", "-t", "nat", "-D", "POSTROUTING", "-m", "comment", "--comment",
             "agentrun cleanup test", "-j", CHAIN),
            ("iptables", "-t", "nat", "-X", CHAIN),
            ("umount", str(kept)),
        )  # fmt: skip


def test_cleanup_destroys_new_ipsets_and_nftables_tables_but_keeps_a_shared_table_in_use(
    claimed: Path,
) -> None:
    """An ipset and a component's own nftables table (with a rule) go; an iptables-nft
    table the node created goes once empty, and is kept (and reported) while someone else's
    rule is in it."""
    emptied, in_use = (f"inet {name}" for name in SHARED_TABLES)
    before = nodehost.take_snapshot(claimed)
    assert not {f"inet {OWN_TABLE}", emptied, in_use} & set(before.nftables)
    assert IPSET not in before.ipsets
    try:
        run("ipset", "create", IPSET, "hash:ip")
        run("ipset", "add", IPSET, "10.244.0.9")
        run("nft", "add", "table", "inet", OWN_TABLE)
        run("nft", "add", "chain", "inet", OWN_TABLE, "pods")
        run("nft", "add", "rule", "inet", OWN_TABLE, "pods", "ip", "daddr", "10.244.0.9", "drop")
        for table in (emptied, in_use):
            run("nft", "add", "table", *table.split())
            run("nft", "add", "chain", *table.split(), "INPUT")
        run("nft", "add", "rule", *in_use.split(), "INPUT", "counter")  # someone else's
        assert set(nodehost.leftovers(before, nodehost.take_snapshot(claimed))) == {
            f"ipset {IPSET}",
            f"nftables table inet {OWN_TABLE}",
            f"nftables table {emptied}",
            f"nftables table {in_use}",
        }

        left = nodehost.cleanup_host(claimed, before=before, log=print)

        assert left == [f"nftables table {in_use}"]
    finally:
        undo(
            ("nft", "delete", "table", *in_use.split()),
            ("nft", "delete", "table", *emptied.split()),
            ("nft", "delete", "table", "inet", OWN_TABLE),
            ("ipset", "destroy", IPSET),
        )
    assert nodehost.take_snapshot(claimed) == before


def test_a_bridge_no_claim_names_is_removed_with_its_veths(claimed: Path) -> None:
    """A node killed in another mount namespace leaves its bridge and veths in the shared
    network namespace without a claim here; the next node removes them before creating its
    own bridge (`ip link add` would fail: File exists)."""
    assert not Path("/sys/class/net", nodehost.BRIDGE).exists()
    try:
        run("ip", "link", "add", "name", nodehost.BRIDGE, "type", "bridge")
        run("ip", "link", "add", "vethagtest0", "type", "veth", "peer", "name", "vethagtest1")
        run("ip", "link", "set", "vethagtest0", "master", nodehost.BRIDGE)
        removed = nodehost.remove_orphan_bridge(log=print)
        assert removed == ["vethagtest0", nodehost.BRIDGE]
        assert not Path("/sys/class/net", nodehost.BRIDGE).exists()
        assert not Path("/sys/class/net", "vethagtest1").exists()
        assert nodehost.remove_orphan_bridge(log=print) == []
        nodehost.create_bridge()  # what a node does next
    finally:
        undo(("ip", "link", "delete", "vethagtest0"), ("ip", "link", "delete", nodehost.BRIDGE))


def test_a_bridge_that_may_be_a_live_nodes_is_kept(claimed: Path) -> None:
    """A bridge created minutes ago (a node starting where this process cannot see its
    claim), or one with a listener on the node's address (a live node's kubelet), is kept
    and the start refused, naming why."""
    assert not Path("/sys/class/net", nodehost.BRIDGE).exists()
    try:
        nodehost.create_bridge()
        with pytest.raises(nodehost.HostError, match=r"created [0-9]+ s ago"):
            nodehost.remove_orphan_bridge(log=print)
        run("ip", "link", "delete", nodehost.BRIDGE)
        nodehost.create_bridge(now=time.time() - 2 * nodehost.ORPHAN_MIN_AGE)
        with socket.socket() as kubelet:
            kubelet.bind((nodehost.GATEWAY, 0))
            kubelet.listen()
            with pytest.raises(nodehost.HostError, match="serves on"):
                nodehost.remove_orphan_bridge(log=print)
        assert Path("/sys/class/net", nodehost.BRIDGE).exists()
        assert nodehost.remove_orphan_bridge(log=print) == [nodehost.BRIDGE]  # now unused
    finally:
        undo(("ip", "link", "delete", nodehost.BRIDGE))


def test_a_node_waits_for_a_live_node_of_another_mount_namespace_to_go(claimed: Path) -> None:
    """Two test runs whose ``/run`` differ (so neither sees the other's claim) share the
    network namespace: the second node waits while the first's bridge may be live, starts
    once it is gone, and gives up after its wait, keeping the bridge."""
    assert not Path("/sys/class/net", nodehost.BRIDGE).exists()
    try:
        nodehost.create_bridge()  # the other run's node, starting
        with pytest.raises(nodehost.HostError, match=r"created [0-9]+ s ago"):
            node.clean_orphans(log=print, wait=1.0, poll=0.2)
        assert Path("/sys/class/net", nodehost.BRIDGE).exists()
        stopper = threading.Timer(2.0, run, ("ip", "link", "delete", nodehost.BRIDGE))
        stopper.start()  # the other run's node stops
        began = time.monotonic()
        node.clean_orphans(log=print, wait=60.0, poll=0.2)
        assert 2.0 <= time.monotonic() - began < 30.0
        stopper.join()
        assert not Path("/sys/class/net", nodehost.BRIDGE).exists()
    finally:
        undo(("ip", "link", "delete", nodehost.BRIDGE))


def test_a_claim_held_by_a_live_node_is_waited_for_then_refused_and_a_dead_ones_is_taken(
    claimed: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The machine holds one node: a second claim waits (saying so once) and is refused after
    its wait, naming the holder; a claim whose owner died is taken over, returning the dead
    node's directory for its clean-up."""
    other = tmp_path_factory.mktemp("other-node")
    me = psutil.Process(os.getpid())
    owner = procs.record_of("other", me.pid, other / "owner.log")
    said: list[str] = []
    began = time.monotonic()
    with pytest.raises(nodehost.HostError, match=f"another agentrun node \\({claimed}\\)"):
        nodehost.claim_host(other, owner=owner, wait=3.0, log=said.append)
    assert 3.0 <= time.monotonic() - began < 10
    assert len(said) == 1 and said[0].endswith("; waiting up to 3 s") and str(claimed) in said[0]

    dead = procs.ProcessRecord("gone", me.pid, me.create_time() - 1000, other / "owner.log")
    nodehost.update_claim(other, owner=dead)  # a node whose test run was killed
    me_again = procs.record_of("test", me.pid, claimed / "owner.log")
    assert nodehost.claim_host(claimed, owner=me_again, log=said.append) == other
    assert nodehost.claim_holder() == claimed
