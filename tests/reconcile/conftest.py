"""Fixtures of the operator's tests that meet the real API server through its port."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio import config as k8s_config

from agentrun.operator.platform.kubeapi import ApiError, Kube


@pytest.fixture
async def kube(control_plane: Any, crds: list[str]) -> AsyncIterator[Kube]:
    """The port's adapter on the test control plane, once it serves the CRDs (right after they
    are established it answers 429 for a moment)."""
    configuration = k8s.Configuration()
    await k8s_config.load_kube_config(
        config_file=str(control_plane.kubeconfig), client_configuration=configuration
    )
    api = Kube(k8s.ApiClient(configuration))
    for attempt in range(60):
        try:
            await api.list_objects("agents")
            await api.list_objects("agentruns")
            break
        except ApiError as err:
            if err.status != 429 or attempt == 59:
                raise
            await asyncio.sleep(0.5)
    try:
        yield api
    finally:
        await api.close()
