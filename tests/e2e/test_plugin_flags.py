"""kubectl's global flags on ``kubectl agentrun``: ``--as``/``--as-group`` impersonate on the
dev stack's API server, which decides with the impersonated user's RBAC (the dev stack's
kubeconfig is a cluster admin, allowed to impersonate anyone)."""

from __future__ import annotations

import pytest
import yaml

from .conftest import E2EStack, run_manifest
from .test_kubectl_plugin import plugin

pytestmark = pytest.mark.e2e


def approver_role(namespace: str) -> str:
    """A Role that may read and decide the namespace's runs (``get``, ``patch`` on
    ``agentruns``; ``approve`` on ``agentruns/approval`` for the approval admission policy,
    where installed)."""
    return yaml.safe_dump(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "approver", "namespace": namespace},
            "rules": [
                {"apiGroups": ["agentrun.dev"], "resources": ["agentruns"],
                 "verbs": ["get", "patch"]},
                {"apiGroups": ["agentrun.dev"], "resources": ["agentruns/approval"],
                 "verbs": ["approve"]},
            ],
        }
    )  # fmt: skip


def test_approve_as_a_user_is_refused_without_the_right_and_applied_with_it(
    stack_: E2EStack, test_namespace: str
) -> None:
    stack_.apply(
        test_namespace, run_manifest("held", "E2E-APPROVAL held", approval={"tools": ["calculate"]})
    )
    status = stack_.wait_for(test_namespace, "held", lambda s: s.get("phase") == "AwaitingApproval")
    digest = status["pendingApproval"]["digest"]
    approve = ("approve", "held", "--digest", digest, "-n", test_namespace)

    # alice has no binding in the namespace: the API server's 403, nothing decided
    refused = plugin(stack_, *approve, "--as", "alice")
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "Error from server (Forbidden)" in refused.stderr
    assert 'User "alice" cannot get resource "agentruns"' in refused.stderr
    assert f'in the namespace "{test_namespace}"' in refused.stderr
    # flags before the command work too, and the kubeconfig's own identity is not used
    before = plugin(stack_, "--as", "alice", "get", "held", "-n", test_namespace)
    assert before.returncode == 1 and 'User "alice" cannot get' in before.stderr

    stack_.kubectl("apply", "-f", "-", input=approver_role(test_namespace))
    stack_.kubectl("create", "rolebinding", "approvers", "--role=approver", "--group=approvers",
                   "-n", test_namespace)  # fmt: skip
    # the binding names a group: alice alone still lacks the right
    alone = plugin(stack_, *approve, "--as", "alice")
    assert alone.returncode == 1 and "Forbidden" in alone.stderr
    assert (stack_.get(test_namespace, "held") or {})["status"]["phase"] == "AwaitingApproval"

    accepted = plugin(stack_, *approve, "--as", "alice", "--as-group", "approvers")
    assert accepted.returncode == 0, accepted.stderr
    assert f"approve: {digest} as alice" in accepted.stdout  # whoami answered as alice
    stack_.wait_for(test_namespace, "held", lambda s: s.get("phase") != "AwaitingApproval")
