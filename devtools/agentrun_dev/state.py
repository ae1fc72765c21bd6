"""The local stack's state file: which components run, with which pids, ports and logs.

``agentrun dev up`` writes ``<dir>/state.json`` after every component it starts, so ``down``
(another invocation, maybe after a crash halfway through ``up``) can stop each one by pid.
The directory is ``./.agentrun/dev`` (or the nearest one with a state in a parent directory)
unless ``AGENTRUN_DEV_DIR`` or an option says otherwise.

What belongs here: the state's shape, where it lives, reading and writing it atomically, and
the directory lock. What the components are is `stack`'s business.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from agentrun_dev.components import Component  # the field `components` shadows the module

DIR_ENV = "AGENTRUN_DEV_DIR"
DEFAULT_DIR = Path(".agentrun") / "dev"
STATE_FILE = "state.json"
_VERSION = 1


class StateError(RuntimeError):
    """The state file exists but cannot be read; the message names it."""


@dataclasses.dataclass(frozen=True, slots=True)
class StackState:
    """What runs for one state directory. Fields are None until the piece has started."""

    directory: Path
    kubeconfig: str | None = None
    """``KUBECONFIG`` value for the cluster (ours or an existing one)."""
    kubectl: Path | None = None
    existing_cluster: bool = False
    """True when the cluster is the user's (``AGENTRUN_USE_EXISTING_CLUSTER=1``)."""
    nats_url: str | None = None
    nats_auth_dir: Path | None = None
    """The closed nats-server's CA and ``.creds`` files (``natsserver``); None when open."""
    model_url: str | None = None
    """OpenAI-compatible base URL of the mock model, ``http://127.0.0.1:<port>/v1``."""
    components: tuple[Component, ...] = ()
    """In start order; stopped in reverse."""
    node_dir: Path | None = None
    """The node's state directory when the stack runs a real node (``up --node``)."""
    release_namespace: str | None = None
    """Namespace of the Helm release when the chart runs the services as pods (``--chart``)."""
    complete: bool = False
    """Set once ``up`` started everything; False after an interrupted ``up``."""

    @property
    def log_dir(self) -> Path:
        """``<directory>/logs``: every component's log file."""
        return self.directory / "logs"

    def env(self) -> dict[str, str]:
        """Variables a shell (or a test) needs to use the stack; only those known so far.

        ``KUBECONFIG``, ``AGENTRUN_NATS_URL``, ``AGENTRUN_MODEL_URL`` (the mock model's
        base URL, to put in an AgentModel's ``baseURL``) and, for a closed NATS server,
        ``AGENTRUN_NATS_CA_FILE`` and ``AGENTRUN_NATS_CREDS_FILE`` (the dev stack's admin
        user, for ``kubectl agentrun logs`` and your own clients).
        """
        auth = self.nats_auth_dir
        env = {
            "KUBECONFIG": self.kubeconfig,
            "AGENTRUN_NATS_URL": self.nats_url,
            "AGENTRUN_NATS_CA_FILE": None if auth is None else str(auth / "ca.crt"),
            "AGENTRUN_NATS_CREDS_FILE": None if auth is None else str(auth / "admin.creds"),
            "AGENTRUN_MODEL_URL": self.model_url,
        }
        return {k: v for k, v in env.items() if v is not None}

    def component(self, name: str) -> Component | None:
        """The component called `name`, if any."""
        return next((c for c in self.components if c.name == name), None)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form, read back by `from_dict`."""
        return {
            "version": _VERSION,
            "directory": str(self.directory),
            "kubeconfig": self.kubeconfig,
            "kubectl": None if self.kubectl is None else str(self.kubectl),
            "existing_cluster": self.existing_cluster,
            "nats_url": self.nats_url,
            "nats_auth_dir": None if self.nats_auth_dir is None else str(self.nats_auth_dir),
            "model_url": self.model_url,
            "components": [c.as_dict() for c in self.components],
            "node_dir": None if self.node_dir is None else str(self.node_dir),
            "release_namespace": self.release_namespace,
            "complete": self.complete,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StackState:
        """Inverse of `as_dict`. Raises KeyError, TypeError or ValueError if malformed."""
        if data.get("version") != _VERSION:
            raise ValueError(f"unsupported state version {data.get('version')!r}")
        kubectl = data.get("kubectl")
        node_dir = data.get("node_dir")
        return cls(
            directory=Path(data["directory"]),
            kubeconfig=data.get("kubeconfig"),
            kubectl=None if kubectl is None else Path(kubectl),
            existing_cluster=bool(data.get("existing_cluster", False)),
            nats_url=data.get("nats_url"),
            nats_auth_dir=None
            if data.get("nats_auth_dir") is None
            else Path(data["nats_auth_dir"]),
            model_url=data.get("model_url"),
            components=tuple(Component.from_dict(c) for c in data["components"]),
            node_dir=None if node_dir is None else Path(node_dir),
            release_namespace=data.get("release_namespace"),
            complete=bool(data.get("complete", False)),
        )


def resolve_dir(option: Path | None = None) -> Path:
    """The state directory: `option`, else ``$AGENTRUN_DEV_DIR``, else the nearest
    ``.agentrun/dev`` holding a stack's state in the current directory or one of its parents
    (as git finds ``.git``: ``agentrun dev env`` from a folder of one's own manifests finds
    the stack started at the repository's root), else ``./.agentrun/dev``.

    Returned absolute (resolved against the current directory), since the stack's processes
    and later invocations may run elsewhere.
    """
    if option is not None:
        return option.resolve()
    from_env = os.environ.get(DIR_ENV, "").strip()
    if from_env:
        return Path(from_env).resolve()
    here = Path.cwd()
    for folder in (here, *here.parents):
        if (folder / DEFAULT_DIR / STATE_FILE).is_file():
            return folder / DEFAULT_DIR
    return DEFAULT_DIR.resolve()


def load_state(directory: Path) -> StackState | None:
    """The state saved in `directory`, or None if there is none.

    Raises StateError if the file exists but is not a valid state.
    """
    path = directory / STATE_FILE
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    try:
        return StackState.from_dict(json.loads(text))
    except (ValueError, KeyError, TypeError) as exc:
        raise StateError(f"{path} is not a valid agentrun dev state ({exc}); remove it") from exc


def save_state(state: StackState) -> None:
    """Write `state` to ``<directory>/state.json`` atomically (temp file, then rename)."""
    state.directory.mkdir(parents=True, exist_ok=True)
    path = state.directory / STATE_FILE
    partial = path.with_name(f".{STATE_FILE}.{os.getpid()}")
    partial.write_text(json.dumps(state.as_dict(), indent=2) + "\n")
    os.replace(partial, path)


@contextlib.contextmanager
def locked(directory: Path) -> Iterator[None]:
    """Hold an exclusive lock on the state directory (``<directory>/.lock``).

    Serialises concurrent ``up`` / ``down`` invocations on one directory. Raises StateError at
    once if another invocation holds it.
    """
    directory.mkdir(parents=True, exist_ok=True)
    with (directory / ".lock").open("a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            raise StateError(f"another agentrun dev command is using {directory}") from exc
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
