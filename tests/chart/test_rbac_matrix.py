"""Least privilege, shown: what every ServiceAccount the chart creates may do, as the real API
server answers ``kubectl auth can-i --list``, in the install namespace and in a tenant
namespace, for the default values and for a tenant namespace listed in the values. Hook
accounts count: the NATS and run-signing bootstrap hooks' exist during every install and
upgrade (and stay after a failed one). The answer must equal the committed table `MATRIX`
(``rbac_matrix.txt`` beside this file); a difference fails and prints the diff.

The table is kubectl's listing normalised: one row per resource (or non-resource URL) and
resource names, the verbs of every rule for it merged and sorted, the chart's object-name
prefix written as ``agentrun``. It includes what every authenticated identity may do
(discovery, self-reviews): the API server's defaults are part of what the account can do.
After a deliberate change of the chart's RBAC, rewrite it with
``AGENTRUN_UPDATE_RBAC_MATRIX=1 pytest tests/chart/test_rbac_matrix.py`` (the run still fails,
saying so) and review the diff before committing."""

from __future__ import annotations

import difflib
import os
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from chart_support import CHART_DIR, documents

from agentrun_dev import helm
from agentrun_dev.kubectl import Kubectl, create_namespace, delete_namespace

pytestmark = pytest.mark.e2e

MATRIX = Path(__file__).with_name("rbac_matrix.txt")
UPDATE = "AGENTRUN_UPDATE_RBAC_MATRIX"
TENANT = "<tenant>"
"""Stands for the tenant namespace's name in `VALUE_SETS`."""
VALUE_SETS: dict[str, dict[str, str]] = {
    "defaults": {},
    "tenant namespace listed": {
        "rbac.kubernetesGetNamespaces": f"{{{TENANT}}}",
        "rbac.toolServerSecretNamespaces": f"{{{TENANT}}}",
    },
}
"""Named ``--set`` values the matrix is taken for."""
RBAC_KINDS = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
USER_ROLES = ("view", "edit", "approve", "admin")
"""The people's ClusterRoles, each bound in a team namespace to a user of its own (for the
default values): what a team member with that role may do there."""
_ROW = re.compile(r"^\s*(\S*)\s+\[(.*?)\]\s+\[(.*?)\]\s+\[(.*?)\]\s*$")
_HEADER = f"""\
# `kubectl auth can-i --list --as system:serviceaccount:<namespace>:<account>` for every
# ServiceAccount the chart creates, against a real API server: one row per resource (or
# non-resource URL) and resource names, with the verbs of every rule for it merged. Checked by
# tests/chart/test_rbac_matrix.py; regenerate with {UPDATE}=1 and review the diff.
"""


def can_i_list(kubectl: Kubectl, account: str, namespace: str) -> list[tuple[str, str, str]]:
    """``kubectl auth can-i --list`` as `account` in `namespace`, normalised: sorted rows of
    (resource or URL, resource names, verbs), each merged over every rule that names it."""
    output = kubectl(
        "auth", "can-i", "--list", "--no-headers", "--as", account, "-n", namespace
    ).stdout
    merged: dict[tuple[str, str], set[str]] = {}
    for line in output.splitlines():
        if not line.strip():
            continue
        match = _ROW.match(line)
        assert match is not None, f"unexpected kubectl auth can-i --list line: {line!r}"
        resource, urls, names, verbs = match.groups()
        key = (resource or urls, " ".join(sorted(names.split())) or "-")
        merged.setdefault(key, set()).update(verbs.split())
    return sorted((what, names, " ".join(sorted(verbs))) for (what, names), verbs in merged.items())


def render_table(rows: list[tuple[str, str, str]], *, title: str) -> str:
    """One section of the matrix: a ``## title`` line and aligned rows."""
    header = ("RESOURCE", "RESOURCE NAMES", "VERBS")
    width = [max(len(row[i]) for row in [header, *rows]) for i in range(2)]
    lines = [f"## {title}"] + [
        f"{what:<{width[0]}}  {names:<{width[1]}}  {verbs}".rstrip()
        for what, names, verbs in [header, *rows]
    ]
    return "\n".join(lines) + "\n"


@pytest.fixture
def tenant_namespace(kubectl: Kubectl) -> Iterator[str]:
    """A second fresh namespace, standing for a tenant's."""
    name = create_namespace(kubectl, prefix="agentrun-tenant-")
    yield name
    delete_namespace(kubectl, name)


def applied_accounts(
    offline_helm: helm.Helm, kubectl: Kubectl, *, namespace: str, values: dict[str, str]
) -> tuple[str, list[str], list[dict[str, Any]]]:
    """The chart's RBAC objects rendered with `values` under a fresh ``fullnameOverride`` and
    applied for real: (the prefix, the names of its ServiceAccounts, the applied objects)."""
    prefix = f"ar{uuid.uuid4().hex[:8]}"
    rendered = offline_helm.template(
        CHART_DIR, namespace=namespace, values={"fullnameOverride": prefix, **values}
    )
    docs = [d for d in documents(rendered) if d["kind"] in RBAC_KINDS]
    kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs))
    accounts = sorted(d["metadata"]["name"] for d in docs if d["kind"] == "ServiceAccount")
    return prefix, accounts, docs


def user_role_sections(kubectl: Kubectl, namespace: str, *, prefix: str) -> list[str]:
    """A section per user role (``<prefix>-view`` …), bound with a RoleBinding in
    `namespace` to a user of its own."""
    sections = []
    for role in USER_ROLES:
        user = f"agentrun-{role}-user"
        kubectl("create", "rolebinding", user, f"--clusterrole={prefix}-{role}", f"--user={user}",
                "-n", namespace)  # fmt: skip
        rows = can_i_list(kubectl, user, namespace)
        title = f"values: defaults · user role: agentrun-{role}"
        sections.append(render_table(rows, title=title))
    return sections


def test_every_service_account_may_do_exactly_what_the_committed_matrix_lists(
    offline_helm: helm.Helm,
    kubectl: Kubectl,
    crds: list[str],
    test_namespace: str,
    tenant_namespace: str,
) -> None:
    sections = []
    for name, values in VALUE_SETS.items():
        prefix, accounts, docs = applied_accounts(
            offline_helm,
            kubectl,
            namespace=test_namespace,
            values={k: v.replace(TENANT, tenant_namespace) for k, v in values.items()},
        )
        try:
            for account in accounts:
                user = f"system:serviceaccount:{test_namespace}:{account}"
                for where, namespace in (("install", test_namespace), ("tenant", tenant_namespace)):
                    rows = [
                        (what, names.replace(prefix, "agentrun"), verbs)
                        for what, names, verbs in can_i_list(kubectl, user, namespace)
                    ]
                    title = (
                        f"values: {name} · account: {account.replace(prefix, 'agentrun')}"
                        f" · namespace: {where}"
                    )
                    sections.append(render_table(rows, title=title))
            if not values:
                sections += user_role_sections(kubectl, tenant_namespace, prefix=prefix)
        finally:
            for doc in docs:
                if doc["kind"] in ("ClusterRole", "ClusterRoleBinding"):
                    kubectl("delete", doc["kind"].lower(), doc["metadata"]["name"])
    actual = _HEADER + "".join(f"\n{section}" for section in sections)

    if os.environ.get(UPDATE):
        MATRIX.write_text(actual)
        pytest.fail(f"{UPDATE} is set: wrote {MATRIX.name}; review its diff, unset it, rerun")
    expected = MATRIX.read_text()
    diff = "".join(
        difflib.unified_diff(
            expected.splitlines(keepends=True),
            actual.splitlines(keepends=True),
            fromfile=f"{MATRIX.name} (committed)",
            tofile="kubectl auth can-i --list (now)",
        )
    )
    assert actual == expected, f"the chart's RBAC differs from {MATRIX.name}:\n{diff}"
