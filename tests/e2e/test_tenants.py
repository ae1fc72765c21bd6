"""AgentTenants govern the runs of their namespaces: a FIFO queue behind maxConcurrentRuns,
window budgets that queue or fail new runs and stop runs mid-way, per-run caps and allowed
models and tools, and nothing in an AgentRun can lift them. Driven with kubectl, as a user
(and a platform admin) would."""

from __future__ import annotations

import calendar
import contextlib
import copy
import json
import re
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any, Protocol

import pytest
import yaml
from clock_support import pause_before_day_ends

from agentrun_dev import components
from agentrun_dev.kubectl import Kubectl, create_namespace, delete_namespace
from agentrun_dev.natsserver import NatsServer

from .conftest import E2EStack, run_manifest
from .events import read_events, turn_numbers

pytestmark = pytest.mark.e2e

MOCK_PRICE_INPUT = Decimal("2.50") / 1_000_000
MOCK_PRICE_OUTPUT = Decimal("10") / 1_000_000
SPEND_TOKENS = 500
"""Tokens per turn of the E2E-TENANT-SPEND scenario (100 in, 400 out)."""
SPEND_COST = 100 * MOCK_PRICE_INPUT + 400 * MOCK_PRICE_OUTPUT
"""Its cost per turn at the ``mock`` AgentModel's prices ($0.00425)."""
TENANT_CRD = Path(__file__).parents[2] / "crds" / "agentrun.dev_agenttenants.yaml"
DEFAULT_ABOVE_CAP = {"max": {"maxSteps": 5}, "default": {"maxSteps": 10}}
"""A ``runBudget`` the API server rejects now but stored before it checked defaults."""


class TenantFactory(Protocol):
    def __call__(self, name: str, namespaces: list[str], **spec: Any) -> str: ...


# --- helpers ------------------------------------------------------------------------------------


def epoch(timestamp: str) -> float:
    """RFC 3339 UTC with second precision (as the operator writes it) → epoch seconds."""
    return float(calendar.timegm(time.strptime(timestamp, "%Y-%m-%dT%H:%M:%SZ")))


def conditions(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in status.get("conditions") or []}


def get_tenant(stack_: E2EStack, name: str) -> dict[str, Any]:
    found: dict[str, Any] = json.loads(
        stack_.kubectl("get", "agenttenant", name, "-o", "json").stdout
    )
    return found


def tenant_accepted(stack_: E2EStack, run_budget: dict[str, Any]) -> bool:
    """Whether the API server accepts (server-side dry run) a tenant with ``run_budget``."""
    probe = {
        "apiVersion": "agentrun.dev/v1alpha1",
        "kind": "AgentTenant",
        "metadata": {"name": "schema-probe"},
        "spec": {"namespaces": ["schema-probe"], "runBudget": run_budget},
    }
    result = stack_.kubectl(
        "create", "--dry-run=server", "-f", "-", input=yaml.safe_dump(probe), check=False
    )
    return bool(result.returncode == 0)


def set_tenant_crd(stack_: E2EStack, crd: dict[str, Any], *, accepts: bool) -> None:
    """Apply ``crd`` and wait (30 s at most) until the API server validates with it, seen as
    whether it ``accepts`` a default above its cap."""
    stack_.kubectl(
        "apply", "--server-side", "--force-conflicts", "-f", "-", input=yaml.safe_dump(crd)
    )
    end = time.monotonic() + 30
    while tenant_accepted(stack_, DEFAULT_ABOVE_CAP) != accepts:
        assert time.monotonic() < end, "the API server did not take up the AgentTenant CRD"
        time.sleep(0.25)


@contextlib.contextmanager
def tenant_crd_before_default_checks(stack_: E2EStack) -> Iterator[None]:
    """The AgentTenant CRD as it was before the API server checked that each runBudget
    default is within its cap: a tenant stored then survives an upgrade, and the operator
    must still refuse it. The current CRD is back on exit."""
    current = yaml.safe_load(TENANT_CRD.read_text())
    earlier = copy.deepcopy(current)
    for version in earlier["spec"]["versions"]:
        spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
        del spec["properties"]["runBudget"]["x-kubernetes-validations"]
    set_tenant_crd(stack_, earlier, accepts=True)
    try:
        yield
    finally:
        set_tenant_crd(stack_, current, accepts=False)


def wait_tenant(
    stack_: E2EStack,
    name: str,
    predicate: Callable[[dict[str, Any]], bool],
    *,
    timeout: float = 15,
) -> dict[str, Any]:
    """Poll the AgentTenant until ``predicate(status)``; returns the status."""
    end = time.monotonic() + timeout
    status: dict[str, Any] = {}
    while time.monotonic() < end:
        status = get_tenant(stack_, name).get("status") or {}
        if predicate(status):
            return status
        time.sleep(0.25)
    raise AssertionError(
        f"AgentTenant {name} did not get there in {timeout}s (an empty status: the operator "
        f"has not taken it up); status: {json.dumps(status, indent=1)}"
    )


@contextlib.contextmanager
def day_tenant(stack_: E2EStack, name: str, namespace: str, *, outlive: float) -> Iterator[str]:
    """An AgentTenant ``name`` binding ``namespace`` alone: 24h windows, 100 000 tokens, read by
    the operator before the block starts and deleted after it. Starts the block in a day
    window that still has at least ``outlive`` seconds (waits for the next one otherwise), so
    the usage read in the block is the block's runs' alone."""
    manifest = {
        "apiVersion": "agentrun.dev/v1alpha1",
        "kind": "AgentTenant",
        "metadata": {"name": name},
        "spec": {"namespaces": [namespace], "window": "24h", "budget": {"tokens": 100_000}},
    }
    stack_.kubectl("apply", "-f", "-", input=yaml.safe_dump(manifest))
    wait_tenant(stack_, name, lambda s: s.get("observedGeneration") == 1)
    time.sleep(pause_before_day_ends(time.time(), outlive))
    try:
        yield name
    finally:
        stack_.kubectl("delete", "agenttenant", name, "--ignore-not-found", "--wait=false")


def list_runs(stack_: E2EStack, namespace: str) -> dict[str, dict[str, Any]]:
    """Every AgentRun of the namespace: name → status."""
    out = json.loads(stack_.kubectl("get", "agentruns", "-n", namespace, "-o", "json").stdout)
    return {item["metadata"]["name"]: item.get("status") or {} for item in out["items"]}


def wait_runs(
    stack_: E2EStack,
    namespace: str,
    predicate: Callable[[dict[str, dict[str, Any]]], bool],
    *,
    timeout: float = 20,
) -> dict[str, dict[str, Any]]:
    """Poll the namespace's runs until ``predicate(name → status)``; returns them."""
    end = time.monotonic() + timeout
    runs: dict[str, dict[str, Any]] = {}
    while time.monotonic() < end:
        runs = list_runs(stack_, namespace)
        if predicate(runs):
            return runs
        time.sleep(0.2)
    shown = {
        n: {k: s.get(k) for k in ("phase", "queuePosition", "message")} for n, s in runs.items()
    }
    raise AssertionError(f"runs in {namespace} did not get there in {timeout}s: {shown}")


def queue_of(runs: dict[str, dict[str, Any]]) -> list[str]:
    """Names of the Queued runs, by their queuePosition."""
    queued = [
        (s.get("queuePosition") or 0, n) for n, s in runs.items() if s.get("phase") == "Queued"
    ]
    return [n for _, n in sorted(queued)]


def positions(runs: dict[str, dict[str, Any]], names: list[str]) -> list[Any]:
    return [(runs.get(n) or {}).get("queuePosition") for n in names]


def model_calls(stack_: E2EStack, goal: str) -> list[dict[str, Any]]:
    """The model requests of the conversation whose goal is ``goal``."""
    return [r for r in stack_.mock_requests() if goal in json.dumps(r["body"])]


def append_scenario(stack_: E2EStack, scenario: dict[str, Any]) -> None:
    """Add a scenario to the running mock model (matched after the file's scenarios)."""
    base = stack_.mock_url.removesuffix("/v1")
    request = urllib.request.Request(
        f"{base}/_mock/scenarios?mode=append",
        data=json.dumps({"scenarios": [scenario]}).encode(),
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 200


def wait_early_in_window(stack_: E2EStack, tenant: str, *, window: float, margin: float) -> None:
    """Sleep into the next fixed window unless at least ``margin`` s of this one are left."""
    reset = epoch(wait_tenant(stack_, tenant, lambda s: "resetTime" in s)["resetTime"])
    left = reset - time.time()
    assert left <= window + 1, f"resetTime is {left:.1f}s away, more than the {window}s window"
    if left < margin:
        time.sleep(max(0.0, left) + 0.5)


def admission_times(nats_url: NatsServer, namespace: str, names: list[str]) -> dict[str, float]:
    """When each run's ``admitted`` event was written (checking there is exactly one)."""
    found: dict[str, float] = {}
    for name in names:
        admitted = [e for e in read_events(nats_url, namespace, name) if e.kind == "admitted"]
        assert len(admitted) == 1, f"{name} has {len(admitted)} admitted events"
        found[name] = admitted[0].time
    return found


def max_overlap(nats_url: NatsServer, namespace: str, names: list[str]) -> int:
    """Most runs that were admitted and not ended at one instant, from their events."""
    edges: list[tuple[float, int]] = []
    for name in names:
        events = read_events(nats_url, namespace, name)
        admitted = next(e.time for e in events if e.kind == "admitted")
        edges += [(admitted, 1), (events[-1].time, -1)]
    active = peak = 0
    for _, step in sorted(edges):  # at a tie the end (-1) sorts before the start
        active += step
        peak = max(peak, active)
    return peak


class Sampler:
    """Polls AgentTenant statuses (and a namespace's runs) in a thread while a test runs."""

    def __init__(self, stack_: E2EStack, tenants: list[str], namespace: str | None = None):
        self.stack = stack_
        self.tenants = tenants
        self.namespace = namespace
        self.tenant_samples: list[dict[str, dict[str, Any]]] = []
        self.run_samples: list[dict[str, dict[str, Any]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(Exception):
                if self.tenants:
                    out = self.stack.kubectl(
                        "get", "agenttenant", *self.tenants, "-o", "json", check=False
                    )
                    if out.returncode == 0:
                        found = json.loads(out.stdout)
                        items = found.get("items", [found])  # one name: the object itself
                        self.tenant_samples.append(
                            {i["metadata"]["name"]: i.get("status") or {} for i in items}
                        )
                if self.namespace:
                    self.run_samples.append(list_runs(self.stack, self.namespace))
            self._stop.wait(0.15)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def tenant_values(self, tenant: str, *path: str) -> list[Any]:
        """One field of the tenant's status over time (missing samples left out)."""
        values = []
        for sample in self.tenant_samples:
            value: Any = sample.get(tenant)
            for key in path:
                value = value.get(key) if isinstance(value, dict) else None
            if value is not None:
                values.append(value)
        return values


def assert_never_over_limit(sampler: Sampler, tenant: str, resource: str) -> None:
    """used + reserved stayed within the tenant's limit in every sample."""
    number = int if resource == "tokens" else Decimal
    seen = [b for b in sampler.tenant_values(tenant, "budget", resource) if "limit" in b]
    assert seen, f"no {resource} samples of {tenant}"
    for budget in seen:
        used, reserved, limit = (number(budget[k]) for k in ("used", "reserved", "limit"))
        assert used + reserved <= limit, f"{tenant} {resource}: {budget}"


# --- fixtures -----------------------------------------------------------------------------------


@pytest.fixture
def tenants(stack_: E2EStack) -> Iterator[TenantFactory]:
    """``tenants(name, namespaces, **spec)`` applies an AgentTenant binding ``namespaces`` and
    waits until the operator shows it has read it; every one is deleted afterwards."""
    made: list[str] = []

    def make(name: str, namespaces: list[str], **spec: Any) -> str:
        manifest = {
            "apiVersion": "agentrun.dev/v1alpha1",
            "kind": "AgentTenant",
            "metadata": {"name": name},
            "spec": {"namespaces": namespaces, **spec},
        }
        stack_.kubectl("apply", "-f", "-", input=yaml.safe_dump(manifest))
        made.append(name)
        generation = get_tenant(stack_, name)["metadata"]["generation"]
        wait_tenant(stack_, name, lambda s: s.get("observedGeneration") == generation)
        return name

    yield make
    for name in made:
        stack_.kubectl("delete", "agenttenant", name, "--ignore-not-found", "--wait=false")


@pytest.fixture
def more_namespaces(kubectl: Kubectl) -> Iterator[Callable[[], str]]:
    """``more_namespaces()`` creates one more fresh namespace (deletion requested afterwards)."""
    made: list[str] = []

    def make() -> str:
        made.append(create_namespace(kubectl))
        return made[-1]

    yield make
    for name in made:
        delete_namespace(kubectl, name)


# --- tests --------------------------------------------------------------------------------------


def test_runs_over_max_concurrent_runs_wait_queued_and_are_admitted_in_fifo_order(
    stack_: E2EStack, test_namespace: str, tenants: TenantFactory, nats_server: Any
) -> None:
    tenant = tenants(f"t-{test_namespace}", [test_namespace], maxConcurrentRuns=2)
    names = [f"q-{i}" for i in range(5)]
    with Sampler(stack_, [tenant], test_namespace) as sampler:
        for name in names:  # one kubectl apply each: creation order is apply order
            stack_.apply(
                test_namespace, run_manifest(name, f"E2E-TENANT-SLOW {name} {test_namespace}")
            )
        runs = wait_runs(
            stack_,
            test_namespace,
            lambda r: (
                positions(r, names[2:]) == [1, 2, 3]
                and all(r[n].get("phase") == "Queued" for n in names[2:])
            ),
        )
        assert [runs[n].get("phase") for n in names[:2]] == ["Running", "Running"]
        for name in names[2:]:
            assert runs[name]["tenant"] == tenant
            admitted = conditions(runs[name])["Admitted"]
            assert (admitted["status"], admitted["reason"]) == ("False", "ConcurrencyLimit")
            assert "startTime" not in runs[name]
        final = {n: stack_.wait_terminal(test_namespace, n, timeout=60) for n in names}
        used = sum(s["usage"]["totalTokens"] for s in final.values())
        cost = sum(Decimal(s["usage"]["costUSD"]) for s in final.values())
        status = wait_tenant(
            stack_,
            tenant,
            lambda s: (
                s.get("activeRuns") == 0
                and s.get("queuedRuns") == 0
                and s["budget"]["tokens"]["used"] == used
            ),
        )
    for name, run in final.items():
        assert (run["phase"], run["terminalReason"]) == ("Succeeded", "completed"), name
        assert run["tenant"] == tenant
        assert "queuePosition" not in run
    running = [
        sum(s.get("phase") == "Running" for s in sample.values()) for sample in sampler.run_samples
    ]
    assert max(running) == 2, f"Running runs seen at once: {running}"
    assert max(sampler.tenant_values(tenant, "activeRuns")) == 2
    assert max(sampler.tenant_values(tenant, "queuedRuns")) == 3
    assert max_overlap(nats_server, test_namespace, names) == 2
    admitted_at = admission_times(nats_server, test_namespace, names)
    assert sorted(names, key=admitted_at.__getitem__) == names, admitted_at
    starts = [epoch(final[n]["startTime"]) for n in names]
    assert starts == sorted(starts)
    assert used == 5 * 260
    assert Decimal(status["budget"]["costUSD"]["used"]) == cost
    assert "limit" not in status["budget"]["tokens"]  # no token budget: unlimited
    out = stack_.kubectl("get", "agenttenant", tenant).stdout.splitlines()
    assert out[0].split() == ["NAME", "ACTIVE", "QUEUED", "TOKENS", "COST", "RESET", "AGE"]
    row = out[1].split()
    assert row[:4] == [tenant, "0", "0", str(used)]
    assert Decimal(row[4]) == cost
    assert row[5] == status["resetTime"]


def test_a_used_up_window_budget_queues_or_fails_new_runs_until_the_window_resets(
    stack_: E2EStack,
    test_namespace: str,
    more_namespaces: Callable[[], str],
    tenants: TenantFactory,
) -> None:
    # everything up to the queued run's check happens inside one window: two runs, a dozen
    # kubectl calls, a few seconds usually and several more on a busy machine, so at least
    # 20 s of a 30 s window are left at the start
    window = 30.0
    spec = {
        "window": "30s",
        "budget": {"tokens": 1000},
        "runBudget": {"default": {"maxTokens": 1000}},  # one call's reservation: all 1000
    }
    queue_ns, fail_ns = test_namespace, more_namespaces()
    queuing = tenants(f"t-{queue_ns}", [queue_ns], whenExhausted="Queue", **spec)
    failing = tenants(f"t-{fail_ns}", [fail_ns], whenExhausted="Fail", **spec)
    wait_early_in_window(stack_, queuing, window=window, margin=20)
    with Sampler(stack_, [queuing, failing]) as sampler:
        for ns in (queue_ns, fail_ns):
            stack_.apply(ns, run_manifest("first", f"E2E-TENANT-EXACT first {ns}"))
        for ns in (queue_ns, fail_ns):
            first = stack_.wait_terminal(ns, "first", timeout=20)
            assert (first["terminalReason"], first["usage"]["totalTokens"]) == ("completed", 1000)
        used_up = {}
        for tenant in (queuing, failing):
            used_up[tenant] = wait_tenant(
                stack_,
                tenant,
                lambda s: s["budget"]["tokens"]["used"] == 1000 and s.get("activeRuns") == 0,
            )
            assert used_up[tenant]["budget"]["tokens"] == {
                "used": 1000,
                "reserved": 0,
                "abandoned": 0,
                "limit": 1000,
                "remaining": 0,
            }
            exhausted = conditions(used_up[tenant])["BudgetExhausted"]
            assert exhausted["reason"] == "TokensExhausted"
        window_start = used_up[queuing]["windowStart"]
        reset = epoch(used_up[queuing]["resetTime"])
        assert reset - epoch(window_start) == window

        fail_goal = f"E2E-TENANT-SMALL second {fail_ns}"
        queue_goal = f"E2E-TENANT-SMALL second {queue_ns}"
        stack_.apply(fail_ns, run_manifest("second", fail_goal))
        stack_.apply(queue_ns, run_manifest("second", queue_goal))
        failed = stack_.wait_terminal(fail_ns, "second", timeout=10)
        assert time.time() < reset, "the window ended before the test could check it"
        assert (failed["phase"], failed["terminalReason"], failed["outcome"]) == (
            "Failed",
            "tenant_budget_exhausted",
            "none",  # never admitted: nothing was done
        )
        assert failing in failed["message"] and "tokens" in failed["message"]
        assert failed["tenant"] == failing
        assert model_calls(stack_, fail_goal) == []

        queued = stack_.wait_for(queue_ns, "second", lambda s: s.get("phase") == "Queued")
        assert time.time() < reset, "the window ended before the test could check it"
        admitted = conditions(queued)["Admitted"]
        assert (admitted["status"], admitted["reason"]) == ("False", "BudgetExhausted")
        assert (queued["queuePosition"], queued["tenant"]) == (1, queuing)
        assert "tokens" in queued["message"]
        assert model_calls(stack_, queue_goal) == []

        done = stack_.wait_terminal(queue_ns, "second", timeout=window + 15)
        assert (done["phase"], done["terminalReason"]) == ("Succeeded", "completed")
        assert epoch(done["startTime"]) >= reset, "admitted before the window reset"
        after = wait_tenant(
            stack_,
            queuing,
            lambda s: s["windowStart"] != window_start and s["budget"]["tokens"]["used"] == 600,
        )
        assert epoch(after["windowStart"]) >= reset
        assert conditions(after)["BudgetExhausted"]["status"] == "False"
        assert after["queuedRuns"] == 0
    for tenant in (queuing, failing):
        assert_never_over_limit(sampler, tenant, "tokens")


RESOURCES: list[Any] = [
    pytest.param("tokens", {"tokens": 3000}, "TokensExhausted", id="tokens"),
    pytest.param("costUSD", {"costUSD": "0.03"}, "CostUSDExhausted", id="costUSD"),
]


@pytest.mark.parametrize(("resource", "budget", "reason"), RESOURCES)
def test_a_tenant_budget_stops_a_run_mid_way_and_then_fails_new_runs(
    stack_: E2EStack,
    test_namespace: str,
    tenants: TenantFactory,
    resource: str,
    budget: dict[str, Any],
    reason: str,
) -> None:
    tenant = tenants(
        f"t-{test_namespace}", [test_namespace], window="1h", whenExhausted="Fail", budget=budget
    )
    wait_early_in_window(stack_, tenant, window=3600, margin=60)
    with Sampler(stack_, [tenant]) as sampler:
        stack_.apply(
            test_namespace,
            run_manifest("spender", f"E2E-TENANT-SPEND {test_namespace}", budget={"maxSteps": 50}),
        )
        spent = stack_.wait_terminal(test_namespace, "spender", timeout=30)
        assert (spent["phase"], spent["terminalReason"], spent["outcome"]) == (
            "Failed",
            "tenant_budget_exhausted",
            "partial",
        )
        assert resource in spent["message"] and tenant in spent["message"], spent["message"]
        steps = spent["usage"]["steps"]
        assert steps >= 2  # admitted and stopped mid-way by the reservation, not at admission
        assert spent["usage"]["totalTokens"] == steps * SPEND_TOKENS
        assert Decimal(spent["usage"]["costUSD"]) == steps * SPEND_COST
        charged = Decimal(str(spent["usage"]["totalTokens" if resource == "tokens" else "costUSD"]))
        status = wait_tenant(
            stack_,
            tenant,
            lambda s: (
                s.get("activeRuns") == 0 and Decimal(str(s["budget"][resource]["used"])) == charged
            ),
        )
        left = status["budget"][resource]
        assert Decimal(str(left["reserved"])) == 0
        assert conditions(status)["BudgetExhausted"]["status"] == "False"  # some left, too little
        # the call refused really did not fit: what is left once every turn is settled is less
        # than the call's reservation, named in the message ("... + N for this call exceeds L")
        needed = re.search(r"\+ ([0-9.]+) for this call", spent["message"])
        assert needed is not None, spent["message"]
        assert Decimal(str(left["remaining"])) < Decimal(needed.group(1)), (
            f"stopped with {left['remaining']} {resource} left for a call of {needed.group(1)}: "
            f"{spent['message']}"
        )
        if resource == "tokens":
            remaining = int(left["remaining"])
            assert remaining > 0
            usage = {"prompt_tokens": remaining - 100, "completion_tokens": 100}
            run_budget: dict[str, Any] = {"maxTokens": remaining}
        else:
            remaining_usd = Decimal(left["remaining"])
            assert remaining_usd > 0
            prompt = (remaining_usd - 100 * MOCK_PRICE_OUTPUT) / MOCK_PRICE_INPUT
            assert prompt == int(prompt) > 0
            usage = {"prompt_tokens": int(prompt), "completion_tokens": 100}
            run_budget = {"maxCostUSD": format(remaining_usd.normalize(), "f")}
        # a run whose own budget is exactly what is left, and which uses all of it
        fill_goal = f"E2E-TENANT-FILL {test_namespace}"
        append_scenario(
            stack_,
            {
                "name": f"fill-{test_namespace}",
                "match": {"goal": fill_goal},
                "turns": [{"content": "Used what was left.", "usage": usage}],
            },
        )
        stack_.apply(test_namespace, run_manifest("filler", fill_goal, budget=run_budget))
        filled = stack_.wait_terminal(test_namespace, "filler", timeout=20)
        assert filled["terminalReason"] == "completed", filled.get("message")
        status = wait_tenant(
            stack_,
            tenant,
            lambda s: (
                s.get("activeRuns") == 0
                and Decimal(str(s["budget"][resource]["reserved"])) == 0
                and conditions(s).get("BudgetExhausted", {}).get("status") == "True"
            ),
        )
        exhausted = conditions(status)["BudgetExhausted"]
        assert exhausted["reason"] == reason
        assert resource in exhausted["message"]
        assert Decimal(str(status["budget"][resource]["used"])) == Decimal(
            str(status["budget"][resource]["limit"])
        )
        assert Decimal(str(status["budget"][resource]["remaining"])) == 0

        late_goal = f"E2E-TENANT-SMALL late {test_namespace}"
        stack_.apply(test_namespace, run_manifest("late", late_goal))
        late = stack_.wait_terminal(test_namespace, "late", timeout=10)
        assert (late["phase"], late["terminalReason"]) == ("Failed", "tenant_budget_exhausted")
        assert resource in late["message"] and tenant in late["message"], late["message"]
        assert model_calls(stack_, late_goal) == []
    assert_never_over_limit(sampler, tenant, resource)


def test_a_queued_run_can_be_cancelled_or_deleted_and_the_runs_behind_it_move_up(
    stack_: E2EStack, test_namespace: str, tenants: TenantFactory
) -> None:
    ns = test_namespace
    tenant = tenants(f"t-{ns}", [ns], maxConcurrentRuns=1)
    stack_.apply(ns, run_manifest("head", f"E2E-SLOW-MODEL head {ns}"))  # a 30 s model call
    stack_.wait_for(ns, "head", lambda s: s.get("phase") == "Running", timeout=20)
    waiting = ["w1", "w2", "w3"]
    goals = {name: f"E2E-TENANT-SLOW {name} {ns}" for name in waiting}
    for name in waiting:
        stack_.apply(ns, run_manifest(name, goals[name]))
    wait_runs(stack_, ns, lambda r: queue_of(r) == waiting and positions(r, waiting) == [1, 2, 3])

    stack_.kubectl("annotate", "agentrun", "w1", "-n", ns, "agentrun.dev/cancel=true")
    cancelled = stack_.wait_terminal(ns, "w1", timeout=15)
    assert (cancelled["phase"], cancelled["terminalReason"], cancelled["outcome"]) == (
        "Cancelled",
        "cancelled",
        "none",  # cancelled while queued
    )
    assert cancelled["tenant"] == tenant
    assert "queuePosition" not in cancelled and "startTime" not in cancelled
    assert conditions(cancelled)["Admitted"]["status"] == "False"
    wait_runs(
        stack_, ns, lambda r: queue_of(r) == ["w2", "w3"] and positions(r, ["w2", "w3"]) == [1, 2]
    )

    stack_.kubectl("delete", "agentrun", "w2", "-n", ns, "--timeout=20s")
    assert stack_.get(ns, "w2") is None  # no finalizer: gone at once
    wait_runs(stack_, ns, lambda r: queue_of(r) == ["w3"] and positions(r, ["w3"]) == [1])
    wait_tenant(stack_, tenant, lambda s: s.get("queuedRuns") == 1 and s.get("activeRuns") == 1)

    stack_.kubectl("annotate", "agentrun", "head", "-n", ns, "agentrun.dev/cancel=true")
    assert stack_.wait_terminal(ns, "head", timeout=15)["terminalReason"] == "cancelled"
    last = stack_.wait_terminal(ns, "w3", timeout=30)
    assert (last["terminalReason"], last["usage"]["steps"]) == ("completed", 2)
    assert model_calls(stack_, goals["w1"]) == []  # never ran
    assert model_calls(stack_, goals["w2"]) == []
    assert len(model_calls(stack_, goals["w3"])) == 2
    wait_tenant(stack_, tenant, lambda s: s.get("queuedRuns") == 0 and s.get("activeRuns") == 0)


def test_a_tenant_replaced_by_a_delete_and_a_create_keeps_its_queued_run(
    stack_: E2EStack, test_namespace: str, tenants: TenantFactory
) -> None:
    """``kubectl replace --force`` (Argo CD's Replace with Force): the AgentTenant deleted and
    created again at once; its queued run waits (the deletion's pass may see it gone) and is
    admitted by the tenant applied again, not moved to the stack's default tenant (nor ended
    ``invalid_spec`` without one), as it was before."""
    ns = test_namespace
    first = tenants(f"t-{ns}", [ns], maxConcurrentRuns=1)
    stack_.apply(ns, run_manifest("head", f"E2E-SLOW-MODEL head {ns}"))  # a 30 s model call
    stack_.wait_for(ns, "head", lambda s: s.get("phase") == "Running", timeout=20)
    stack_.apply(ns, run_manifest("waiting", f"E2E-TENANT-SLOW waiting {ns}"))
    wait_runs(stack_, ns, lambda r: queue_of(r) == ["waiting"])
    manifest = {
        "apiVersion": "agentrun.dev/v1alpha1",
        "kind": "AgentTenant",
        "metadata": {"name": first},
        "spec": {"namespaces": [ns], "maxConcurrentRuns": 1},
    }
    stack_.kubectl("replace", "--force", "-f", "-", input=yaml.safe_dump(manifest))
    stack_.kubectl("annotate", "agentrun", "head", "-n", ns, "agentrun.dev/cancel=true")
    waited = stack_.wait_terminal(ns, "waiting", timeout=45)
    assert (waited["terminalReason"], waited["tenant"]) == ("completed", first), waited


def test_a_queued_run_whose_tenant_is_deleted_is_admitted_and_charged_by_the_one_selecting_it(
    stack_: E2EStack, test_namespace: str, tenants: TenantFactory
) -> None:
    ns = test_namespace
    first = tenants(f"t-{ns}", [ns], maxConcurrentRuns=1)
    stack_.kubectl("label", "namespace", ns, f"agentrun-e2e-team={ns}")
    selector = {"matchLabels": {"agentrun-e2e-team": ns}}
    second = tenants(f"s-{ns}", [], namespaceSelector=selector)  # ns listed by first: first's
    stack_.apply(ns, run_manifest("head", f"E2E-SLOW-MODEL head {ns}"))  # a 30 s model call
    stack_.wait_for(ns, "head", lambda s: s.get("phase") == "Running", timeout=20)
    stack_.apply(ns, run_manifest("waiting", f"E2E-TENANT-SLOW waiting {ns}"))
    queued = wait_runs(stack_, ns, lambda r: queue_of(r) == ["waiting"])["waiting"]
    assert queued["tenant"] == first

    stack_.kubectl("delete", "agenttenant", first, "--wait=false")
    moved = stack_.wait_terminal(ns, "waiting", timeout=30)
    assert (moved["terminalReason"], moved["tenant"]) == ("completed", second)
    used = moved["usage"]["totalTokens"]
    wait_tenant(stack_, second, lambda s: s["budget"]["tokens"]["used"] == used)
    head = stack_.get(ns, "head")
    assert head is not None and head["status"]["tenant"] == first  # admitted: stays first's
    stack_.kubectl("annotate", "agentrun", "head", "-n", ns, "agentrun.dev/cancel=true")
    assert stack_.wait_terminal(ns, "head", timeout=15)["tenant"] == first


def test_tenant_policy_rejects_disallowed_models_tools_and_budgets_and_fills_in_defaults(
    stack_: E2EStack,
    test_namespace: str,
    more_namespaces: Callable[[], str],
    tenants: TenantFactory,
) -> None:
    strict_ns, clamp_ns, shared_ns = test_namespace, more_namespaces(), more_namespaces()
    strict = tenants(
        f"t-{strict_ns}",
        [strict_ns, shared_ns],
        allowedModels=["mock"],
        allowedTools=["calculate"],
        runBudget={"max": {"maxSteps": 3}, "default": {"maxSteps": 2}},  # overMax: Reject
    )
    clamp = tenants(
        f"t-{clamp_ns}",
        [clamp_ns, shared_ns],
        runBudget={"max": {"maxSteps": 3}, "overMax": "Clamp"},
    )
    other_model = f"other-{strict_ns}"
    model = {
        "apiVersion": "agentrun.dev/v1alpha1",
        "kind": "AgentModel",
        "metadata": {"name": other_model},
        "spec": {"baseURL": stack_.mock_url, "model": "scripted"},
    }
    stack_.kubectl("apply", "-f", "-", input=yaml.safe_dump(model))
    try:
        calc = ["calculate"]
        stop = {"onExhausted": "stop"}
        stack_.apply(
            strict_ns, run_manifest("wrong-model", "E2E-MAX-STEPS", model=other_model, tools=calc)
        )
        stack_.apply(strict_ns, run_manifest("wrong-tool", "E2E-MAX-STEPS"))  # calculate, sleep
        stack_.apply(
            strict_ns,
            run_manifest("over-cap", "E2E-MAX-STEPS", tools=calc, budget={"maxSteps": 10, **stop}),
        )
        stack_.apply(strict_ns, run_manifest("defaulted", "E2E-MAX-STEPS", tools=calc, budget=stop))
        stack_.apply(
            clamp_ns, run_manifest("clamped", "E2E-MAX-STEPS", budget={"maxSteps": 10, **stop})
        )
        stack_.apply(shared_ns, run_manifest("ambiguous", f"E2E-MAX-STEPS {shared_ns}", tools=calc))

        rejected = {
            "wrong-model": ["spec.model", other_model, strict],
            "wrong-tool": ["spec.tools", "sleep", strict],
            "over-cap": ["spec.budget.maxSteps", "spec.runBudget.max.maxSteps", strict],
        }
        for name, fragments in rejected.items():
            status = stack_.wait_terminal(strict_ns, name)
            assert (status["phase"], status["terminalReason"]) == ("Failed", "invalid_spec"), name
            for fragment in fragments:
                assert fragment in status["message"], (name, fragment, status["message"])
            assert status["tenant"] == strict
            admitted = conditions(status)["Admitted"]
            assert (admitted["status"], admitted["reason"]) == ("False", "InvalidSpec")

        defaulted = stack_.wait_terminal(strict_ns, "defaulted")
        assert (defaulted["terminalReason"], defaulted["usage"]["steps"]) == ("max_steps", 2)
        assert defaulted["tenant"] == strict
        assert defaulted["budget"] == {"maxSteps": 2, "maxToolCalls": 50, "timeout": "10m0s"}

        clamped = stack_.wait_terminal(clamp_ns, "clamped")
        assert (clamped["terminalReason"], clamped["usage"]["steps"]) == ("max_steps", 3)
        assert clamped["tenant"] == clamp
        spec = (stack_.get(clamp_ns, "clamped") or {})["spec"]
        assert spec["budget"]["maxSteps"] == 10  # the spec is left as written
        assert clamped["budget"]["maxSteps"] == 3  # its status says what it ran with

        ambiguous = stack_.wait_terminal(shared_ns, "ambiguous")
        assert (ambiguous["phase"], ambiguous["terminalReason"]) == ("Failed", "invalid_spec")
        assert strict in ambiguous["message"] and clamp in ambiguous["message"]
        assert ambiguous.get("tenant") not in (strict, clamp, "default")
        assert model_calls(stack_, f"E2E-MAX-STEPS {shared_ns}") == []

        def names_shared(status: dict[str, Any]) -> bool:
            found = conditions(status).get("NamespacesAmbiguous") or {}
            return found.get("status") == "True" and shared_ns in found.get("message", "")

        for tenant in (strict, clamp):  # each tenant says which of its namespaces is shared
            wait_tenant(stack_, tenant, names_shared)
    finally:
        stack_.kubectl("delete", "agentmodel", other_model, "--ignore-not-found", "--wait=false")


def test_nothing_in_an_agentrun_lifts_its_tenants_limits_or_lowers_its_price(
    stack_: E2EStack, test_namespace: str, tenants: TenantFactory
) -> None:
    ns = test_namespace
    tenant = tenants(f"t-{ns}", [ns], window="1h", whenExhausted="Fail", budget={"tokens": 2500})
    wait_early_in_window(stack_, tenant, window=3600, margin=60)
    sneaky = run_manifest(
        "sneaky",
        f"E2E-TENANT-SPEND sneaky {ns}",
        budget={"maxSteps": 1000, "maxTokens": 1_000_000_000, "maxCostUSD": "999999999"},
        tenant="default",
        pricing={
            "inputPerMillionUSD": "0",
            "cachedInputPerMillionUSD": "0",
            "outputPerMillionUSD": "0",
        },
    )
    sneaky["metadata"]["labels"] = {"agentrun.dev/tenant": "default"}
    sneaky["metadata"]["annotations"] = {"agentrun.dev/tenant": "default"}

    strict = stack_.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(sneaky), check=False)
    assert strict.returncode != 0, "the API server took unknown spec fields"
    assert 'unknown field "spec.pricing"' in strict.stderr
    assert 'unknown field "spec.tenant"' in strict.stderr
    assert stack_.get(ns, "sneaky") is None

    stack_.kubectl("apply", "--validate=false", "-n", ns, "-f", "-", input=yaml.safe_dump(sneaky))
    spec = (stack_.get(ns, "sneaky") or {})["spec"]
    assert "pricing" not in spec and "tenant" not in spec  # pruned by the structural schema
    status = stack_.wait_terminal(ns, "sneaky", timeout=30)
    assert (status["phase"], status["terminalReason"]) == ("Failed", "tenant_budget_exhausted")
    assert status["tenant"] == tenant
    steps = status["usage"]["steps"]
    assert 1 <= steps < 5
    assert Decimal(status["usage"]["costUSD"]) == steps * SPEND_COST  # the AgentModel's prices
    assert status["usage"]["totalTokens"] == steps * SPEND_TOKENS
    charged = wait_tenant(
        stack_,
        tenant,
        lambda s: (
            s.get("activeRuns") == 0
            and s["budget"]["tokens"]["used"] == status["usage"]["totalTokens"]
        ),
    )["budget"]["tokens"]
    assert charged["used"] <= charged["limit"] == 2500


def test_an_operator_killed_while_runs_are_queued_admits_each_once_in_fifo_order(
    stack_: E2EStack, test_namespace: str, tenants: TenantFactory, nats_server: Any
) -> None:
    ns = test_namespace
    tenant = tenants(f"t-{ns}", [ns], maxConcurrentRuns=1)
    names = [f"r-{i}" for i in range(4)]
    goals = {name: f"E2E-TENANT-SLOW {name} {ns}" for name in names}
    for name in names:
        stack_.apply(ns, run_manifest(name, goals[name]))
    wait_runs(
        stack_,
        ns,
        lambda r: (
            r.get("r-0", {}).get("phase") == "Running"
            and queue_of(r) == names[1:]
            and positions(r, names[1:]) == [1, 2, 3]
        ),
    )
    components.kill_component(stack_.operator)
    time.sleep(1.5)
    stack_.restart_dead()
    final = {n: stack_.wait_terminal(ns, n, timeout=60) for n in names}
    for name, status in final.items():
        assert (status["terminalReason"], status["usage"]["steps"]) == ("completed", 2), name
        assert status["tenant"] == tenant
        assert turn_numbers(read_events(nats_server, ns, name)) == [0, 1], name
        assert [r.get("turn") for r in model_calls(stack_, goals[name])] == [0, 1], name
    admitted_at = admission_times(nats_server, ns, names)
    assert sorted(names, key=admitted_at.__getitem__) == names, admitted_at
    assert max_overlap(nats_server, ns, names) == 1
    wait_tenant(stack_, tenant, lambda s: s.get("activeRuns") == 0 and s.get("queuedRuns") == 0)


def test_an_invalid_tenant_says_why_and_its_runs_are_rejected_not_charged_elsewhere(
    stack_: E2EStack, test_namespace: str, tenants: TenantFactory
) -> None:
    """runBudget.default above runBudget.max (stored before the API server checked it)
    cannot be enforced: the AgentTenant shows Accepted=False with the reason, and a run in its
    namespace is rejected naming it — it does not fall through to the default tenant's
    budget."""
    tenant = f"t-{test_namespace}"
    with tenant_crd_before_default_checks(stack_):
        tenants(tenant, [test_namespace], runBudget=DEFAULT_ABOVE_CAP)
    status = wait_tenant(stack_, tenant, lambda s: "Accepted" in conditions(s))
    accepted = conditions(status)["Accepted"]
    assert (accepted["status"], accepted["reason"]) == ("False", "InvalidSpec")
    assert "spec.runBudget.default.maxSteps" in accepted["message"]
    stack_.apply(test_namespace, run_manifest("stray", "E2E-PARALLEL-ORDER: stray"))
    ended = stack_.wait_terminal(test_namespace, "stray")
    assert ended["terminalReason"] == "invalid_spec"
    assert tenant in ended["message"] and "invalid" in ended["message"]


def test_hidden_prompt_tokens_overrun_at_most_the_calls_in_flight_and_are_told(
    stack_: E2EStack, test_namespace: str, tenants: TenantFactory
) -> None:
    """B13: the provider reports about 5,000 prompt tokens (0.0125 USD) per call for a
    prompt of a few hundred characters. The first calls overrun what was held for them; the
    workers learn what the provider adds, so later reservations hold it and the tenant's
    overrun stays within the calls that were in flight (at most maxConcurrentRuns, and one
    more per worker that had not seen the provider yet), told by a BudgetOverrun Event."""
    tenant = tenants(
        f"t-{test_namespace}",
        [test_namespace],
        window="1h",
        whenExhausted="Fail",
        maxConcurrentRuns=3,
        budget={"costUSD": "0.10"},
    )
    wait_early_in_window(stack_, tenant, window=3600, margin=120)
    names = [f"h-{i}" for i in range(8)]
    for name in names:
        stack_.apply(
            test_namespace, run_manifest(name, f"E2E-HIDDEN-PROMPT {name} {test_namespace}")
        )
    final = {n: stack_.wait_terminal(test_namespace, n, timeout=90) for n in names}
    reasons = {s["terminalReason"] for s in final.values()}
    assert reasons <= {"completed", "tenant_budget_exhausted"}, final
    assert "tenant_budget_exhausted" in reasons  # 8 runs of 0.038 USD cannot fit 0.10
    status = wait_tenant(
        stack_, tenant, lambda s: s.get("activeRuns") == 0 and s.get("queuedRuns") == 0
    )
    used = Decimal(status["budget"]["costUSD"]["used"])
    per_call = Decimal("0.0125")  # the provider's prompt alone
    assert used <= Decimal("0.10") + (3 + 2) * per_call, used
    if used > Decimal("0.10"):
        deadline = time.monotonic() + 30
        told: list[dict[str, Any]] = []
        while time.monotonic() < deadline and not told:
            events = json.loads(
                stack_.kubectl("get", "events", "-n", "default", "-o", "json").stdout
            )["items"]
            told = [
                e
                for e in events
                if e["involvedObject"].get("name") == tenant and e["reason"] == "BudgetOverrun"
            ]
            time.sleep(0.5)
        assert told and told[0]["type"] == "Warning", "no BudgetOverrun Event on the tenant"
        assert "costUSD" in told[0]["message"]


def test_a_queued_run_whose_agentmodel_is_replaced_waits_for_it_through_a_restart(
    stack_: E2EStack, test_namespace: str, tenants: TenantFactory
) -> None:
    """An AgentModel deleted and applied again (a GitOps tool replacing it) while a run
    naming it waits in its tenant's queue: the run waits (``ReferenceMissing``, naming the
    field), through an operator restart, and completes once the model is back; a new run
    naming the missing model is rejected meanwhile."""
    ns = test_namespace
    tenants(f"t-{ns}", [ns], maxConcurrentRuns=1)
    found = json.loads(stack_.kubectl("get", "agentmodel", "mock", "-o", "json").stdout)
    model = {
        "apiVersion": found["apiVersion"],
        "kind": "AgentModel",
        "metadata": {"name": f"m-{ns}"},
        "spec": found["spec"],
    }
    stack_.kubectl("apply", "-f", "-", input=yaml.safe_dump(model))
    try:
        stack_.apply(ns, run_manifest("head", f"E2E-SLOW-MODEL head {ns}"))  # a 30 s call
        stack_.wait_for(ns, "head", lambda s: s.get("phase") == "Running", timeout=20)
        goal = f"E2E-TENANT-SLOW waiting {ns}"
        stack_.apply(ns, run_manifest("waiting", goal, model=f"m-{ns}"))
        wait_runs(stack_, ns, lambda r: queue_of(r) == ["waiting"])

        stack_.kubectl("delete", "agentmodel", f"m-{ns}")
        components.kill_component(stack_.operator)
        stack_.restart_dead()
        waits = wait_runs(
            stack_,
            ns,
            lambda r: (
                conditions(r.get("waiting") or {}).get("Admitted", {}).get("reason")
                == "ReferenceMissing"
            ),
            timeout=60,
        )["waiting"]
        assert waits["phase"] == "Queued"
        assert (
            f"spec.model: AgentModel 'm-{ns}' not found" in conditions(waits)["Admitted"]["message"]
        )
        stack_.apply(ns, run_manifest("new", f"{goal} new", model=f"m-{ns}"))
        assert stack_.wait_terminal(ns, "new", timeout=30)["terminalReason"] == "invalid_spec"

        stack_.kubectl("apply", "-f", "-", input=yaml.safe_dump(model))
        stack_.kubectl("annotate", "agentrun", "head", "-n", ns, "agentrun.dev/cancel=true")
        done = stack_.wait_terminal(ns, "waiting", timeout=60)
        assert (done["terminalReason"], done["usage"]["steps"]) == ("completed", 2)
        assert len(model_calls(stack_, goal)) == 2
    finally:
        stack_.kubectl("delete", "agentmodel", f"m-{ns}", "--ignore-not-found", "--wait=false")
