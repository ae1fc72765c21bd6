"""The chart installed for real on the node, driven with kubectl and helm as a user would:
``helm install`` runs the operator, the workers, the scripted model and the chart's own NATS
as pods under Pod Security ``restricted``; the example AgentRuns reach their terminal
reasons; ``helm test`` runs one AgentRun end to end; the workers scale to three and all of
them execute turns; every worker pod force-deleted mid-run, the operator pod deleted mid-run,
and a ``helm upgrade`` that rolls both Deployments while runs are in flight each leave every
run completed with each turn committed once; this operator drives workers of the previous
revision (``worker.image.tag``) until a second ``helm upgrade`` rolls them under runs in flight,
as the upgrade steps of docs/operations.md say; a ``helm upgrade`` from one NATS server to three
without a restore is refused; ``helm uninstall`` removes what it installed but keeps the CRDs
and the AgentRuns. The tests run in file order on one release."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from previous_support import PREVIOUS_POD, install_previous

from agentrun_dev import containerd, helm, image, node, release
from agentrun_dev.kubectl import Kubectl
from cluster.runs_support import (
    agent_run,
    assert_completed_once_per_turn,
    demo_release,
    ended,
    print_pods,
    start_slow_runs,
    wait_for,
)

REPO = Path(__file__).resolve().parents[2]
RELEASE = release.RELEASE_NAME
EXAMPLES = {"rectangle": "completed", "collatz": "max_steps", "inventory": "tool_budget_exhausted"}
pytestmark = [pytest.mark.e2e, pytest.mark.node, pytest.mark.timeout(1800)]


def worker_pods(kubectl: Kubectl, namespace: str) -> list[str]:
    selector = "app.kubernetes.io/component=worker"
    output = kubectl("get", "pods", "-n", namespace, "-l", selector, "-o", "json").stdout
    return [
        p["metadata"]["name"]
        for p in json.loads(output)["items"]
        if p["metadata"].get("deletionTimestamp") is None
    ]


def turns_committed(kubectl: Kubectl, namespace: str, pod: str) -> float:
    """The worker's ``agentrun_turns_total`` (all tenants), read from its own /metrics."""
    script = (
        "import urllib.request;"
        "print(urllib.request.urlopen('http://127.0.0.1:9090/metrics').read().decode())"
    )
    text = kubectl("exec", "-n", namespace, pod, "--", "python3.11", "-c", script).stdout
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("agentrun_turns_total{")
    )


def deployment_revisions(kubectl: Kubectl, namespace: str) -> dict[str, str]:
    """Each Deployment's rollout revision, by name."""
    deployments = json.loads(kubectl("get", "deploy", "-n", namespace, "-o", "json").stdout)
    return {
        d["metadata"]["name"]: d["metadata"]["annotations"]["deployment.kubernetes.io/revision"]
        for d in deployments["items"]
    }


@pytest.fixture(scope="module")
def installed(
    cluster_node: node.Node, node_kubectl: Kubectl, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[release.Release]:
    """The chart installed (the scripted model and the chart's own NATS included) in a
    namespace under Pod Security ``restricted``, its images imported into the node."""
    worker = {"terminationGracePeriodSeconds": 5, "drainMarginSeconds": 2}
    home = tmp_path_factory.mktemp("release")
    with demo_release(cluster_node, node_kubectl, home, "agentrun-helm", {"worker": worker}) as r:
        yield r


@pytest.fixture(scope="module")
def ns(installed: release.Release) -> str:
    """The release's namespace."""
    return installed.namespace


def test_the_operator_and_the_workers_run_as_ready_pods(node_kubectl: Kubectl, ns: str) -> None:
    output = node_kubectl("get", "pods", "-n", ns, "-o", "json").stdout
    ready = {
        p["metadata"]["labels"].get("app.kubernetes.io/component"): all(
            c["ready"] for c in p["status"].get("containerStatuses", [])
        )
        for p in json.loads(output)["items"]
    }
    components = ("operator", "worker", "mock-model", "nats")
    assert {k: ready.get(k) for k in components} == dict.fromkeys(components, True)


def test_the_example_runs_reach_their_terminal_reasons(node_kubectl: Kubectl, ns: str) -> None:
    for name in EXAMPLES:
        node_kubectl("apply", "-n", ns, "-f", str(REPO / "examples" / f"{name}.yaml"))
    reasons = {name: wait_for(node_kubectl, ns, name, ended)["terminalReason"] for name in EXAMPLES}
    assert reasons == EXAMPLES


def test_helm_test_runs_one_agentrun_end_to_end(installed: release.Release, ns: str) -> None:
    tested = installed.helm("test", installed.name, "-n", ns, "--logs", "--timeout", "5m",
                            timeout=330)  # fmt: skip
    assert re.search(r"Phase:\s+Succeeded", tested.stdout), tested.stdout
    assert "Succeeded / completed, 1 step," in tested.stdout, tested.stdout


def test_three_workers_all_execute_turns(node_kubectl: Kubectl, ns: str) -> None:
    node_kubectl("scale", "deployment", f"{RELEASE}-worker", "-n", ns, "--replicas=3")
    node_kubectl("rollout", "status", f"deployment/{RELEASE}-worker", "-n", ns,
                 "--timeout=180s", timeout=190)  # fmt: skip
    workers = worker_pods(node_kubectl, ns)
    assert len(workers) == 3
    before = {pod: turns_committed(node_kubectl, ns, pod) for pod in workers}
    names = [f"spread-{i}" for i in range(12)]
    for name in names:
        run = agent_run(name, "Follow the Collatz sequence", maxSteps=4)
        node_kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(run))
    for name in names:
        assert wait_for(node_kubectl, ns, name, ended)["terminalReason"] == "max_steps"
    # a worker counts a turn after its commit and settlement, so the last counts may land
    # after the runs' ends are written: poll for them
    deadline = time.monotonic() + 30
    while True:
        executed = {pod: turns_committed(node_kubectl, ns, pod) - before[pod] for pod in workers}
        if sum(executed.values()) >= 12 * 4 or time.monotonic() > deadline:
            break
        time.sleep(1.0)
    assert all(count > 0 for count in executed.values()), executed
    assert sum(executed.values()) >= 12 * 4


def test_force_deleted_workers_mid_run_lose_no_turn(node_kubectl: Kubectl, ns: str) -> None:
    # every worker pod, so the one holding the turn in flight is among them
    start_slow_runs(node_kubectl, ns, ["slow-worker"])
    victims = worker_pods(node_kubectl, ns)
    node_kubectl("delete", "pod", *victims, "-n", ns, "--grace-period=0", "--force")
    assert_completed_once_per_turn(node_kubectl, ns, ["slow-worker"])
    assert not set(victims) & set(worker_pods(node_kubectl, ns))


def test_the_operator_pod_deleted_mid_run_and_the_run_completes(
    node_kubectl: Kubectl, ns: str
) -> None:
    selector = "app.kubernetes.io/component=operator"
    before = node_kubectl("get", "pods", "-n", ns, "-l", selector, "-o", "name").stdout.split()
    start_slow_runs(node_kubectl, ns, ["slow-operator"])
    node_kubectl("delete", "pods", "-n", ns, "-l", selector, "--wait=false")
    assert_completed_once_per_turn(node_kubectl, ns, ["slow-operator"])
    # the old pod is listed (Terminating) until its process has stopped, which may end after
    # the run did: poll for it to go, within its 30 s grace period and then some
    deadline = time.monotonic() + 90
    while True:
        after = node_kubectl("get", "pods", "-n", ns, "-l", selector, "-o", "name").stdout.split()
        if (after and not set(before) & set(after)) or time.monotonic() > deadline:
            break
        time.sleep(1.0)
    assert after and not set(before) & set(after)


def test_helm_upgrade_while_runs_are_in_flight_loses_none(
    installed: release.Release, node_kubectl: Kubectl, ns: str
) -> None:
    def revisions() -> dict[str, str]:
        return deployment_revisions(node_kubectl, ns)

    names = [f"slow-upgrade-{i}" for i in range(4)]
    start_slow_runs(node_kubectl, ns, names)
    before = revisions()
    installed.helm(
        "upgrade", installed.name, str(installed.chart), "-n", ns, "--reuse-values",
        "--set", "worker.concurrency=16",
        "--set", "operator.podAnnotations.agentrun\\.dev/upgraded=yes",
        "--wait", "--timeout", "5m", timeout=330,
    )  # fmt: skip
    after = revisions()
    rolled = {f"{RELEASE}-worker", f"{RELEASE}-operator"}
    assert all(after[name] != before[name] for name in rolled), (before, after)
    assert_completed_once_per_turn(node_kubectl, ns, names)


def test_this_operator_drives_workers_of_the_previous_revision_until_they_roll(
    installed: release.Release,
    cluster_node: node.Node,
    node_kubectl: Kubectl,
    ns: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """The supported skew as docs/operations.md's upgrade steps make it: the workers kept on
    the previous revision's image (``worker.image.tag``) while this operator runs, runs started
    on them, then the second ``helm upgrade`` rolls the workers to this image under those runs.
    The old image is this one with the previous revision's package first on ``PYTHONPATH``
    (``previous_support.PREVIOUS_POD``): its code, these libraries."""
    site = install_previous(tmp_path_factory.mktemp("previous"), PREVIOUS_POD)
    current = image.build_project_images(REPO, log=print).agentrun
    tag = f"previous-{PREVIOUS_POD[:12]}"
    old = image.derived_image(
        current, name=f"{image.AGENTRUN_REPOSITORY}:{tag}",
        add=[("/opt/agentrun-previous", site)],
        env=[("PYTHONPATH", "/opt/agentrun-previous")], log=print,
    )  # fmt: skip
    containerd.import_image(cluster_node.directory, old.archive, log=print)

    def upgrade(worker_tag: str) -> None:
        try:
            installed.helm(
                "upgrade", installed.name, str(installed.chart), "-n", ns, "--reuse-values",
                "--set", f"worker.image.tag={worker_tag}", "--wait", "--timeout", "5m",
                timeout=330,
            )  # fmt: skip
        except helm.HelmError:
            print_pods(node_kubectl, ns)
            raise

    def worker_images() -> set[str]:
        selector = "app.kubernetes.io/component=worker"
        pods = json.loads(
            node_kubectl("get", "pods", "-n", ns, "-l", selector, "-o", "json").stdout
        )["items"]
        return {
            c["image"]
            for p in pods
            if p["metadata"].get("deletionTimestamp") is None
            for c in p["spec"]["containers"]
        }

    operator_before = deployment_revisions(node_kubectl, ns)[f"{RELEASE}-operator"]
    upgrade(tag)
    assert deployment_revisions(node_kubectl, ns)[f"{RELEASE}-operator"] == operator_before
    assert worker_images() == {old.name}
    consumer = "agentrun/worker/consumer.py"  # changed since PREVIOUS_POD
    script = "import agentrun.worker.consumer as m, sys; sys.stdout.write(open(m.__file__).read())"
    running = {
        node_kubectl("exec", "-n", ns, pod, "--", "python3.11", "-c", script).stdout
        for pod in worker_pods(node_kubectl, ns)
    }
    assert (
        running
        == {(site / consumer).read_text()}
        != {(REPO / "worker" / "consumer.py").read_text()}
    )
    names = [f"slow-skew-{i}" for i in range(3)]
    start_slow_runs(node_kubectl, ns, names)  # their first turns run on the old workers
    whole = agent_run("skew-collatz", "Follow the Collatz sequence", maxSteps=4)
    node_kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(whole))
    assert wait_for(node_kubectl, ns, "skew-collatz", ended)["terminalReason"] == "max_steps"
    upgrade("")
    assert worker_images() == {current.name}
    assert_completed_once_per_turn(node_kubectl, ns, names)


def test_a_change_from_one_nats_server_to_three_is_refused_without_a_restore(
    installed: release.Release, node_kubectl: Kubectl, ns: str
) -> None:
    """NATS carries no stream from one server into a cluster: the chart refuses the change on a
    running release unless the upgrade says the streams are restored from a backup."""

    def revision() -> str:
        status = json.loads(installed.helm("status", installed.name, "-n", ns, "-o", "json").stdout)
        return str(status["version"])

    before = revision()
    refused = installed.helm(
        "upgrade", installed.name, str(installed.chart), "-n", ns, "--reuse-values",
        "--set", "nats.install.replicas=3", check=False, timeout=120,
    )  # fmt: skip
    assert refused.returncode != 0
    assert "nats.install.restoreFromBackup" in refused.stderr, refused.stderr
    assert "From one NATS server to three" in refused.stderr
    assert revision() == before
    sts = json.loads(node_kubectl("get", "sts", f"{RELEASE}-nats", "-n", ns, "-o", "json").stdout)
    assert sts["spec"]["replicas"] == 1


def test_helm_uninstall_keeps_the_crds_and_the_agentruns(
    installed: release.Release, node_kubectl: Kubectl, ns: str
) -> None:
    installed.helm("uninstall", installed.name, "-n", ns, "--wait", timeout=300)
    assert node_kubectl("get", "crd", "agentruns.agentrun.dev").returncode == 0
    kept = node_kubectl("get", "agentruns", "-n", ns, "-o", "name").stdout.split()
    assert "agentrun.agentrun.dev/rectangle" in kept
    owned = f"app.kubernetes.io/instance={RELEASE}"
    kinds = "deploy,statefulset,service,configmap,serviceaccount"
    left = node_kubectl("get", kinds, "-n", ns, "-l", owned, "-o", "name")
    assert left.stdout == ""
    # Helm deletes no hook: the last `helm test` Pod stays (its log), for the user to delete
    tested = f"{owned},app.kubernetes.io/component=check"
    check = node_kubectl("get", "pods", "-n", ns, "-l", tested, "-o", "name").stdout.split()
    assert check == [f"pod/{RELEASE}-check"]
    node_kubectl("delete", "pod", f"{RELEASE}-check", "-n", ns)
    # the pods go with their ReplicaSets (garbage collection, after their grace period)
    deadline = time.monotonic() + 120
    while pods := node_kubectl("get", "pods", "-n", ns, "-l", owned, "-o", "name").stdout:
        assert time.monotonic() < deadline, f"pods left after helm uninstall:\n{pods}"
        time.sleep(1.0)
    cluster_kinds = "clusterrole,clusterrolebinding,agentmodel"
    assert node_kubectl("get", cluster_kinds, "-l", owned, "-o", "name").stdout == ""
