"""``kube.api_client``: with ``trust_env=False`` (the operator's and the worker's client) no
proxy from the environment and no ``.netrc`` credentials are used; by default (the CLI's) both
are, as ``kubernetes_asyncio`` does. Against a real HTTP server standing in for the API server
(``/version/``), through the client's own request path."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from http_support import loopback_kubeconfig, serving
from kubernetes_asyncio import client

from agentrun import kube
from agentrun.operator.platform import kubeapi
from agentrun.worker import main as worker_main

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


SHORT = aiohttp.ClientTimeout(sock_connect=1.0, sock_read=1.0)
"""``kube.REQUEST_TIMEOUT`` shortened for the tests."""


@pytest.fixture
async def silent_apiserver(tmp_path: Path) -> AsyncIterator[Path]:
    """A kubeconfig for an API server that accepts connections and reads requests but never
    answers (as one behind a connection that died without a reset looks)."""

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            await reader.read()  # until the client gives up and closes

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        yield loopback_kubeconfig(tmp_path / "kubeconfig", url)
    finally:
        server.close()


async def test_a_request_never_answered_times_out_at_the_bound(silent_apiserver: Path) -> None:
    """Before, ``kubernetes_asyncio`` waited for ever (it sets no timeout of its own), and so
    did the operator's status write or admission awaiting it."""
    api = await kube.api_client(
        config_file=str(silent_apiserver), trust_env=False, request_timeout=SHORT
    )
    try:
        start = time.monotonic()
        with pytest.raises(aiohttp.ServerTimeoutError):
            await client.VersionApi(api).get_code()
        assert time.monotonic() - start < 5
        start = time.monotonic()
        with pytest.raises(TimeoutError):  # a call's own timeout wins
            await client.VersionApi(api).get_code(_request_timeout=aiohttp.ClientTimeout(total=0.1))
        assert time.monotonic() - start < 0.8
    finally:
        await api.close()


async def test_the_operator_s_api_calls_are_bounded(
    silent_apiserver: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``Kube.connect`` (every API call of the operator) and the worker's client use
    ``kube.REQUEST_TIMEOUT``: an unanswered read is an ``ApiError`` with status 0, which the
    operator retries as a lost connection."""
    monkeypatch.setenv("KUBECONFIG", str(silent_apiserver))
    monkeypatch.setattr(kube, "REQUEST_TIMEOUT", SHORT)
    api = await kubeapi.Kube.connect()
    try:
        with pytest.raises(kubeapi.ApiError) as caught:
            await api.get(kubeapi.Ref(kube.RUNS, "r", "ns"))
        assert caught.value.status == 0
        assert "SocketTimeoutError" in str(caught.value)
    finally:
        await api.close()
    worker_api = await worker_main._kube_api()
    assert isinstance(worker_api, kube.TimedApiClient)
    try:
        with pytest.raises(aiohttp.ServerTimeoutError):
            await client.CoreV1Api(worker_api).read_namespaced_secret("key", "ns")
    finally:
        await worker_api.close()
