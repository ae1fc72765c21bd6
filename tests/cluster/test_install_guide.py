"""docs/install.md followed on a real node, so the guide cannot drift: its marked command
blocks (``<!-- install-step -->``, ``<!-- uninstall-step -->``) run in order in one bash per
phase, as a platform engineer would paste them, with only the substitutions the node needs,
all through the guide's own variables (step 0):

- ``RELEASE_DIR``: a release directory assembled from the local build (the chart packaged by
  ``helm package`` as ``make release`` does, the two image archives ``make image`` built (linked),
  ``SHA256SUMS`` signed with a key made here; no SBOMs, which the guide does not use) instead
  of a download; ``ALLOWED_SIGNERS``/``SIGNER``: that key;
- ``PLUGIN_VENV``: the virtualenv the guide installs the release's wheel (the kubectl plugin)
  into, under the test's temporary directory;
- ``CONTAINERD_ADDRESS``: the node's containerd socket, which ``ctr`` reads;
- ``MODEL_BASE_URL``/``MODEL_NAME``/``MODEL_API_KEY``: the scripted model (a Deployment in a
  namespace of its own, applied right after the images are loaded) instead of a paid one;
- ``NATS_PERSISTENCE=false``: the node has no StorageClass; ``PROMETHEUS_OPERATOR=false``:
  no Prometheus Operator CRDs on the node;
- ``KUBECONFIG``, and ``PATH`` with the pinned helm and kubectl first.

Then it checks what the guide says the reader sees: the signature and checksums verified, every
pod Ready with the production replicas, PodDisruptionBudgets and priority class, the first run
``Succeeded``, its trajectory printed by ``kubectl agentrun logs``, ``bob`` (agentrun-view) may
get runs but not create them, ``alice`` (agentrun-edit) may not approve, the upgrade recorded;
after ``helm uninstall``, the CRDs, the first run and the hooks' Secrets kept; after "remove
everything", nothing of it left. One release (``helm install --wait``) on the node, like each
other module here: its cost is that install plus the upgrade and the two uninstalls.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from agentrun_dev import containerd, dist, guide, helm, image, node
from agentrun_dev.kubectl import Kubectl

REPO = Path(__file__).resolve().parents[2]
GUIDE = REPO / "docs" / "install.md"
SIGNER = "release@agentrun.dev"
MODEL_PORT = 8000
HOOK_SECRETS = {
    "agentrun-nats-keys", "agentrun-nats-server", "agentrun-nats-operator",
    "agentrun-nats-worker", "agentrun-signing", "agentrun-trust",
}  # fmt: skip
"""Kept by ``helm uninstall``: made by the hooks, not part of the release."""
pytestmark = [pytest.mark.e2e, pytest.mark.node, pytest.mark.timeout(1800)]


def assemble_release(directory: Path, images: image.ProjectImages, home: Path) -> Path:
    """The release directory the guide starts from, as ``make release`` lays it out (the
    chart, the wheel, the images; no SBOMs), signed with a key made here; returns the
    ``allowed_signers`` file."""
    version = dist.project_version(REPO)
    directory.mkdir(parents=True)
    runner = helm.Helm(helm.ensure_helm(log=print), home=home)
    files = [dist.package_chart(runner, REPO, directory, version=version)]
    files.append(image.build_wheel(REPO, directory, log=print))
    nats_tag = images.nats.name.rpartition(":")[2]
    for built, name in ((images.agentrun, f"agentrun-image-{version}.docker.tar"),
                        (images.nats, f"agentrun-nats-image-{nats_tag}.docker.tar")):  # fmt: skip
        # a link of its own: another build of the same tag may delete the cached archive
        try:
            os.link(built.archive, directory / name)
        except OSError:  # another file system
            shutil.copyfile(built.archive, directory / name)
        files.append(directory / name)
    key = home / "release_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", SIGNER, "-f", str(key)],
                   check=True, timeout=60)  # fmt: skip
    dist.sign(dist.write_checksums(directory, files), key)
    allowed = home / "allowed_signers"
    allowed.write_text(f"{SIGNER} {key.with_suffix('.pub').read_text().strip()}\n")
    return allowed


def model_manifest(namespace: str, agentrun_image: str) -> list[dict[str, Any]]:
    """The scripted OpenAI-compatible model (examples/scenarios.yaml) as a Deployment and a
    Service in `namespace`: the test's stand-in for the reader's model endpoint."""
    labels = {"app": "model"}
    scenarios = (REPO / "examples" / "scenarios.yaml").read_text()
    container = {
        "name": "model", "image": agentrun_image, "imagePullPolicy": "IfNotPresent",
        "command": ["python3.11", "-m", "agentrun.testing.mockllm", "--host=0.0.0.0",
                    f"--port={MODEL_PORT}", "--scenarios=/etc/mockllm/scenarios.yaml"],
        "ports": [{"containerPort": MODEL_PORT}],
        "readinessProbe": {"tcpSocket": {"port": MODEL_PORT}, "periodSeconds": 1},
        "volumeMounts": [{"name": "scenarios", "mountPath": "/etc/mockllm"}],
    }  # fmt: skip
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
        {"apiVersion": "v1", "kind": "ConfigMap",
         "metadata": {"name": "scenarios", "namespace": namespace},
         "data": {"scenarios.yaml": scenarios}},
        {"apiVersion": "apps/v1", "kind": "Deployment",
         "metadata": {"name": "model", "namespace": namespace},
         "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                  "template": {"metadata": {"labels": labels}, "spec": {
                      "containers": [container],
                      "volumes": [{"name": "scenarios", "configMap": {"name": "scenarios"}}]}}}},
        {"apiVersion": "v1", "kind": "Service",
         "metadata": {"name": "model", "namespace": namespace},
         "spec": {"selector": labels, "ports": [{"port": MODEL_PORT}]}},
    ]  # fmt: skip


class Guide:
    """The guide's phases, run against the node in one working directory."""

    def __init__(self, env: dict[str, str], workdir: Path, model_step: guide.Step) -> None:
        self.env, self.workdir = env, workdir
        found = guide.steps(GUIDE.read_text())
        self.variables = found[0]
        self.install = [s for s in found[1:] if s.kind == "install-step"]
        loads = [i for i, s in enumerate(self.install) if "images import" in s.code]
        assert len(loads) == 1, "the guide loads the images in one block"
        self.install.insert(loads[0] + 1, model_step)
        self.uninstall = [s for s in found if s.kind == "uninstall-step"]
        self.output: dict[str, str] = {}

    def run(self, phase: str, blocks: list[guide.Step]) -> str:
        """Run `blocks` (after the variables block) in bash; their stdout. Fails the test,
        showing the output, when a command fails."""
        script = guide.script([self.variables, *blocks])
        started = time.monotonic()
        result = subprocess.run(["bash", "-c", script], cwd=self.workdir, env=self.env,
                                capture_output=True, text=True, timeout=1500)  # fmt: skip
        print(f"guide {phase}: {time.monotonic() - started:.0f} s\n{result.stdout}")
        assert result.returncode == 0, f"{phase} failed:\n{result.stdout}\n{result.stderr}"
        self.output[phase] = result.stdout
        return result.stdout


@pytest.fixture(scope="module")
def followed(
    cluster_node: node.Node, node_kubectl: Kubectl, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Guide, dict[str, str]]]:
    """The guide's install phase (steps 0-9) run on the node; the guide and its variables."""
    home = tmp_path_factory.mktemp("guide")
    images = image.build_project_images(REPO, log=print)
    suffix = uuid.uuid4().hex[:6]
    names = {"NS": f"agentrun-guide-{suffix}", "TEAM": f"team-guide-{suffix}",
             "MODEL_NS": f"guide-model-{suffix}"}  # fmt: skip
    manifest = home / "model.yaml"
    manifest.write_text(yaml.safe_dump_all(model_manifest(names["MODEL_NS"], images.agentrun.name)))
    bin_dir = home / "bin"
    bin_dir.mkdir()
    (bin_dir / "helm").symlink_to(helm.ensure_helm(log=print))
    (bin_dir / "kubectl").symlink_to(node_kubectl.binary)
    env = {k: v for k, v in node_kubectl.env.items() if not k.startswith("HELM_")}
    env |= {f"HELM_{n}_HOME": str(home / "helm" / n.lower()) for n in ("CONFIG", "CACHE", "DATA")}
    env |= names | {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "VERSION": dist.project_version(REPO),
        "RELEASE_DIR": str(home / "release"),
        "PLUGIN_VENV": str(home / "plugin"),
        "ALLOWED_SIGNERS": str(assemble_release(home / "release", images, home / "keys")),
        "SIGNER": SIGNER,
        "CONTAINERD_ADDRESS": str(containerd.socket_path(cluster_node.directory)),
        "NATS_PERSISTENCE": "false",
        "PROMETHEUS_OPERATOR": "false",
        "MODEL_BASE_URL": f"http://model.{names['MODEL_NS']}.svc:{MODEL_PORT}/v1",
        "MODEL_NAME": "scripted",
        "MODEL_API_KEY": "the-scripted-model-checks-no-key",
    }
    model_step = guide.Step("test-step", 0, (
        f"kubectl apply -f {manifest}\n"
        f"kubectl -n {names['MODEL_NS']} rollout status deploy/model --timeout=180s\n"
    ))  # fmt: skip
    work = home / "work"
    work.mkdir()
    followed = Guide(env, work, model_step)
    try:
        followed.run("install", followed.install)
        yield followed, env
    finally:
        clean_up(followed, node_kubectl, names)


def clean_up(followed: Guide, kubectl: Kubectl, names: dict[str, str]) -> None:
    """What the guide's last steps remove, in case a step failed before them."""
    uninstall = ["helm", "uninstall", "agentrun", "-n", names["NS"], "--ignore-not-found", "--wait"]
    subprocess.run(uninstall, env=followed.env, capture_output=True, timeout=300, check=False)
    kubectl("delete", "agenttenant", names["TEAM"], "--ignore-not-found", check=False)
    kubectl("delete", "agentmodel", "default-chat", "--ignore-not-found", check=False)
    kubectl("delete", "priorityclass", "agentrun", "--ignore-not-found", check=False)
    for namespace in (names["TEAM"], names["MODEL_NS"], names["NS"]):
        kubectl("delete", "namespace", namespace, "--ignore-not-found", check=False, timeout=300)


def objects(kubectl: Kubectl, *args: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = json.loads(kubectl("get", *args, "-o", "json").stdout)["items"]
    return items


def test_the_release_verifies_before_anything_is_installed(
    followed: tuple[Guide, dict[str, str]],
) -> None:
    output = followed[0].output["install"]
    assert f'Good "agentrun-release" signature for {SIGNER}' in output
    assert ".tgz: OK" in output and ".docker.tar: OK" in output


def test_the_production_install_is_ready_with_its_replicas_pdbs_and_priority(
    followed: tuple[Guide, dict[str, str]], node_kubectl: Kubectl
) -> None:
    ns = followed[1]["NS"]
    pods = [p for p in objects(node_kubectl, "pods", "-n", ns)
            if not p["metadata"].get("deletionTimestamp")]  # fmt: skip
    ready: dict[str, int] = {}
    for pod in pods:
        if all(c["ready"] for c in pod["status"].get("containerStatuses", [{"ready": False}])):
            component = pod["metadata"]["labels"].get("app.kubernetes.io/component", "?")
            ready[component] = ready.get(component, 0) + 1
    assert ready == {"operator": 2, "worker": 3, "nats": 1, "trajectory": 1}
    priorities = {p["metadata"]["labels"]["app.kubernetes.io/component"]:
                  p["spec"].get("priorityClassName") for p in pods}  # fmt: skip
    assert priorities["operator"] == priorities["worker"] == "agentrun"
    pdbs = {p["metadata"]["name"]: p["spec"]["maxUnavailable"]
            for p in objects(node_kubectl, "pdb", "-n", ns)}  # fmt: skip
    assert pdbs == {"agentrun-operator": 1, "agentrun-worker": 1}


def test_the_first_run_succeeds_and_its_trajectory_prints(
    followed: tuple[Guide, dict[str, str]], node_kubectl: Kubectl
) -> None:
    guide_run, env = followed
    run = json.loads(node_kubectl("get", "agentrun", "first-run", "-n", env["TEAM"],
                                  "-o", "json").stdout)  # fmt: skip
    status = run["status"]
    assert (status["phase"], status["terminalReason"], status["tenant"]) == (
        "Succeeded",
        "completed",
        env["TEAM"],
    )
    assert status["answer"] == "The rectangle's area is 12 and its perimeter is 14."
    logs = guide_run.output["install"].split("admitted in tenant", 1)[1]  # its first line
    assert '→ calculate({"expression":"3*4"})' in logs and "← calculate [call_0_0]: 12" in logs
    assert "end   Succeeded completed (ok): 2 steps" in logs
    # the tenant's status is projected from its ledger book by the operator's sweep
    deadline = time.monotonic() + 30
    while True:
        tenant = json.loads(node_kubectl("get", "agenttenant", env["TEAM"], "-o", "json").stdout)
        used = ((tenant.get("status") or {}).get("budget") or {}).get("tokens", {}).get("used")
        if used or time.monotonic() > deadline:
            break
        time.sleep(1.0)
    assert used == status["usage"]["inputTokens"] + status["usage"]["outputTokens"]


def test_a_viewer_may_get_runs_but_not_create_them_and_an_editor_may_not_approve(
    followed: tuple[Guide, dict[str, str]], node_kubectl: Kubectl
) -> None:
    team = followed[1]["TEAM"]
    seen = node_kubectl("get", "agentruns", "-n", team, "--as", "bob", "-o", "name")
    assert seen.stdout.split() == ["agentrun.agentrun.dev/first-run"]
    run = {
        "apiVersion": "agentrun.dev/v1alpha1", "kind": "AgentRun", "metadata": {"name": "bobs"},
        "spec": {"model": "default-chat", "goal": "rectangle", "tools": ["calculate"]},
    }  # fmt: skip
    refused = node_kubectl("create", "-n", team, "--as", "bob", "-f", "-",
                           input=yaml.safe_dump(run), check=False)  # fmt: skip
    assert refused.returncode != 0 and "forbidden" in refused.stderr.lower(), refused.stderr
    approve = ("auth", "can-i", "approve", "agentruns.agentrun.dev", "--subresource=approval",
               "-n", team)  # fmt: skip
    assert node_kubectl(*approve, "--as", "alice", check=False).stdout.strip() == "no"
    assert node_kubectl(*approve, "--as", "carol", check=False).stdout.strip() == "yes"


def test_the_teams_quota_counts_its_runs(
    followed: tuple[Guide, dict[str, str]], node_kubectl: Kubectl
) -> None:
    """The guide's ResourceQuota bounds agentrun's objects in the team's namespace: the API
    server counts the AgentRun the guide created against it."""
    quota = json.loads(
        node_kubectl(
            "get", "resourcequota", "agentrun", "-n", followed[1]["TEAM"], "-o", "json"
        ).stdout
    )
    assert quota["status"]["hard"]["count/agentruns.agentrun.dev"] == "2k"  # 2000, canonical
    assert quota["status"]["used"]["count/agentruns.agentrun.dev"] == "1"


def test_the_upgrade_applied_the_crds_and_rolled_a_second_revision(
    followed: tuple[Guide, dict[str, str]], node_kubectl: Kubectl
) -> None:
    history = followed[0].output["install"].rsplit("helm -n", 1)[-1]
    assert "Upgrade complete" in history
    releases = objects(node_kubectl, "secrets", "-n", followed[1]["NS"], "-l", "owner=helm")
    assert sorted(s["metadata"]["labels"]["version"] for s in releases) == ["1", "2"]


def test_uninstall_keeps_the_crds_the_runs_and_the_hooks_secrets_then_all_goes(
    followed: tuple[Guide, dict[str, str]], node_kubectl: Kubectl
) -> None:
    guide_run, env = followed
    guide_run.run("uninstall", guide_run.uninstall[:1])
    assert node_kubectl("get", "crd", "agentruns.agentrun.dev", check=False).returncode == 0
    kept = node_kubectl("get", "agentruns", "-n", env["TEAM"], "-o", "name").stdout.split()
    assert kept == ["agentrun.agentrun.dev/first-run"]
    secrets = {s["metadata"]["name"] for s in objects(node_kubectl, "secrets", "-n", env["NS"])}
    assert HOOK_SECRETS | {"model-api-key"} <= secrets
    assert "agentrun-nats-tls" not in secrets  # the chart's own, gone with the release
    left = node_kubectl("get", "deploy,statefulset,service,pdb", "-n", env["NS"], "-o", "name")
    assert left.stdout == ""
    guide_run.run("remove everything", guide_run.uninstall[1:])
    assert node_kubectl("get", "crd", "agentruns.agentrun.dev", check=False).returncode != 0
    for kind, name in (("namespace", env["NS"]), ("namespace", env["TEAM"]),
                       ("priorityclass", "agentrun")):  # fmt: skip
        assert node_kubectl("get", kind, name, check=False).returncode != 0, (kind, name)
