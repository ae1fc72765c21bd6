"""Kubernetes client set-up shared by operator and worker (kubernetes_asyncio).

Loads ``KUBECONFIG`` (or ``~/.kube/config``) when present, else the in-cluster service account.
"""

from __future__ import annotations

import os

from kubernetes_asyncio import client, config
from kubernetes_asyncio.config.config_exception import ConfigException

GROUP = "agentrun.dev"
VERSION = "v1alpha1"
RUNS = "agentruns"
MODELS = "agentmodels"
TENANTS = "agenttenants"
AGENTS = "agents"


async def api_client() -> client.ApiClient:
    """A configured ``ApiClient``; raises ``ConfigException`` when no configuration is found."""
    path = os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")
    if os.path.exists(path):
        await config.load_kube_config(config_file=path)
    else:
        try:
            config.load_incluster_config()  # type: ignore[no-untyped-call]
        except ConfigException as err:
            raise ConfigException(f"no kubeconfig at {path} and not in a cluster: {err}") from err
    return client.ApiClient()
