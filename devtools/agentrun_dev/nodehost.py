"""What a single-node cluster changes on the host, how to undo it, and how to prove it undone.

A node adds host-wide state that outlives its processes: mounts (container root filesystems,
``/dev/shm`` and volume tmpfs, network-namespace files under ``/run/netns``), network devices
(the pod bridge `BRIDGE` and one veth per pod), the kubelet's ``kubepods`` cgroups, iptables
rules (kube-proxy's and the NetworkPolicy enforcer's ``KUBE-*`` and the CNI plugins' ``CNI-*``
chains), the nftables tables those rules live in (iptables-nft) or that a component creates,
the enforcer's ipsets, and sysctls (`SYSCTLS`: IPv4 forwarding, which the bridge plugin turns
on, and the kernel tunables the kubelet sets).
`HostSnapshot` records the node-related part of that state; `take_snapshot` before the node
starts, `cleanup_host` after its processes stopped removes what is new, and `leftovers` says
what is still there.

Only one node can run per machine (the bridge name, the pod subnet, the kube-proxy chains and
the ``kubepods`` cgroups are global): `claim_host` records the running node in `CLAIM_FILE`
and refuses, or waits for, a second one.

What belongs here: host state (``ip``, ``iptables``, ``nft``, ``ipset``, ``umount``,
sysctls); no Kubernetes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import psutil

from agentrun_dev import console, procs

T = TypeVar("T")

BRIDGE = "agentrun0"
"""The pod bridge; its address `GATEWAY` is the node's IP."""
BRIDGE_ALIAS = "agentrun-node:"
"""Prefix of the bridge's alias; the epoch seconds of its creation follow."""
ORPHAN_MIN_AGE = 600.0
"""Seconds a bridge no claim names must have existed before `remove_orphan_bridge` takes it
for a dead node's (a node starts in about a minute; its kubelet listens when it is up)."""
POD_SUBNET = "10.244.0.0/24"
GATEWAY = "10.244.0.1"
NETNS_DIRS = (Path("/run/netns"), Path("/var/run/netns"))
"""Where containerd's CRI pins pod network namespaces (``cni-<uuid>`` files)."""
SYSCTLS = (
    "net/ipv4/ip_forward",
    "net/ipv4/conf/all/route_localnet",
    "net/bridge/bridge-nf-call-iptables",
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
)
"""Sysctls the bridge plugin, kube-proxy or the kubelet (its kernel tunables) may change."""
HOST_PATHS = (
    Path("/var/log/containers"),
    Path("/var/lib/kubelet/device-plugins"),
    Path("/var/lib/kubelet"),
    Path("/run/containerd/s"),
    Path("/run/containerd"),
    *NETNS_DIRS,
)
"""Fixed host directories the kubelet, containerd and its shims create whatever their own
directories are set to; removed again (when empty) if the node created them."""
KUBELET_PLUGIN_SOCKET = Path("/var/lib/kubelet/device-plugins/kubelet.sock")
"""The device-plugin socket the kubelet leaves behind (its path is fixed)."""
CONTAINER_LOGS = Path("/var/log/containers")
"""Where the kubelet links each container's log (into its pod logs directory)."""
CLAIM_DIR = Path("/run/agentrun")
RUNTIME_ROOT = CLAIM_DIR
"""Parent of the nodes' runtime directories (see `runtime_dir`)."""
CLAIM_FILE = CLAIM_DIR / "node.json"
_IPTABLES_PREFIXES = ("KUBE-", "CNI-")
IPTABLES_NFT_TABLES = frozenset({"filter", "nat", "mangle", "raw", "security"})
"""Names of the nftables tables that iptables-nft keeps its tables in (in families ip, ip6,
arp, bridge): other programs' rules may live there too."""


class HostError(RuntimeError):
    """A host command failed, or another node holds the machine; the message says which."""


@dataclasses.dataclass(frozen=True, slots=True)
class HostSnapshot:
    """The node-related host state at one moment (all sorted, JSON-serialisable)."""

    mounts: tuple[str, ...]
    """Mount points under the node's directory, its `runtime_dir`, ``/run/containerd`` and the
    netns dirs."""
    links: tuple[str, ...]
    """Network devices named `BRIDGE` or ``veth…``."""
    iptables: tuple[str, ...]
    """``iptables-save`` / ``ip6tables-save`` lines naming a ``KUBE-`` or ``CNI-`` chain,
    each prefixed with its family and table (``"ipv4 nat -A KUBE-SERVICES …"``)."""
    sysctls: tuple[tuple[str, str], ...]
    """Values of `SYSCTLS`."""
    cgroups: tuple[str, ...] = ()
    """The kubelet's cgroup directories (``/sys/fs/cgroup/<controller>/kubepods…``)."""
    paths: tuple[str, ...] = ()
    """Which of `HOST_PATHS` exist, the kubelet's device-plugin socket, and the container log
    links into the node's directory."""
    nftables: tuple[str, ...] = ()
    """Every nftables table as ``"<family> <name>"`` (``"ip filter"``); empty without ``nft``."""
    ipsets: tuple[str, ...] = ()
    """Every ipset's name; empty without ``ipset``."""

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form, read back by `from_dict`."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HostSnapshot:
        """Inverse of `as_dict`. Raises KeyError or TypeError if malformed."""
        return cls(
            mounts=tuple(data["mounts"]),
            links=tuple(data["links"]),
            iptables=tuple(data["iptables"]),
            sysctls=tuple((str(k), str(v)) for k, v in data["sysctls"]),
            cgroups=tuple(data.get("cgroups", ())),
            paths=tuple(data.get("paths", ())),
            nftables=tuple(data.get("nftables", ())),
            ipsets=tuple(data.get("ipsets", ())),
        )


def runtime_dir(node_dir: Path) -> Path:
    """A short directory for `node_dir`'s unix sockets and the kubelet's root directory.

    Unix socket paths are limited to 107 bytes, and the kubelet and containerd create sockets
    deep below their directories; a test's temporary directory is too long for that. This
    is ``/run/agentrun/node-<12 hex of the node directory's hash>`` (``/run`` is a tmpfs, so
    nothing outlives a reboot); `cleanup_host` removes it.
    """
    key = hashlib.sha256(str(node_dir.resolve()).encode()).hexdigest()[:12]
    return RUNTIME_ROOT / f"node-{key}"


def take_snapshot(node_dir: Path) -> HostSnapshot:
    """The node-related host state now; `node_dir` is the node's state directory.

    Raises HostError if ``ip``, ``iptables-save``, ``nft`` or ``ipset`` fails.
    """
    return HostSnapshot(
        mounts=tuple(sorted(_node_mounts(node_dir))),
        links=tuple(sorted(_node_links())),
        iptables=tuple(sorted(_iptables_lines())),
        sysctls=tuple((name, _read_sysctl(name)) for name in SYSCTLS),
        cgroups=tuple(sorted(_node_cgroups())),
        paths=tuple(sorted(_node_paths(node_dir))),
        nftables=tuple(sorted(_nft_tables())),
        ipsets=tuple(sorted(_ipsets())),
    )


def leftovers(before: HostSnapshot, after: HostSnapshot) -> list[str]:
    """What `after` has that `before` had not, one readable line each (empty: clean).

    Sysctls count when their value differs.
    """
    found = [f"mount {m}" for m in after.mounts if m not in before.mounts]
    found += [f"link {link}" for link in after.links if link not in before.links]
    found += [f"iptables {line}" for line in after.iptables if line not in before.iptables]
    old = dict(before.sysctls)
    found += [f"sysctl {k}={v} (was {old.get(k)})" for k, v in after.sysctls if old.get(k) != v]
    found += [f"cgroup {c}" for c in after.cgroups if c not in before.cgroups]
    found += [f"path {p}" for p in after.paths if p not in before.paths]
    found += [f"nftables table {t}" for t in after.nftables if t not in before.nftables]
    found += [f"ipset {name}" for name in after.ipsets if name not in before.ipsets]
    return found


def create_bridge(*, now: float | None = None) -> None:
    """Create `BRIDGE` with address `GATEWAY`/24, up, its alias recording when
    (``agentrun-node:<epoch seconds>``, read by `remove_orphan_bridge`). The CNI bridge plugin
    then uses it.

    Raises HostError if it already exists or ``ip`` fails.
    """
    _run(["ip", "link", "add", "name", BRIDGE, "type", "bridge"])
    _run(["ip", "link", "set", BRIDGE, "alias", f"{BRIDGE_ALIAS}{int(now or time.time())}"])
    _run(["ip", "addr", "add", f"{GATEWAY}/24", "dev", BRIDGE])
    _run(["ip", "link", "set", BRIDGE, "up"])


def remove_orphan_bridge(
    *, log: console.Log = console.log_to_stderr, min_age: float = ORPHAN_MIN_AGE
) -> list[str]:
    """Delete `BRIDGE` and every veth attached to it; returns their names (empty: no bridge).

    For a bridge no claim accounts for: a node killed where this machine's ``/run`` (and so
    `CLAIM_FILE` and its snapshot) was not the caller's, but its network namespace was. Call
    only while holding the claim with no live node before it. A bridge that may still be
    someone's is kept: one with a TCP listener on `GATEWAY` (a live node's kubelet serves
    there), or created less than ``min_age`` seconds ago by its alias (a node still starting:
    its kubelet comes last). Failures to delete are logged.

    Raises HostError (the bridge kept) for a bridge that may be someone's, or if ``ip`` fails
    to list its veths.
    """
    if not Path("/sys/class/net", BRIDGE).exists():
        return []
    if _listening_on(GATEWAY):
        raise HostError(
            f"another agentrun node serves on {GATEWAY} ({BRIDGE}) in this network namespace"
            " but holds no claim here (another mount namespace?): stop it first"
        )
    age = time.time() - _created(BRIDGE)
    if age < min_age:
        raise HostError(
            f"{BRIDGE} was created {age:.0f} s ago by a node this process cannot see (another"
            " mount namespace?), perhaps still starting: stop it, or wait and retry"
        )
    output = _run(["ip", "-o", "link", "show", "master", BRIDGE])
    ports = [line.split(":")[1].strip().split("@")[0] for line in output.splitlines() if line]
    for name in ports:
        _try(["ip", "link", "delete", name], log=log)  # a veth's peer goes with it
    _try(["ip", "link", "delete", BRIDGE], log=log)
    return [*ports, BRIDGE]


def _listening_on(address: str) -> bool:
    """Whether a TCP socket listens on ``address`` in this network namespace (any process)."""
    return any(
        c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.ip == address
        for c in psutil.net_connections(kind="tcp4")
    )


def _created(link: str) -> float:
    """Epoch seconds from ``link``'s alias as `create_bridge` writes it; 0 without one."""
    try:
        alias = Path("/sys/class/net", link, "ifalias").read_text().strip()
        return float(alias.removeprefix(BRIDGE_ALIAS)) if alias.startswith(BRIDGE_ALIAS) else 0.0
    except (OSError, ValueError):
        return 0.0


def cleanup_host(
    node_dir: Path, *, before: HostSnapshot, log: console.Log = console.log_to_stderr
) -> list[str]:
    """Undo what the node added since `before`; returns what is still left (see `leftovers`).

    Call after the node's processes (and its containers) stopped. In order: unmounts every
    new mount point (deepest first, lazily if busy), removes the netns files it pinned,
    deletes new veths and `BRIDGE`, deletes new ``CNI-*`` / ``KUBE-*`` iptables rules and
    chains (kube-proxy's own ``--cleanup`` should run first), destroys new ipsets (once no
    rule refers to them), deletes the new nftables tables (a component's own tables whole;
    the iptables-nft tables the removed rules lived in only once no rule is left in them, so
    one that someone else filled meanwhile is kept and reported), removes its container log
    links and the `HOST_PATHS` it created (when empty), the new (empty) ``kubepods`` cgroups,
    and restores the sysctls.
    Every step runs even if one fails; failures are logged and show up in the result.
    """
    now = take_snapshot(node_dir)
    for mount in sorted(set(now.mounts) - set(before.mounts), key=len, reverse=True):
        if _try(["umount", mount], log=log) is not None:
            _try(["umount", "-l", mount], log=log)
    for directory in NETNS_DIRS:
        for pinned in directory.glob("cni-*") if directory.is_dir() else ():
            with contextlib.suppress(OSError):
                pinned.unlink()
    for link in sorted(set(now.links) - set(before.links), key=lambda n: n == BRIDGE):
        if Path("/sys/class/net", link).exists():  # a veth's peer goes with it
            _try(["ip", "link", "delete", link], log=log)
    _remove_iptables(set(now.iptables) - set(before.iptables), log=log)
    for name in sorted(set(now.ipsets) - set(before.ipsets)):
        _try(["ipset", "destroy", name], log=log)
    _remove_nft_tables(sorted(set(now.nftables) - set(before.nftables)), log=log)
    # Deepest first; a directory someone else filled is kept, a busy cgroup too.
    _remove_paths(sorted(set(now.paths) - set(before.paths), key=len, reverse=True))
    _remove_paths(sorted(set(now.cgroups) - set(before.cgroups), key=len, reverse=True))
    _restore_sysctls(before.sysctls)
    left = leftovers(before, take_snapshot(node_dir))
    if not any(line.startswith("mount ") for line in left):
        shutil.rmtree(runtime_dir(node_dir), ignore_errors=True)
    return left


def _remove_paths(paths: Sequence[str]) -> None:
    """Unlink files and links, rmdir directories (only empty ones go); errors are ignored."""
    for path in map(Path, paths):
        with contextlib.suppress(OSError):
            if path.is_dir() and not path.is_symlink():
                path.rmdir()
            else:
                path.unlink()


def _restore_sysctls(values: Sequence[tuple[str, str]]) -> None:
    for name, value in values:
        if _read_sysctl(name) != value:
            with contextlib.suppress(OSError):
                (Path("/proc/sys") / name).write_text(value)


@contextlib.contextmanager
def _claim_lock() -> Iterator[None]:
    CLAIM_DIR.mkdir(parents=True, exist_ok=True)
    with (CLAIM_DIR / "node.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def claim_host(
    node_dir: Path,
    *,
    owner: procs.ProcessRecord,
    wait: float = 0.0,
    log: console.Log = console.log_to_stderr,
) -> Path | None:
    """Record that the node in `node_dir` (kept alive by `owner`) holds this machine.

    If another live node holds it, waits up to `wait` seconds for it to go. A claim whose
    owner died (e.g. a killed test run) is taken over: returns that node's directory, so the
    caller can clean up after it first; else None.

    Raises HostError if another node still holds the machine after `wait`.
    """

    def take() -> Path | None:
        with _claim_lock():
            current = _read_claim()
            if current is not None and procs.is_alive(
                procs.ProcessRecord.from_dict(current["owner"])
            ):
                raise HostError(
                    f"another agentrun node ({current['directory']}) runs on this machine:"
                    " stop it (`agentrun dev down` for its stack) or wait for its test run"
                    " to finish"
                )
            _write_claim({"directory": str(node_dir), "owner": owner.as_dict()})
            if current is None or current["directory"] == str(node_dir):
                return None
            return Path(current["directory"])

    return retry_while_held(take, wait=wait, poll=2.0, log=log)


def retry_while_held(attempt: Callable[[], T], *, wait: float, poll: float, log: console.Log) -> T:
    """``attempt()``'s result, calling it again every `poll` seconds for up to `wait` seconds
    while it raises HostError (something on the host is another node's); the first refusal
    is logged once, with how long this waits.

    Raises the last HostError once `wait` is over."""
    deadline = time.monotonic() + wait
    announced = False
    while True:
        try:
            return attempt()
        except HostError as exc:
            if time.monotonic() >= deadline:
                raise
            if not announced:
                log(f"{exc}; waiting up to {wait:.0f} s")
                announced = True
            time.sleep(poll)


def update_claim(node_dir: Path, *, owner: procs.ProcessRecord) -> None:
    """Make `owner` the process whose life keeps `node_dir`'s claim (e.g. containerd)."""
    with _claim_lock():
        _write_claim({"directory": str(node_dir), "owner": owner.as_dict()})


def release_host(node_dir: Path) -> None:
    """Remove the claim if `node_dir` holds it."""
    with _claim_lock():
        current = _read_claim()
        if current is not None and current["directory"] == str(node_dir):
            CLAIM_FILE.unlink(missing_ok=True)


def claim_holder() -> Path | None:
    """The directory of the node that holds this machine now, if any (alive or not)."""
    with _claim_lock():
        current = _read_claim()
    return None if current is None else Path(current["directory"])


def _read_claim() -> dict[str, Any] | None:
    try:
        data = json.loads(CLAIM_FILE.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and "owner" in data else None


def _write_claim(data: dict[str, Any]) -> None:
    partial = CLAIM_FILE.with_name(f".node.json.{os.getpid()}")
    partial.write_text(json.dumps(data))
    os.replace(partial, CLAIM_FILE)


def _node_mounts(node_dir: Path) -> list[str]:
    prefixes = [str(node_dir.resolve()), str(runtime_dir(node_dir)), "/run/containerd"]
    prefixes += [str(d) for d in NETNS_DIRS]
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if any(point == p or point.startswith(p + "/") for p in prefixes):
            points.append(point)
    return points


def _node_paths(node_dir: Path) -> list[str]:
    found = [str(path) for path in HOST_PATHS if path.is_dir()]
    if KUBELET_PLUGIN_SOCKET.exists():
        found.append(str(KUBELET_PLUGIN_SOCKET))
    prefixes = (str(node_dir.resolve()) + "/", str(runtime_dir(node_dir)) + "/")
    if CONTAINER_LOGS.is_dir():
        for link in CONTAINER_LOGS.iterdir():
            with contextlib.suppress(OSError):
                if link.is_symlink() and os.readlink(link).startswith(prefixes):
                    found.append(str(link))
    return found


def _node_cgroups() -> list[str]:
    found = []
    for top in Path("/sys/fs/cgroup").glob("*/kubepods"):
        found += [root for root, _, _ in os.walk(top)]
    return found


def _node_links() -> list[str]:
    output = _run(["ip", "-o", "link", "show"])
    names = [line.split(":")[1].strip().split("@")[0] for line in output.splitlines() if line]
    return [n for n in names if n == BRIDGE or n.startswith("veth")]


def _iptables_lines() -> list[str]:
    lines = []
    for family, command in (("ipv4", "iptables-save"), ("ipv6", "ip6tables-save")):
        table = ""
        for line in _run([command]).splitlines():
            if line.startswith("*"):
                table = line[1:]
            elif any(prefix in line for prefix in _IPTABLES_PREFIXES) and (
                line.startswith("-A") or line.startswith(":")
            ):
                entry = line.split(" [", 1)[0] if line.startswith(":") else line
                lines.append(f"{family} {table} {entry}")
    return lines


def _remove_iptables(lines: set[str], *, log: console.Log) -> None:
    """Delete the given rules (``-A`` lines), then flush and delete the given chains."""
    commands = {"ipv4": "iptables", "ipv6": "ip6tables"}
    rules = [line.split(" ", 2) for line in sorted(lines) if line.split(" ", 2)[2].startswith("-A")]
    for family, table, rule in rules:
        _try([commands[family], "-t", table, "-D", *shlex.split(rule[3:])], log=log)
    chains = [line.split(" ", 2) for line in sorted(lines) if line.split(" ", 2)[2].startswith(":")]
    for family, table, chain in chains:
        _try([commands[family], "-t", table, "-F", chain[1:].split()[0]], log=log)
    for family, table, chain in chains:
        _try([commands[family], "-t", table, "-X", chain[1:].split()[0]], log=log)


def _nft_tables() -> list[str]:
    """``"<family> <name>"`` of every nftables table (``nft list tables``)."""
    if shutil.which("nft") is None:
        return []
    lines = _run(["nft", "list", "tables"]).splitlines()
    return [line.removeprefix("table ").strip() for line in lines if line.startswith("table ")]


def _ipsets() -> list[str]:
    """The names of every ipset (``ipset list -name``)."""
    if shutil.which("ipset") is None:
        return []
    return [line.strip() for line in _run(["ipset", "list", "-name"]).splitlines() if line.strip()]


def _remove_nft_tables(tables: Sequence[str], *, log: console.Log) -> None:
    """Delete each of `tables` (``"<family> <name>"``): a component's own table whole, an
    iptables-nft table (`IPTABLES_NFT_TABLES`, shared with every iptables user) only once it
    holds no rule."""
    for table in tables:
        family, name = table.split(" ", 1)
        if name in IPTABLES_NFT_TABLES:
            try:
                listed = json.loads(_run(["nft", "-j", "list", "table", family, name]))
            except (HostError, OSError, subprocess.SubprocessError, ValueError) as exc:
                log(f"cleanup: cannot list nftables table {table}: {exc}")
                continue
            if any("rule" in entry for entry in listed.get("nftables", [])):
                log(f"cleanup: nftables table {table} still holds rules: kept")
                continue
        _try(["nft", "delete", "table", family, name], log=log)


def _read_sysctl(name: str) -> str:
    try:
        return (Path("/proc/sys") / name).read_text().strip()
    except OSError:
        return ""


def _run(argv: Sequence[str]) -> str:
    result = subprocess.run(list(argv), capture_output=True, text=True, check=False, timeout=60)
    if result.returncode != 0:
        raise HostError(f"`{' '.join(argv)}` failed: {result.stderr.strip()}")
    return result.stdout


def _try(argv: Sequence[str], *, log: console.Log) -> str | None:
    """Run `argv`; None on success, else its error (logged)."""
    try:
        _run(argv)
    except (HostError, OSError, subprocess.SubprocessError) as exc:
        log(f"cleanup: {exc}")
        return str(exc)
    return None
