"""The closed bus's credentials and the run-signing keys brought the way a platform team that
keeps keys out of the cluster's hooks would: ``agentrun nats bootstrap`` and ``agentrun signing
bootstrap`` run from the test machine against an API server, and the chart's values name the
Secrets they made (docs/closed-bus.md, "Credentials: made, mounted, rotated")."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from agentrun_dev.kubectl import Kubectl


def bring_nats_credentials(kubectl: Kubectl, namespace: str, prefix: str) -> list[str]:
    """Run ``agentrun nats bootstrap --namespace namespace --prefix prefix`` here against the
    API server; the ``--set`` pairs naming the Secrets it made (operator, workers, server)."""
    agentrun = Path(sys.executable).with_name("agentrun")
    made = subprocess.run(
        [str(agentrun), "nats", "bootstrap", f"--namespace={namespace}", f"--prefix={prefix}"],
        env=kubectl.env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert made.returncode == 0, made.stderr
    return [f"nats.auth.{key}Secret={prefix}-{key}" for key in ("operator", "worker", "server")]


def bring_run_signing_keys(kubectl: Kubectl, namespace: str, prefix: str) -> list[str]:
    """Run ``agentrun signing bootstrap --namespace namespace --prefix prefix`` here against
    the API server; the ``--set`` pairs naming the Secrets it made (signing, trust)."""
    agentrun = Path(sys.executable).with_name("agentrun")
    made = subprocess.run(
        [str(agentrun), "signing", "bootstrap", f"--namespace={namespace}", f"--prefix={prefix}"],
        env=kubectl.env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert made.returncode == 0, made.stderr
    assert made.stdout == f"created or updated: {prefix}-signing, {prefix}-trust\n"
    return [f"runSigning.{key}Secret={prefix}-{key}" for key in ("signing", "trust")]
