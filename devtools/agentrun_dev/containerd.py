"""containerd (Debian's package) as the node's container runtime, with all its state in one
directory, and the CNI network its pods get.

`start_containerd` writes a config whose root, state, socket, runc state and CNI config all
live under the given directory, with the CRI settings this kind of machine needs:

- ``restrict_oom_score_adj = true``: the sandbox forbids lowering ``oom_score_adj``; without
  it every pod sandbox fails with runc's "can't get final child's PID from pipe".
- runc with ``SystemdCgroup = false`` (there is no systemd; the kubelet uses ``cgroupfs``).
- CNI plugins from ``/usr/lib/cni`` (Debian's path), a bridge (`nodehost.BRIDGE`) +
  host-local + portmap network on `nodehost.POD_SUBNET`, and the locally built pause image
  as ``sandbox_image`` (nothing is pulled: no registry is reachable).

`import_image` loads an image archive (``docker-archive`` or OCI tarball) into the CRI's
``k8s.io`` namespace. `stop_containers` ends every container of the node by the pids its
shims recorded, for when the kubelet could not tear the pods down itself.

What belongs here: containerd's config, process, images and containers. The kubelet and the
rest of the node are `node`'s.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from pathlib import Path

from agentrun_dev import components, console, nodehost, probes

CNI_BIN_DIR = Path("/usr/lib/cni")
NETWORK_NAME = "agentrun"
_CONFIG = """version = 2
root = "{root}"
state = "{state}"
disabled_plugins = [
  "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.zfs",
]

[grpc]
  address = "{socket}"

[plugins."io.containerd.internal.v1.opt"]
  path = "{opt}"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{sandbox_image}"
  restrict_oom_score_adj = true
  disable_apparmor = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "{runc_root}"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{cni_bin}"
    conf_dir = "{cni_conf}"
    max_conf_num = 1
"""


class ContainerdError(RuntimeError):
    """containerd or ctr is missing, or a ctr command failed; the message says which."""


def socket_path(directory: Path) -> Path:
    """containerd's gRPC socket for the node state in `directory` (in its short
    `nodehost.runtime_dir`: socket paths are limited to 107 bytes)."""
    return nodehost.runtime_dir(directory) / "containerd.sock"


def start_containerd(
    directory: Path, *, sandbox_image: str, launch: components.Launch
) -> components.Component:
    """Write the config and CNI network under ``directory/containerd`` and start containerd.

    Args:
        directory: the node's state directory.
        sandbox_image: the pause image's name; it must be imported (`import_image`) before
            the first pod starts.
        launch: log directory (the log is ``containerd.log``), lifetime, progress output.

    Raises:
        ContainerdError: no containerd binary (install the node's Debian packages).
        probes.NotReadyError: its socket did not answer within 30 s (with its log tail).
    """
    base = directory / "containerd"
    for sub in ("root", "state", "opt", "runc", "net.d", "cni-ipam"):
        (base / sub).mkdir(parents=True, exist_ok=True)
    socket_path(directory).parent.mkdir(parents=True, exist_ok=True)
    write_cni_config(base / "net.d", ipam_dir=base / "cni-ipam")
    config = base / "config.toml"
    config.write_text(
        _CONFIG.format(
            root=base / "root",
            state=base / "state",
            socket=socket_path(directory),
            opt=base / "opt",
            sandbox_image=sandbox_image,
            runc_root=base / "runc",
            cni_bin=CNI_BIN_DIR,
            cni_conf=base / "net.d",
        )
    )
    binary = _which("containerd")
    spec = launch.spec("containerd", (str(binary), "--config", str(config)))
    probe = probes.Probe(url=f"unix://{socket_path(directory)}")
    return components.start_component(spec, probe=probe, log=launch.log)


def write_cni_config(conf_dir: Path, *, ipam_dir: Path) -> Path:
    """Write the pods' CNI network: `nodehost.BRIDGE` (gateway, masquerade, hairpin),
    host-local addresses from `nodehost.POD_SUBNET` kept in `ipam_dir`, and portmap.

    Returns the ``.conflist`` path.
    """
    network = {
        "cniVersion": "0.4.0",
        "name": NETWORK_NAME,
        "plugins": [
            {
                "type": "bridge",
                "bridge": nodehost.BRIDGE,
                "isGateway": True,
                "ipMasq": True,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "dataDir": str(ipam_dir),
                    "ranges": [[{"subnet": nodehost.POD_SUBNET, "gateway": nodehost.GATEWAY}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}, "snat": True},
        ],
    }
    path = conf_dir / "10-agentrun.conflist"
    path.write_text(json.dumps(network, indent=2) + "\n")
    return path


def import_image(
    directory: Path, archive: Path, *, log: console.Log = console.log_to_stderr
) -> None:
    """Import the image archive `archive` into the node's containerd (namespace ``k8s.io``).

    Pods then run it with ``imagePullPolicy: Never`` or ``IfNotPresent``. Raises
    ContainerdError if ``ctr`` fails (e.g. containerd is not running).
    """
    log(f"importing {archive.name} into the node's containerd")
    ctr(directory, "images", "import", "--no-unpack=false", str(archive))


def ctr(directory: Path, *args: str, timeout: float = 300.0) -> str:
    """Run ``ctr --address <socket> -n k8s.io args…``; returns its stdout.

    Raises ContainerdError with its stderr on failure.
    """
    argv = [str(_which("ctr")), "--address", str(socket_path(directory)), "-n", "k8s.io", *args]
    result = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=timeout)
    if result.returncode != 0:
        raise ContainerdError(f"`ctr {' '.join(args)}` failed: {result.stderr.strip()}")
    return result.stdout


def stop_containers(directory: Path) -> int:
    """SIGKILL every container process and shim of the node, by the pids they recorded.

    The runc v2 shim writes ``init.pid`` (the container's first process) and ``shim.pid``
    into each task's bundle under containerd's state directory. Returns how many processes
    were signalled. For a node whose kubelet could not remove its pods; normally the kubelet
    stops them first.
    """
    tasks = directory / "containerd" / "state" / "io.containerd.runtime.v2.task"
    signalled = 0
    for name in ("init.pid", "shim.pid"):
        for pid_file in sorted(tasks.glob(f"*/*/{name}")) if tasks.is_dir() else ():
            with contextlib.suppress(OSError, ValueError):
                os.kill(int(pid_file.read_text().strip()), signal.SIGKILL)
                signalled += 1
    return signalled


def _which(name: str) -> Path:
    for directory in ("/usr/bin", "/usr/sbin", "/usr/local/bin"):
        candidate = Path(directory) / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    raise ContainerdError(
        f"{name} not found: install the node's Debian packages (`make node-packages`)"
    )
