"""The chart's user roles and approval policy, judged by the suite's real API server with
impersonated users (``kubectl --as``), as a platform team would check them: a viewer reads but
cannot patch a run; an editor creates and cancels runs but cannot approve a held call; an
approver approves, naming themselves as the reviewer, and cannot name anyone else.

The roles are bound in a namespace with RoleBindings (each role lists its rules in full: the
suite's control plane runs no clusterrole-aggregation controller). The admission policy is
removed again after the module: other tests on the same API server annotate runs as the admin.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from chart_support import CHART_DIR, documents

from agentrun_dev import helm
from agentrun_dev.kubectl import Kubectl, create_namespace, delete_namespace

pytestmark = pytest.mark.e2e

ROLES = ("agentrun-view", "agentrun-edit", "agentrun-approve", "agentrun-admin")
USERS = {"vera": "agentrun-view", "eddie": "agentrun-edit", "ada": "agentrun-approve"}
DIGEST = "0" * 64


@pytest.fixture(scope="module")
def installed(offline_helm: helm.Helm, kubectl: Kubectl) -> Iterator[list[dict[str, Any]]]:
    """The chart's ClusterRoles and its ValidatingAdmissionPolicy with its binding, applied
    (rendered as ``helm template`` does); deleted afterwards."""
    docs = [
        d
        for d in documents(offline_helm.template(CHART_DIR))
        if (d["kind"] == "ClusterRole" and d["metadata"]["name"] in ROLES)
        or d["kind"].startswith("ValidatingAdmissionPolicy")
    ]
    kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs))
    yield docs
    for doc in docs:
        kubectl("delete", doc["kind"], doc["metadata"]["name"], "--ignore-not-found")


@pytest.fixture
def team(kubectl: Kubectl, crds: Any, installed: list[dict[str, Any]]) -> Iterator[str]:
    """A namespace with a run (created by the admin) and each user bound to their role."""
    namespace = create_namespace(kubectl, prefix="agentrun-roles-")
    for user, role in USERS.items():
        kubectl("create", "rolebinding", user, f"--clusterrole={role}", f"--user={user}",
                "-n", namespace)  # fmt: skip
    run = {
        "apiVersion": "agentrun.dev/v1alpha1",
        "kind": "AgentRun",
        "metadata": {"name": "held"},
        "spec": {"model": "mock", "goal": "g", "tools": ["calculate"]},
    }
    kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(run))
    wait_admission_policy(kubectl, namespace)
    yield namespace
    delete_namespace(kubectl, namespace)


def wait_admission_policy(kubectl: Kubectl, namespace: str, *, attempts: int = 60) -> None:
    """The API server enforces a new policy within about a second (its informer): wait until
    an annotation naming no reviewer is refused."""
    for _ in range(attempts):
        probe = kubectl("annotate", "agentrun", "held", "-n", namespace, "--dry-run=server",
                        f"agentrun.dev/approve={DIGEST}", check=False)  # fmt: skip
        if probe.returncode != 0 and "agentrun-approval" in probe.stderr:
            return
        kubectl("get", "validatingadmissionpolicy", "agentrun-approval")  # a beat, and it exists
    raise AssertionError("the agentrun-approval policy was never enforced")


def annotate(kubectl: Kubectl, namespace: str, user: str, *pairs: str) -> Any:
    return kubectl("annotate", "agentrun", "held", "-n", namespace, "--overwrite",
                   f"--as={user}", *pairs, check=False)  # fmt: skip


def annotations(kubectl: Kubectl, namespace: str) -> dict[str, str]:
    run = json.loads(kubectl("get", "agentrun", "held", "-n", namespace, "-o", "json").stdout)
    found: dict[str, str] = run["metadata"].get("annotations") or {}
    return found


def can(kubectl: Kubectl, user: str, namespace: str, verb: str, resource: str) -> bool:
    """``kubectl auth can-i`` (a ``resource/subresource`` is asked with ``--subresource``)."""
    plural, _, sub = resource.partition("/")
    extra = [f"--subresource={sub}"] if sub else []
    answer = kubectl("auth", "can-i", verb, f"{plural}.agentrun.dev", *extra, "-n", namespace,
                     f"--as={user}", check=False)  # fmt: skip
    return answer.stdout.strip() == "yes"


def test_a_viewer_reads_runs_but_cannot_patch_them(kubectl: Kubectl, team: str) -> None:
    listed = kubectl("get", "agentruns", "-n", team, "--as=vera", "-o", "name")
    assert listed.stdout.split() == ["agentrun.agentrun.dev/held"]
    refused = annotate(kubectl, team, "vera", "agentrun.dev/cancel=true")
    assert refused.returncode != 0 and "Forbidden" in refused.stderr
    assert "agentrun.dev/cancel" not in annotations(kubectl, team)
    assert not can(kubectl, "vera", team, "approve", "agentruns/approval")


def test_an_editor_cancels_but_cannot_approve(kubectl: Kubectl, team: str) -> None:
    cancelled = annotate(kubectl, team, "eddie", "agentrun.dev/cancel=true")
    assert cancelled.returncode == 0, cancelled.stderr
    assert can(kubectl, "eddie", team, "create", "agentruns")
    assert not can(kubectl, "eddie", team, "approve", "agentruns/approval")
    for verb in ("approve", "deny"):
        refused = annotate(kubectl, team, "eddie", f"agentrun.dev/{verb}={DIGEST}",
                           "agentrun.dev/reviewer=eddie")  # fmt: skip
        assert refused.returncode != 0
        assert "needs the verb approve on agentruns/approval" in refused.stderr
        assert "eddie does not have" in refused.stderr
    assert not {"agentrun.dev/approve", "agentrun.dev/deny"} & set(annotations(kubectl, team))


def test_an_approver_approves_naming_themselves_and_no_one_else(
    kubectl: Kubectl, team: str
) -> None:
    assert can(kubectl, "ada", team, "approve", "agentruns/approval")
    unnamed = annotate(kubectl, team, "ada", f"agentrun.dev/approve={DIGEST}")
    assert unnamed.returncode != 0 and "set agentrun.dev/reviewer to your own" in unnamed.stderr
    forged = annotate(kubectl, team, "ada", f"agentrun.dev/approve={DIGEST}",
                      "agentrun.dev/reviewer=someone-else")  # fmt: skip
    assert forged.returncode != 0 and "(ada)" in forged.stderr
    approved = annotate(kubectl, team, "ada", f"agentrun.dev/approve={DIGEST}",
                        "agentrun.dev/reviewer=ada")  # fmt: skip
    assert approved.returncode == 0, approved.stderr
    found = annotations(kubectl, team)
    assert (found["agentrun.dev/approve"], found["agentrun.dev/reviewer"]) == (DIGEST, "ada")
    # an editor cannot rewrite the reviewer of a decision that waits to be read
    rewritten = annotate(kubectl, team, "eddie", "agentrun.dev/reviewer=eddie")
    assert rewritten.returncode != 0 and "agentruns/approval" in rewritten.stderr
    # nor strip it (the operator would record ada's approval as nobody's), nor strip the
    # decision and leave ada's name on whatever is set next; the approver cannot strip it either
    for user, pair in (("eddie", "agentrun.dev/reviewer-"), ("eddie", "agentrun.dev/approve-"),
                       ("ada", "agentrun.dev/reviewer-")):  # fmt: skip
        stripped = annotate(kubectl, team, user, pair)
        assert stripped.returncode != 0, f"{user} {pair}: {stripped.stdout}"
    found = annotations(kubectl, team)
    assert (found["agentrun.dev/approve"], found["agentrun.dev/reviewer"]) == (DIGEST, "ada")
    # removing the decision once read (as the operator does) is not a decision
    removed = kubectl("annotate", "agentrun", "held", "-n", team, "agentrun.dev/approve-",
                      "agentrun.dev/reviewer-")  # fmt: skip
    assert removed.returncode == 0
    assert not {"agentrun.dev/approve", "agentrun.dev/reviewer"} & set(annotations(kubectl, team))


def test_a_run_created_with_a_decision_needs_the_approve_permission(
    kubectl: Kubectl, team: str
) -> None:
    run = {
        "apiVersion": "agentrun.dev/v1alpha1",
        "kind": "AgentRun",
        "metadata": {"name": "preapproved", "annotations": {"agentrun.dev/approve": DIGEST,
                                                            "agentrun.dev/reviewer": "eddie"}},
        "spec": {"model": "mock", "goal": "g", "tools": ["calculate"]},
    }  # fmt: skip
    refused = kubectl("apply", "-n", team, "--as=eddie", "-f", "-", input=yaml.safe_dump(run),
                      check=False)  # fmt: skip
    assert refused.returncode != 0 and "agentruns/approval" in refused.stderr
    del run["metadata"]["annotations"]
    created = kubectl("apply", "-n", team, "--as=eddie", "-f", "-", input=yaml.safe_dump(run))
    assert created.returncode == 0


def test_the_roles_aggregate_into_the_built_in_ones_where_they_fit(
    installed: list[dict[str, Any]],
) -> None:
    labels = {
        d["metadata"]["name"]: {
            k.rsplit("/", 1)[-1]
            for k, v in d["metadata"]["labels"].items()
            if k.startswith("rbac.authorization.k8s.io/aggregate-to-") and v == "true"
        }
        for d in installed
        if d["kind"] == "ClusterRole"
    }
    assert labels == {
        "agentrun-view": {"aggregate-to-view"},
        "agentrun-edit": {"aggregate-to-edit"},
        "agentrun-approve": {"aggregate-to-admin"},
        "agentrun-admin": set(),  # prices and budgets: the platform team's alone
    }
