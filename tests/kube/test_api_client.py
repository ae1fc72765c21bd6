"""``kube.api_client``: with ``trust_env=False`` (the operator's and the worker's client) no
proxy from the environment and no ``.netrc`` credentials are used; by default (the CLI's) both
are, as ``kubernetes_asyncio`` does. Against a real HTTP server standing in for the API server
(``/version/``), through the client's own request path."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from http_support import loopback_kubeconfig, serving
from kubernetes_asyncio import client

from agentrun import kube

VERSION = {
    "major": "1",
    "minor": "34",
    "gitVersion": "v1.34.4",
    "gitCommit": "0",
    "gitTreeState": "clean",
    "buildDate": "2026-01-01T00:00:00Z",
    "goVersion": "go1.24",
    "compiler": "gc",
    "platform": "linux/amd64",
}


def _closed_port() -> int:
    """A loopback port nothing listens on (a proxy that is not there)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
async def apiserver(tmp_path: Path) -> AsyncIterator[tuple[Path, list[str | None]]]:
    """A kubeconfig for a plain-HTTP ``/version`` server on loopback, and the ``Authorization``
    header of each request that server saw."""
    seen: list[str | None] = []

    async def version(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Authorization"))
        return web.json_response(VERSION)

    async with serving({"/version/": version}) as url:
        yield loopback_kubeconfig(tmp_path / "kubeconfig", url), seen


@pytest.fixture
def hostile_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A proxy that refuses connections for every URL, and a ``.netrc`` with credentials for
    the loopback API server."""
    proxy = f"http://127.0.0.1:{_closed_port()}"
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
        monkeypatch.setenv(name, proxy)
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    netrc = tmp_path / "netrc"
    netrc.write_text("machine 127.0.0.1 login alice password secret\n")
    netrc.chmod(0o600)
    monkeypatch.setenv("NETRC", str(netrc))


async def test_without_trust_env_neither_proxy_nor_netrc_is_used(
    apiserver: tuple[Path, list[str | None]], hostile_env: None
) -> None:
    config, seen = apiserver
    api = await kube.api_client(config_file=str(config), trust_env=False)
    try:
        version = await client.VersionApi(api).get_code()
        assert version.git_version == "v1.34.4"
        assert seen == [None]  # reached directly, and no .netrc credentials sent
        assert api.rest_client.pool_manager.trust_env is False
    finally:
        await api.close()
    assert api.rest_client.pool_manager.closed
    assert api.rest_client.pool_manager.connector is None  # closed with its session


async def test_by_default_the_environment_proxy_is_used(
    apiserver: tuple[Path, list[str | None]], hostile_env: None
) -> None:
    config, seen = apiserver
    api = await kube.api_client(config_file=str(config))
    try:
        with pytest.raises(aiohttp.ClientConnectionError):
            await client.VersionApi(api).get_code()
        assert seen == []  # sent to the (absent) proxy
    finally:
        await api.close()


async def test_by_default_netrc_credentials_are_sent(
    apiserver: tuple[Path, list[str | None]], hostile_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
        monkeypatch.delenv(name)
    config, seen = apiserver
    api = await kube.api_client(config_file=str(config))
    try:
        await client.VersionApi(api).get_code()
    finally:
        await api.close()
    assert seen == ["Basic YWxpY2U6c2VjcmV0"]  # alice:secret
