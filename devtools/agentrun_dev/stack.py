"""The full local stack: cluster, nats-server, mock model, operator and workers.

Two layers, one code path for tests and demos:

- Starters, reused by test fixtures: `start_mockllm`, `start_operator`, `start_worker` start
  one managed process each (see `components.Component`) with the given environment and wait
  until it answers; `kill_component` crashes one (SIGKILL), `restart_component` starts it
  again with the same spec, `stop_component` stops it.
- `up` / `down` / `status` behind ``agentrun dev``: start everything in order, recording each
  component in the state directory as it comes up (see `state`); stop everything by pid in
  reverse order; report what is alive. With ``UpOptions.node`` the cluster gets a real node
  (see `node`) right after the control plane; ``down`` stops it with `node.stop_node`, which
  also removes what it left on the host. With ``UpOptions.chart`` the node runs the services
  instead: the project's images are imported and the Helm chart installed (see `release`),
  so NATS, the mock model, the operator and the workers are pods, not local processes.

What belongs here: which components make the stack and how they are wired
(``KUBECONFIG``, ``AGENTRUN_NATS_URL``, ``AGENTRUN_NATS_CA_FILE``, ``AGENTRUN_NATS_CREDS_FILE``,
``AGENTRUN_RUN_TRUST_FILE``, ``AGENTRUN_RUN_SIGNING_FILE``, ``AGENTRUN_METRICS_PORT``, see
docs/contracts.md): on the closed NATS server the operator presents ``operator.creds`` and the
workers ``worker.creds``, as in the chart; the operator alone gets the run-signing keys
(`write_run_keys`), every process the trusted public keys.
How one process is started, probed or stopped belongs to `procs`, `probes`, `components`.
"""

from __future__ import annotations

import dataclasses
import shutil
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import agentrun
from agentrun.trust import keys as run_keys
from agentrun_dev import (
    binaries,
    components,
    console,
    controlplane,
    kubectl,
    natscluster,
    natsserver,
    node,
    probes,
    release,
    state,
)
from agentrun_dev.components import (
    Launch,
    kill_component,
    restart_component,
    stop_component,
)

__all__ = [
    "ComponentStatus",
    "Launch",
    "UpOptions",
    "default_crd_dir",
    "down",
    "kill_component",
    "mockllm_url",
    "restart_component",
    "script_path",
    "service_env",
    "start_mockllm",
    "start_operator",
    "start_worker",
    "status",
    "stop_component",
    "up",
]

DEFAULT_SCENARIOS = Path("examples") / "scenarios.yaml"
CREDS_DIR_ENV = "AGENTRUN_DEV_NATS_CREDS_DIR"
"""Where `service_env` says the ``<role>.creds`` files are; `start_operator` and
`start_worker` turn it into the process's ``AGENTRUN_NATS_CREDS_FILE``."""
SIGNING_FILE_ENV = "AGENTRUN_DEV_RUN_SIGNING_FILE"
"""Where `service_env` says the operator's run-signing file is; `start_operator` turns it into
its ``AGENTRUN_RUN_SIGNING_FILE`` (the workers never get it)."""
RUN_KEYS_DIR = "run-keys"
"""The folder, next to the nats-server's store, of the stack's run-signing keys."""
OPERATOR_SCRIPT = "agentrun-operator"
WORKER_SCRIPT = "agentrun-worker"


@dataclasses.dataclass(frozen=True, slots=True)
class UpOptions:
    """What ``agentrun dev up`` starts."""

    workers: int = 2
    """Number of ``agentrun-worker`` processes."""
    scenarios: tuple[Path, ...] = (DEFAULT_SCENARIOS,)
    """Scenario YAML files for the mock model."""
    crd_dir: Path | None = None
    """Directory of CRD YAML; None looks in ``./crds``, then in the installed package."""
    node: bool = False
    """Also run a real single node (containerd, kubelet, kube-proxy, CoreDNS …; root only)."""
    chart: bool = False
    """Run a node (implies `node`) and ``helm install`` the chart on it: NATS, the mock model
    (the chart's copy of the example scenarios; `scenarios` is not used), the operator and
    `workers` workers run as pods in namespace `release.RELEASE_NAMESPACE`."""

    node_wait: float = 0.0
    """Seconds to wait for another node on this machine to stop (0: refuse at once)."""
    nats_servers: int = 1
    """NATS servers: 1, or more for a JetStream cluster on loopback (``natscluster``) whose
    streams and buckets the operator keeps at that many replicas (``AGENTRUN_NATS_REPLICAS``)."""

    @property
    def with_node(self) -> bool:
        """Whether a node is started."""
        return self.node or self.chart


@dataclasses.dataclass(frozen=True, slots=True)
class ComponentStatus:
    """One row of ``agentrun dev status``."""

    name: str
    pid: int
    alive: bool
    ports: Mapping[str, int]
    log_path: Path


def script_path(name: str) -> Path:
    """A console script installed next to ``sys.executable`` (the venv's bin), else on PATH.

    Raises FileNotFoundError if neither has it.
    """
    beside = Path(sys.executable).parent / name
    if beside.is_file():
        return beside
    found = shutil.which(name)
    if found is None:
        raise FileNotFoundError(
            f"{name} not found next to {sys.executable} nor on PATH: pip install -e . in the repo"
        )
    return Path(found)


STOP_GRACE = 10.0
"""Seconds a stopped service gets after SIGTERM before SIGKILL (``stop_component``'s wait)."""


def service_env(
    *,
    kubeconfig: str,
    nats: natsserver.NatsServer,
    replicas: int = 1,
    urls: Sequence[str] = (),
) -> dict[str, str]:
    """Environment shared by the operator and workers (contracts.md), minus the metrics port
    and the NATS credentials, which `start_operator` and `start_worker` pick per role from
    ``AGENTRUN_DEV_NATS_CREDS_DIR`` (a closed `nats` server's files).

    Includes ``PYTHONUNBUFFERED=1`` so their logs are written as they happen,
    ``AGENTRUN_DEFAULT_TENANT=default`` (the AgentTenant the demo creates), and a short leader
    Lease (8 s; a leader gives up after 6 s without renewal), so that an operator restarted in
    place takes over within seconds, while a slow API server on a busy machine does not make
    it give up; and a worker's grace period of ``STOP_GRACE`` seconds, the time its stop waits
    before SIGKILL, less a 3 s margin for its drain. ``replicas`` > 1 (a NATS cluster) is
    passed as ``AGENTRUN_NATS_REPLICAS``. ``urls``: every server of a NATS cluster (`nats`
    one of them), given comma-separated as ``AGENTRUN_NATS_URL`` so that a process starts
    and reconnects while any one server is down; empty: ``nats.url`` alone.
    """
    env = {
        "KUBECONFIG": kubeconfig,
        "AGENTRUN_NATS_URL": ",".join(urls) or nats.url,
        "PYTHONUNBUFFERED": "1",
        "AGENTRUN_DEFAULT_TENANT": "default",
        "AGENTRUN_LEASE_DURATION": "8",
        "AGENTRUN_LEASE_RENEW_DEADLINE": "6",
        "AGENTRUN_LEASE_RETRY": "1",
        # a stopped worker drains within the 10 s its stop waits before SIGKILL
        "AGENTRUN_TERMINATION_GRACE": str(STOP_GRACE),
        "AGENTRUN_DRAIN_MARGIN": "3",
    }
    if replicas > 1:
        env["AGENTRUN_NATS_REPLICAS"] = str(replicas)
    if nats.store_bytes:
        env["AGENTRUN_JETSTREAM_STORE_BYTES"] = str(nats.store_bytes)
    if nats.auth_dir is not None:
        env["AGENTRUN_NATS_CA_FILE"] = str(nats.auth_dir / "ca.crt")
        env[CREDS_DIR_ENV] = str(nats.auth_dir)
    signing, trusted = write_run_keys(nats.store_dir.parent / RUN_KEYS_DIR)
    env["AGENTRUN_RUN_TRUST_FILE"] = str(trusted)
    env[SIGNING_FILE_ENV] = str(signing)
    return env


def start_nats(
    directory: Path, *, servers: int, launch: components.Launch
) -> tuple[natsserver.NatsServer, tuple[str, ...], tuple[components.Component, ...]]:
    """The stack's NATS in ``<directory>/nats``: one closed nats-server, or with `servers` > 1
    a JetStream cluster of that many (``natscluster``). Returns (its first server, whose files
    and URL the stack records; every server's client URL, which the stack's clients are
    given; every component started). Raises what ``start_nats_server`` /
    ``start_nats_cluster`` raise."""
    if servers == 1:
        nats = natsserver.start_nats_server(directory / "nats", launch=launch)
        return nats, (nats.url,), (nats.component,)
    cluster = natscluster.start_nats_cluster(directory / "nats", size=servers, launch=launch)
    started = tuple(server.component for server in cluster.servers)
    return cluster.servers[0], tuple(cluster.urls), started


def write_run_keys(directory: Path) -> tuple[Path, Path]:
    """The stack's run-signing keys in `directory` (``signing.json``, ``trust.json``), made by
    the runtime's own code (`agentrun.trust.keys`) unless they are there already (a revived
    stack keeps its keys, so its runs' seals still verify). Returns both paths."""
    directory.mkdir(parents=True, exist_ok=True)
    signing, trusted = directory / run_keys.SIGNING_FILE, directory / run_keys.TRUST_FILE
    if not (signing.exists() and trusted.exists()):
        made = run_keys.generate(now=0.0)
        signing.touch(mode=0o600)
        signing.write_text(made[0].text())
        trusted.write_text(made[1].text())
    return signing, trusted


def start_mockllm(
    scenarios: Sequence[Path],
    *,
    launch: components.Launch,
    port: int | None = None,
    env: Mapping[str, str] | None = None,
    name: str = "mockllm",
    strict_call_ids: bool = True,
) -> components.Component:
    """Start ``python -m agentrun.testing.mockllm`` and wait until ``/healthz`` answers ok.

    Args:
        scenarios: scenario YAML files (joined with ',' for ``--scenarios``).
        launch: log directory (the log is ``<name>.log``), lifetime, progress output.
        port: loopback port; None picks a free one. Its base URL is `mockllm_url`.
        env: extra environment.
        name: the component's name; a second server in one launch needs its own.
        strict_call_ids: False passes ``--no-strict-call-ids`` (any unique string id is
            accepted; for clients that echo the model's ids as given).

    Raises:
        probes.NotReadyError: it exited or did not answer within 30 s (with its log tail).
    """
    port = probes.free_port() if port is None else port
    argv = [sys.executable, "-m", "agentrun.testing.mockllm", "--host", "127.0.0.1"]
    argv += ["--port", str(port), "--scenarios", ",".join(str(p) for p in scenarios)]
    argv += [] if strict_call_ids else ["--no-strict-call-ids"]
    spec = launch.spec(name, argv, env={"PYTHONUNBUFFERED": "1", **(env or {})})
    probe = probes.Probe(url=f"http://127.0.0.1:{port}/healthz", expect="ok")
    return launch.start(spec, probe=probe, ports={"http": port})


def mockllm_url(component: components.Component) -> str:
    """The mock model's OpenAI base URL, ``http://127.0.0.1:<port>/v1``."""
    return f"http://127.0.0.1:{component.ports['http']}/v1"


def start_operator(
    env: Mapping[str, str],
    *,
    launch: components.Launch,
    metrics_port: int | None = None,
    name: str = "operator",
) -> components.Component:
    """Start ``agentrun-operator`` with `env` and wait until its metrics port answers.

    Args:
        env: its environment on top of ours, e.g. `service_env` plus test settings.
        launch: log directory (the log is ``<name>.log``), lifetime, progress output.
        metrics_port: ``AGENTRUN_METRICS_PORT``; None picks a free one; 0 disables metrics
            (then it counts as ready once started).
        name: the component's name; a second operator (a standby) needs its own.

    Raises:
        FileNotFoundError: the console script is not installed.
        probes.NotReadyError: it exited, or ``/metrics`` did not answer within 30 s.
    """
    env = _with_creds(env, "operator")
    if SIGNING_FILE_ENV in env and "AGENTRUN_RUN_SIGNING_FILE" not in env:
        env["AGENTRUN_RUN_SIGNING_FILE"] = env[SIGNING_FILE_ENV]
    return _start_service(OPERATOR_SCRIPT, name, env=env, launch=launch, metrics_port=metrics_port)


def start_worker(
    index: int,
    *,
    env: Mapping[str, str],
    launch: components.Launch,
    metrics_port: int | None = None,
) -> components.Component:
    """Start ``agentrun-worker`` number `index`, named ``worker-<index>``.

    Its log is ``worker-<index>.log``; otherwise as `start_operator`.
    """
    return _start_service(
        WORKER_SCRIPT,
        f"worker-{index}",
        env={k: v for k, v in _with_creds(env, "worker").items() if k != SIGNING_FILE_ENV},
        launch=launch,
        metrics_port=metrics_port,
    )


def _with_creds(env: Mapping[str, str], role: str) -> dict[str, str]:
    """`env` with ``AGENTRUN_NATS_CREDS_FILE`` set to `role`'s creds when it names a creds
    directory (``AGENTRUN_DEV_NATS_CREDS_DIR``) and sets no creds file itself."""
    directory = env.get(CREDS_DIR_ENV)
    if directory is None or "AGENTRUN_NATS_CREDS_FILE" in env:
        return dict(env)
    return {**env, "AGENTRUN_NATS_CREDS_FILE": str(Path(directory) / f"{role}.creds")}


def default_crd_dir(option: Path | None = None) -> Path:
    """Where the CRDs are: `option`, else ``./crds``, else ``crds/`` in the installed package.

    Raises FileNotFoundError naming the places looked at if none holds a YAML file.
    """
    candidates = (
        [option]
        if option is not None
        else [Path.cwd() / "crds", Path(agentrun.__file__).parent / "crds"]
    )
    for candidate in candidates:
        if candidate.is_dir() and kubectl.crd_files(candidate):
            return candidate
    raise FileNotFoundError(
        f"no CRD YAML in {' or '.join(str(c) for c in candidates)}: run from the repo root"
        " or pass --crds DIR"
    )


def up(
    directory: Path, *, options: UpOptions, log: console.Log = console.log_to_stderr
) -> state.StackState:
    """Start the whole stack with its state in `directory`, or revive it if already up.

    If a complete stack is recorded there, restarts only its dead components (same specs and
    ports) and returns. A stack left half-started by an interrupted ``up`` is stopped and
    started afresh. Otherwise starts, in order: cluster, CRDs (waits until Established),
    nats-server, mock model, operator, workers; the state is saved after each, and if a step
    fails everything started is stopped and the state removed before the error propagates.
    With ``options.chart``: cluster, node, the project's images imported, ``helm install``
    of the chart (its CRDs included) until its pods are Ready.

    Raises:
        FileNotFoundError: a scenario file, the CRDs, the chart or a console script is missing
            (checked before anything starts).
        state.StateError: another ``agentrun dev`` command holds the directory.
        probes.NotReadyError, controlplane.ClusterError, kubectl.KubectlError,
        gobuild.BuildError, image.ImageError, helm.HelmError: a step failed.
    """
    with state.locked(directory):
        current = state.load_state(directory)
        if current is not None and current.complete:
            return _revive(current, options=options, log=log)
        if current is not None:
            log(f"a previous `up` in {directory} did not finish: stopping what it started")
            _stop_all(current, log=log)
            _remove_state(directory)
        return _start_all(directory, options=options, log=log)


def down(directory: Path, *, log: console.Log = console.log_to_stderr) -> state.StackState | None:
    """Stop every recorded component by pid, in reverse start order, and remove the state.

    Logs (``<directory>/logs``) are kept. Returns the state that was stopped, or None if
    nothing was recorded. Raises state.StateError like `up`.
    """
    with state.locked(directory):
        current = state.load_state(directory)
        if current is None:
            log(f"nothing is up in {directory}")
            return None
        _stop_all(current, log=log)
        _remove_state(directory)
        log(f"stopped; logs kept in {current.log_dir}")
        return current


def status(current: state.StackState) -> list[ComponentStatus]:
    """One row per recorded component, in start order, with its liveness checked now."""
    return [
        ComponentStatus(
            name=c.name,
            pid=c.record.pid,
            alive=c.is_alive(),
            ports=c.ports,
            log_path=c.spec.log_path,
        )
        for c in current.components
    ]


def _start_service(
    script: str,
    name: str,
    *,
    env: Mapping[str, str],
    launch: components.Launch,
    metrics_port: int | None,
) -> components.Component:
    port = probes.free_port() if metrics_port is None else metrics_port
    env = {"PYTHONUNBUFFERED": "1", **env, "AGENTRUN_METRICS_PORT": str(port)}
    spec = launch.spec(name, (str(script_path(script)),), env=env)
    probe = None if port == 0 else probes.Probe(url=f"http://127.0.0.1:{port}/metrics")
    ports = {} if port == 0 else {"metrics": port}
    return launch.start(spec, probe=probe, ports=ports)


def _start_all(directory: Path, *, options: UpOptions, log: console.Log) -> state.StackState:
    if options.chart:
        chart = release.project_chart(Path.cwd())
    else:
        crd_dir = default_crd_dir(options.crd_dir)
        scenarios = [_existing_file(p) for p in options.scenarios]
        for script in (OPERATOR_SCRIPT, WORKER_SCRIPT):
            script_path(script)
    current = state.StackState(directory=directory)
    state.save_state(current)
    launch = components.Launch(log_dir=current.log_dir, log=log)
    try:
        if options.with_node:
            binaries.ensure_node_binaries(log=log)  # every missing binary in one build
        cluster = controlplane.open_cluster(
            directory / "controlplane", launch=launch, node=options.with_node
        )
        current = _recorded(
            dataclasses.replace(
                current,
                kubeconfig=cluster.env["KUBECONFIG"],
                kubectl=cluster.kubectl,
                existing_cluster=isinstance(cluster, controlplane.ExistingCluster),
            ),
            *cluster.components,
        )
        if options.with_node:
            current = _start_node(current, cluster=cluster, wait=options.node_wait, launch=launch)
        if options.chart:
            current = _install_release(
                current, cluster=cluster, chart=chart, options=options, log=log
            )
            return _recorded(dataclasses.replace(current, complete=True))
        kubectl.apply_crds(kubectl.Kubectl.for_cluster(cluster), crd_dir, log=log)
        nats, urls, started = start_nats(directory, servers=options.nats_servers, launch=launch)
        current = _recorded(
            dataclasses.replace(current, nats_url=nats.url, nats_auth_dir=nats.auth_dir),
            *started,
        )
        mock = start_mockllm(scenarios, launch=launch)
        current = _recorded(dataclasses.replace(current, model_url=mockllm_url(mock)), mock)
        kubeconfig = cluster.env["KUBECONFIG"]
        env = service_env(
            kubeconfig=kubeconfig, nats=nats, replicas=options.nats_servers, urls=urls
        )
        current = _start_services(current, env=env, workers=options.workers, launch=launch)
        return _recorded(dataclasses.replace(current, complete=True))
    except BaseException:
        log("start failed: stopping what was started")
        _stop_all(current, log=log)
        _remove_state(directory)
        raise


def _start_node(
    current: state.StackState,
    *,
    cluster: controlplane.ControlPlane | controlplane.ExistingCluster,
    wait: float,
    launch: components.Launch,
) -> state.StackState:
    """Start the node in ``<directory>/node`` (waiting up to `wait` seconds for another node
    on this machine to stop) and record its components."""
    if not isinstance(cluster, controlplane.ControlPlane):
        raise controlplane.ClusterError(
            "a node joins only the local control plane: unset "
            f"{controlplane.USE_EXISTING_ENV} or drop --node"
        )
    node_dir = current.directory / "node"
    current = _recorded(dataclasses.replace(current, node_dir=node_dir))
    _, executables = binaries.ensure_node_binaries(log=launch.log)
    started = node.start_node(
        node_dir, cluster=cluster, executables=executables, launch=launch, claim_wait=wait
    )
    return _recorded(current, *started.components)


def _install_release(
    current: state.StackState,
    *,
    cluster: controlplane.Cluster,
    chart: Path,
    options: UpOptions,
    log: console.Log,
) -> state.StackState:
    """Import the project's images into the node and install `chart` with the demo values
    (the operator's default tenant is ``default``, as for the local services)."""
    assert current.node_dir is not None
    release.import_project_images(current.node_dir, project=chart.parents[1], log=log)
    current = _recorded(dataclasses.replace(current, release_namespace=release.RELEASE_NAMESPACE))
    release.install_chart(
        kubectl.Kubectl.for_cluster(cluster),
        chart=chart,
        values=release.demo_values(default_tenant="default", worker_replicas=options.workers),
        home=current.directory / "release",
        log=log,
    )
    return current


def _start_services(
    current: state.StackState,
    *,
    env: Mapping[str, str],
    workers: int,
    launch: components.Launch,
) -> state.StackState:
    """Start the operator and `workers` workers with `env`, recording each."""
    current = _recorded(current, start_operator(env, launch=launch))
    for index in range(1, workers + 1):
        current = _recorded(current, start_worker(index, env=env, launch=launch))
    return current


def _recorded(current: state.StackState, *started: components.Component) -> state.StackState:
    """`current` with `started` appended to its components, saved."""
    updated = dataclasses.replace(current, components=(*current.components, *started))
    state.save_state(updated)
    return updated


def _revive(current: state.StackState, *, options: UpOptions, log: console.Log) -> state.StackState:
    workers = sum(1 for c in current.components if c.name.startswith("worker-"))
    if workers != options.workers and current.release_namespace is None:
        log(f"note: the stack runs {workers} workers; `agentrun dev down` first to change that")
    dead = [c.name for c in current.components if not c.is_alive()]
    if not dead:
        log(f"already up (state in {current.directory}); `agentrun dev status` shows it")
        return current
    log(f"already up, but {', '.join(dead)} died: restarting")
    revived: list[components.Component] = []
    for component in current.components:
        if component.name in dead:
            component = restart_component(component, log=log)
        revived.append(component)
        state.save_state(
            dataclasses.replace(current, components=(*revived, *current.components[len(revived) :]))
        )
    return dataclasses.replace(current, components=tuple(revived))


def _stop_all(current: state.StackState, *, log: console.Log) -> None:
    """Stop every component in reverse order; the node's as one step, with its cleanup."""
    node_components = [c for c in current.components if c.name in node.COMPONENT_NAMES]
    node_stopped = current.node_dir is None
    for component in reversed(current.components):
        if component in node_components or (not node_stopped and _is_control(component)):
            if not node_stopped:
                node_stopped = True
                _stop_node(current, node_components, log=log)
            if component in node_components:
                continue
        outcome = stop_component(component)
        log(f"{component.name} (pid {component.record.pid}): {outcome.value}")


def _is_control(component: components.Component) -> bool:
    return component.name in ("kube-apiserver", "etcd")


def _stop_node(
    current: state.StackState, started: list[components.Component], *, log: console.Log
) -> None:
    assert current.node_dir is not None
    admin = None
    if current.kubectl is not None and current.kubeconfig is not None:
        admin = kubectl.Kubectl(current.kubectl, kubeconfig=current.kubeconfig)
    node.stop_node(current.node_dir, started, admin=admin, log=log)


def _remove_state(directory: Path) -> None:
    """Remove everything in `directory` except ``logs/`` and the lock file."""
    for child in directory.iterdir():
        if child.name in ("logs", ".lock"):
            continue
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()


def _existing_file(path: Path) -> Path:
    if not path.is_file():
        raise FileNotFoundError(
            f"scenario file {path} not found: run from the repo root or pass --scenarios FILE"
        )
    return path.resolve()
