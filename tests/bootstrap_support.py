"""The closed bus's credentials and the run-signing keys brought the way a platform team that
keeps keys out of the cluster's hooks would: ``agentrun nats bootstrap`` and ``agentrun signing
bootstrap`` run from the test machine against an API server, and the chart's values name the
Secrets they made (docs/closed-bus.md, "Credentials: made, mounted, rotated")."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from agentrun_dev.kubectl import Kubectl


def bootstrap(kubectl: Kubectl, kind: str, namespace: str, prefix: str) -> str:
    """Run ``agentrun <kind> bootstrap --namespace namespace --prefix prefix`` here against
    the API server (``kind``: ``nats`` or ``signing``); what it printed. Fails the test when it
    fails, with its stderr."""
    agentrun = Path(sys.executable).with_name("agentrun")
    made = subprocess.run(
        [str(agentrun), kind, "bootstrap", f"--namespace={namespace}", f"--prefix={prefix}"],
        env=kubectl.env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert made.returncode == 0, made.stderr
    return made.stdout


def bring_nats_credentials(kubectl: Kubectl, namespace: str, prefix: str) -> list[str]:
    """The closed bus's users made by ``agentrun nats bootstrap`` (``bootstrap``); the ``--set``
    pairs naming the Secrets it made (operator, workers, server)."""
    bootstrap(kubectl, "nats", namespace, prefix)
    return [f"nats.auth.{key}Secret={prefix}-{key}" for key in ("operator", "worker", "server")]


def bring_run_signing_keys(kubectl: Kubectl, namespace: str, prefix: str) -> list[str]:
    """The run-signing keys made by ``agentrun signing bootstrap`` (``bootstrap``); the
    ``--set`` pairs naming the Secrets it made (signing, trust)."""
    printed = bootstrap(kubectl, "signing", namespace, prefix)
    assert printed == f"created or updated: {prefix}-signing, {prefix}-trust\n"
    return [f"runSigning.{key}Secret={prefix}-{key}" for key in ("signing", "trust")]
