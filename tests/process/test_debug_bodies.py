"""At ``AGENTRUN_LOG_LEVEL=DEBUG`` no library writes what it read or sent to the log: the
Kubernetes client logs every response body at DEBUG, a Secret's ``data`` (base64, which the
redaction of the values read does not match) among them — every tenant's model keys and tool
server headers that process read. ``process.quiet_libraries`` keeps such loggers at WARNING
whatever the level."""

from __future__ import annotations

import base64
import io
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web
from http_support import loopback_kubeconfig, serving
from kubernetes_asyncio import client

from agentrun import kube, process

VALUE = "sk-tenant-a-0123456789abcdef\n"
"""A Secret value as ``kubectl create secret --from-file`` stores it (a final line break)."""


@pytest.fixture
async def kubeconfig(tmp_path: Path) -> AsyncIterator[Path]:
    """A plain-HTTP API server on loopback answering one Secret, ``a/key``."""
    encoded = base64.b64encode(VALUE.encode()).decode()

    async def secret(request: web.Request) -> web.Response:
        meta = {"name": "key", "namespace": "a"}
        body = {"apiVersion": "v1", "kind": "Secret", "metadata": meta, "data": {"k": encoded}}
        return web.json_response(body)

    routes = {"/api/v1/namespaces/a/secrets/key": secret}
    async with serving(routes) as url:
        yield loopback_kubeconfig(tmp_path / "kubeconfig", url)


async def test_a_secret_read_at_debug_level_is_not_logged(kubeconfig: Path) -> None:
    root = logging.getLogger()
    written = io.StringIO()
    handler = logging.StreamHandler(written)
    process.bound_library_logs(handler)
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    process.quiet_libraries()
    api = await kube.api_client(config_file=str(kubeconfig), trust_env=False)
    try:
        read = await kube.secret_values(
            client.CoreV1Api(api), namespace="a", name="key", keys=["k"]
        )
    finally:
        await api.close()
        root.removeHandler(handler)
        root.setLevel(level)
        for name in process.QUIET_LOGGERS:
            logging.getLogger(name).setLevel(logging.NOTSET)
    assert read == {"k": VALUE.strip()}
    logged = written.getvalue()
    assert base64.b64encode(VALUE.encode()).decode() not in logged, logged
    assert "0123456789abcdef" not in logged, logged
