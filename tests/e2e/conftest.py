"""The e2e stack: the real control plane and nats-server (session fixtures in tests/conftest.py),
the scripted model server, the operator and two workers, all started through
``agentrun_dev.stack`` — the same code ``agentrun dev up`` uses."""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from agentrun import kernel
from agentrun.operator.main import LOST_LEADERSHIP_EXIT
from agentrun_dev import components, demo, procs, stack
from agentrun_dev.kubectl import create_namespace, delete_namespace

SCENARIOS = Path(__file__).with_name("scenarios.yaml")
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
"""The examples users apply; ``scenarios.yaml`` scripts ``rectangle.yaml`` as the demo does."""
ACK_WAIT = 4.0
"""Seconds before an unacked TurnRequest is redelivered (short, for the SIGKILL tests)."""
HOLD_TTL = 5.0
"""Seconds a ledger hold outlives its worker's last refresh (short, for the SIGKILL tests)."""
LEDGER_SWEEP = 0.5
"""Seconds between the operator's ledger sweeps (expired holds, window resets, queues)."""
ORPHAN_AFTER = 2.0
"""Seconds before the operator looks whether a running run's TurnRequest was lost."""


@dataclasses.dataclass
class E2EStack:
    """Handles on the running services plus kubectl helpers written as a user would type them."""

    kubectl: Callable[..., Any]
    launch: components.Launch
    env: dict[str, str]
    mock: components.Component
    operator: components.Component
    workers: list[components.Component]
    attackers: set[str] = dataclasses.field(default_factory=set)
    """Public keys of NATS users a test minted to attack the bus: their refusals are the
    test's point, not a permission the operator or a worker lacked."""
    operator_restarts: list[str] = dataclasses.field(default_factory=list)
    """When `revive_operator` started the operator again after it gave its Lease up."""

    def revive_operator(self) -> None:
        """Start the operator again if it exited by itself for a lost Lease (`lost_lease`),
        as its Deployment's kubelet restarts the container; `wait_for` calls it at every
        poll. An operator a test stopped or killed is left to the test."""
        if not self.operator.is_alive() and lost_lease(self.operator):
            self.operator_restarts.append(f"operator lost its Lease at {time.strftime('%T')}")
            self.operator = stack.start_operator(self.env, launch=self.launch)

    @property
    def mock_url(self) -> str:
        return stack.mockllm_url(self.mock)

    def apply(self, namespace: str, manifest: dict[str, Any]) -> None:
        self.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(manifest))

    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        result = self.kubectl("get", "agentrun", name, "-n", namespace, "-o", "json", check=False)
        if result.returncode != 0:
            if "NotFound" in result.stderr:
                return None
            raise AssertionError(result.stderr)
        found: dict[str, Any] = json.loads(result.stdout)
        return found

    def wait_for(
        self,
        namespace: str,
        name: str,
        predicate: Callable[[dict[str, Any]], bool],
        *,
        timeout: float = 60,
    ) -> dict[str, Any]:
        """Poll ``kubectl get`` until ``predicate(status)``; returns the status."""
        end = time.monotonic() + timeout
        status: dict[str, Any] = {}
        while time.monotonic() < end:
            self.revive_operator()
            obj = self.get(namespace, name)
            status = (obj or {}).get("status") or {}
            if predicate(status):
                return status
            time.sleep(0.25)
        raise AssertionError(
            f"{namespace}/{name} did not get there in {timeout}s (operator restarts:"
            f" {self.operator_restarts or 'none'}); status: {json.dumps(status, indent=1)}"
        )

    def wait_tenant_observed(self, name: str, *, timeout: float = 60) -> None:
        """Wait until the operator has read AgentTenant ``name`` (it writes its status then).
        Raises AssertionError after ``timeout`` seconds."""
        end = time.monotonic() + timeout
        while "observedGeneration" not in json.loads(
            self.kubectl("get", "agenttenant", name, "-o", "json").stdout
        ).get("status", {}):
            assert time.monotonic() < end, f"the operator never saw the AgentTenant {name}"
            time.sleep(0.2)

    def wait_terminal(self, namespace: str, name: str, *, timeout: float = 60) -> dict[str, Any]:
        return self.wait_for(
            namespace, name, lambda s: bool(s.get("terminalReason")), timeout=timeout
        )

    def mock_requests(self) -> list[dict[str, Any]]:
        base = self.mock_url.removesuffix("/v1")
        data: Any = json.loads(http_get(f"{base}/_mock/requests"))
        return list(data["requests"] if isinstance(data, dict) else data)

    def answered_calls(self, goal: str) -> collections.Counter[str]:
        """``namespace/name`` → model calls the scripted model answered (status 200) for the
        runs whose goal is ``goal`` followed by their ``namespace/name``."""
        return collections.Counter(
            {
                run: sum(1 for r in requests if r.get("status") == 200)
                for run, requests in self.requests_by_run(goal).items()
            }
        )

    def requests_by_run(self, goal: str) -> dict[str, list[dict[str, Any]]]:
        """``namespace/name`` → every model request the scripted model received (answered
        or not: a killed or cut worker's) for the runs whose goal is ``goal`` followed by
        their ``namespace/name`` (after any other words: ``SOAK-`` then ``<n> ns/name``),
        in arrival order."""
        runs: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
        for request in self.mock_requests():
            text = json.dumps(request.get("body"))
            if goal in text:
                after = text.split(goal, 1)[1].split('"')[0].split("\\")[0]
                runs[after.rsplit(" ", 1)[-1]].append(request)
        return runs

    def abandoned_allowance(
        self,
        goal: str,
        committed: Callable[[str], int],
        *,
        call_tokens: int,
        kills: Sequence[float] = (),
    ) -> collections.Counter[str]:
        """``namespace`` → the most its tenant's book may charge as abandoned for the runs
        whose goal is ``goal`` followed by their ``namespace/name`` (``abandoned_allowance``
        of each run; ``committed``: ``namespace/name`` → its committed model calls; ``kills``:
        when, in epoch seconds, a fault may have left a hold whose request never reached the
        model: ``unsent_allowance``)."""
        allowed: collections.Counter[str] = collections.Counter()
        for run, requests in self.requests_by_run(goal).items():
            namespace = run.split("/", 1)[0]
            allowed[namespace] += abandoned_allowance(
                requests, committed(run), call_tokens=call_tokens
            ) + unsent_allowance(requests, kills)
        return allowed

    def restart_dead(self) -> None:
        """Bring back any service a test killed, so the next test finds the full stack (its
        workers consuming: see `wait_consuming`)."""
        if not self.operator.is_alive():
            self.operator = stack.start_operator(self.env, launch=self.launch)
        self.workers = [
            w if w.is_alive() else stack.start_worker(i + 1, env=self.env, launch=self.launch)
            for i, w in enumerate(self.workers)
        ]
        for worker in self.workers:
            wait_consuming(worker)


def prompt_bound_of(request: dict[str, Any]) -> int:
    """The prompt bound a worker reserved for the call ``request`` (a scripted model's record)
    is (``kernel.prompt_token_bound`` of the messages and tools it sent; the scripted model
    reports far fewer prompt tokens, so no hidden ones are learnt)."""
    body = request.get("body") or {}
    return kernel.prompt_token_bound(body.get("messages") or [], body.get("tools") or [])


def abandoned_allowance(requests: list[dict[str, Any]], committed: int, *, call_tokens: int) -> int:
    """The most a tenant's book may charge as abandoned for one run's model requests (the
    scripted model's records of them, each answered call using ``call_tokens``) when its
    first ``committed`` turns committed: every request but one answered request of each
    committed turn (the one its usage holds) may be charged — answered, its usage or, charged
    before its usage was known (its hold dropped unrecorded, its call cut), its prompt's bound,
    whichever is more; received and not answered (its worker killed, or its call cut), its
    prompt's bound."""
    caps: dict[int, list[int]] = collections.defaultdict(list)
    total = 0
    for request in requests:
        answered = request.get("status") == 200
        cap = max(prompt_bound_of(request), call_tokens if answered else 0)
        total += cap
        turn = request.get("turn")
        if answered and isinstance(turn, int) and turn < committed:
            caps[turn].append(cap)
    return total - sum(min(of_turn) for of_turn in caps.values())


UNSENT_NEAR = 60.0
"""Seconds before a run's first request and after its last within which a fault counts as
possibly holding one of its turns (``unsent_allowance``): a held turn's redelivery is asked
an ack wait (at most 30 s here) and a worker's pull after the fault."""


def unsent_allowance(requests: list[dict[str, Any]], kills: Sequence[float]) -> int:
    """What a run's book may also charge as abandoned for holds whose request the scripted
    model never received: a worker killed (or NATS down past the ledger's retries) after its
    reservation and before its request went out leaves a hold charged its prompt's bound. A
    run has one turn in flight, so each fault within ``UNSENT_NEAR`` of its requests' span
    (``request["time"]``, epoch seconds) may leave one, charged at most the prompt bound of
    its largest request (a held turn asks what its redelivery asks)."""
    if not requests or not kills:
        return 0
    times = [float(r["time"]) for r in requests]
    near = sum(1 for k in kills if min(times) - UNSENT_NEAR <= k <= max(times) + UNSENT_NEAR)
    return near * max(prompt_bound_of(r) for r in requests)


def lost_lease(operator: components.Component) -> bool:
    """Whether the exited ``operator`` process gave its Lease up by itself: exit status
    ``LOST_LEADERSHIP_EXIT`` after "no renewal of the Lease" (the API server unreachable or
    slow for the renew deadline, e.g. restarted on a busy machine), not killed or crashed."""
    code = procs.exit_code(operator.record)
    tail = procs.read_log_tail(operator.record.log_path)
    return code == LOST_LEADERSHIP_EXIT and "no renewal of the Lease" in tail


def wait_consuming(worker: components.Component, *, timeout: float = 30) -> None:
    """Wait until ``worker`` pulls turns. A started worker answers on its metrics port before
    it has connected to NATS and bound its consumer; it sets ``agentrun_worker_concurrency``
    just as it starts consuming. Raises AssertionError after ``timeout`` seconds."""
    url = f"http://127.0.0.1:{worker.ports['metrics']}/metrics"
    end = time.monotonic() + timeout
    while True:
        lines = http_get(url).splitlines()
        if any(
            line.startswith("agentrun_worker_concurrency ") and float(line.split()[1]) > 0
            for line in lines
        ):
            return
        assert time.monotonic() < end, f"{worker.name} is not consuming after {timeout}s"
        time.sleep(0.1)


def http_get(url: str) -> str:
    """GET ``url`` and return the body as text."""
    with urllib.request.urlopen(url, timeout=10) as response:
        body: bytes = response.read()
    return body.decode()


def run_manifest(name: str, goal: str, **spec: Any) -> dict[str, Any]:
    """An AgentRun manifest for the ``mock`` model."""
    body: dict[str, Any] = {"model": "mock", "goal": goal, "tools": ["calculate", "sleep"]}
    body.update(spec)
    return {
        "apiVersion": "agentrun.dev/v1alpha1",
        "kind": "AgentRun",
        "metadata": {"name": name},
        "spec": body,
    }


def named_runs(goal: str, namespace: str, names: list[str], **spec: Any) -> list[dict[str, Any]]:
    """Run manifests whose goals are ``goal`` then ``namespace/name``, so the scripted
    model's shared request log tells their calls apart (``E2EStack.answered_calls``)."""
    return [run_manifest(name, f"{goal}{namespace}/{name}", **spec) for name in names]


def apply_all(stack_: E2EStack, namespace: str, manifests: list[dict[str, Any]]) -> None:
    """``kubectl apply`` the manifests in one call."""
    body = {"apiVersion": "v1", "kind": "List", "items": manifests}
    stack_.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(body), timeout=300)


def mock_model(base_url: str, **options: Any) -> dict[str, Any]:
    """The scripted model's AgentModel as the e2e stack applies it: 1000 output tokens a call
    within a 32000-token context, unless ``options`` (``demo.mock_model``'s) say otherwise."""
    return demo.mock_model(
        base_url, **{"max_output_tokens": 1000, "context_window": 32000, **options}
    )


@pytest.fixture(scope="package")
def e2e(
    control_plane: Any,
    crds: Any,
    nats_server: Any,
    kubectl: Callable[..., Any],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[E2EStack]:
    """The operator, two workers and the scripted model on the session's API server and NATS,
    for the tests of this package only: stopped after its last test, so that a later test
    driving a controller by hand on the same API server (or consuming from the same NATS) does
    not race a live operator reconciling the same objects."""
    launch = components.Launch(log_dir=tmp_path_factory.mktemp("e2e-logs"), die_with_parent=True)
    mock = stack.start_mockllm([SCENARIOS], launch=launch)
    env = stack.service_env(kubeconfig=str(control_plane.kubeconfig), nats=nats_server)
    env.update(
        AGENTRUN_TURN_ACK_WAIT=str(ACK_WAIT),
        AGENTRUN_STATUS_INTERVAL="0.5",
        AGENTRUN_HOLD_TTL=str(HOLD_TTL),
        AGENTRUN_LEDGER_SWEEP=str(LEDGER_SWEEP),
        AGENTRUN_ORPHAN_AFTER=str(ORPHAN_AFTER),
        OTEL_TRACES_EXPORTER="console",  # one JSON line per span in each process's log
    )
    operator = stack.start_operator(env, launch=launch)
    workers = [stack.start_worker(i, env=env, launch=launch) for i in (1, 2)]
    for worker in workers:
        wait_consuming(worker)
    model = mock_model(stack.mockllm_url(mock))
    kubectl("apply", "-f", "-", input=yaml.safe_dump(model))
    kubectl("apply", "-f", "-", input=yaml.safe_dump(demo.default_tenant()))
    handle = E2EStack(kubectl, launch, env, mock, operator, workers)
    yield handle
    for component in [*handle.workers, handle.operator, handle.mock]:
        components.stop_component(component)
    violations = [
        line
        for line in permission_violations(nats_server)
        if not any(attacker in line for attacker in handle.attackers)
    ]
    assert not violations, (
        "the operator or a worker did something its NATS permissions do not allow "
        f"(agentrun.natsauth.permissions): {violations[:5]}"
    )


def permission_violations(server: Any) -> list[str]:
    """The permission violations the shared server logged (its own lines: other servers of
    the session log to the same file, some refusing on purpose)."""
    prefixes = tuple(f"[{pid}] " for pid in server.pids())
    log = server.component.spec.log_path.read_text(errors="replace")
    return [line for line in log.splitlines() if line.startswith(prefixes) and "Violation" in line]


@pytest.fixture
def stack_(e2e: E2EStack) -> Iterator[E2EStack]:
    """The e2e stack, made whole again after a test that kills parts of it."""
    yield e2e
    e2e.restart_dead()


def restart_operator(stack_: E2EStack, **env: str | None) -> None:
    """Stop the operator and start it again with ``env`` changed (``None``: unset)."""
    components.stop_component(stack_.operator)
    for key, value in env.items():
        if value is None:
            stack_.env.pop(key, None)
        else:
            stack_.env[key] = value
    stack_.operator = stack.start_operator(stack_.env, launch=stack_.launch)


class Restarts:
    """Components started again by tests; stopped at session end, before the control plane."""

    def __init__(self, launch: components.Launch) -> None:
        self.launch = launch
        self.started: list[components.Component] = []

    def kill_and_restart(self, component: components.Component, *, down: float) -> None:
        components.kill_component(component)
        time.sleep(down)
        self.started.append(
            self.launch.start(component.spec, probe=component.probe, ports=component.ports)
        )


@pytest.fixture(scope="session")
def restarts(control_plane: Any, devenv_launch: components.Launch) -> Iterator[Restarts]:
    made = Restarts(devenv_launch)
    yield made
    for component in made.started:
        components.stop_component(component)


def apiserver(control_plane: Any, restarts: Restarts) -> components.Component:
    """The running kube-apiserver (the last restarted one, or the control plane's own)."""
    found = [
        c for c in (*control_plane.components, *restarts.started) if c.name == "kube-apiserver"
    ]
    return found[-1]


def apply_tenant(stack_: E2EStack, name: str, namespace: str, **spec: Any) -> None:
    """``kubectl apply`` the AgentTenant ``name`` binding ``namespace``, with ``spec``."""
    tenant = {
        "apiVersion": "agentrun.dev/v1alpha1",
        "kind": "AgentTenant",
        "metadata": {"name": name},
        "spec": {"namespaces": [namespace], **spec},
    }
    stack_.kubectl("apply", "-f", "-", input=yaml.safe_dump(tenant))


@contextlib.contextmanager
def tenants_of(
    stack_: E2EStack, specs: dict[str, dict[str, Any]]
) -> Iterator[dict[str, tuple[str, str]]]:
    """One AgentTenant per role of ``specs`` (role → its spec, without ``namespaces``), each
    binding a namespace of its own, read by the operator before this yields role → (AgentTenant
    name, its namespace); afterwards their runs, the tenants and the namespaces are deleted."""
    made: dict[str, tuple[str, str]] = {}
    for role, spec in specs.items():
        namespace = create_namespace(stack_.kubectl)
        name = f"{role}-{namespace}"
        apply_tenant(stack_, name, namespace, **spec)
        made[role] = (name, namespace)
    for name, _ in made.values():  # the operator has read the tenants before their first run
        stack_.wait_tenant_observed(name, timeout=30)
    try:
        yield made
    finally:
        for name, namespace in made.values():
            stack_.kubectl("delete", "agentruns", "--all", "-n", namespace, "--wait=false")
            stack_.kubectl("delete", "agenttenant", name, "--ignore-not-found", "--wait=false")
            delete_namespace(stack_.kubectl, namespace)
