"""Kubernetes client set-up shared by operator and worker (kubernetes_asyncio).

Loads ``KUBECONFIG`` (or ``~/.kube/config``) when present, else the in-cluster service account.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Awaitable, Collection
from typing import Any

import aiohttp
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.config.config_exception import ConfigException

from agentrun import display

GROUP = "agentrun.dev"
VERSION = "v1alpha1"
RUNS = "agentruns"
MODELS = "agentmodels"
TENANTS = "agenttenants"
AGENTS = "agents"
EVALS = "agentevals"


REQUEST_TIMEOUT = aiohttp.ClientTimeout(sock_connect=10.0, sock_read=75.0)
"""Bounds on a request of the operator's and the worker's clients that sets none of its own:
10 s to open a connection, 75 s between reads of its answer (the API server answers a
request that is not a watch within its own ``--request-timeout``, 1 minute by default, or
says it timed out). ``kubernetes_asyncio`` sets no bound at all: a request whose connection
died without a reset (a black-holed route, a NAT entry gone) waited for ever, and so did the
part of the operator awaiting it (a status write, an admission). Raised as
``aiohttp.ServerTimeoutError`` (an ``aiohttp.ClientError``)."""


class TimedApiClient(client.ApiClient):
    """An ``ApiClient`` whose every call that sets no ``_request_timeout`` of its own gets
    ``request_timeout``: for clients that never watch or follow a stream (which a bound
    between reads would cut while the stream is quiet)."""

    def __init__(self, request_timeout: aiohttp.ClientTimeout) -> None:
        super().__init__()
        self.request_timeout = request_timeout

    def call_api(self, *args: Any, **kwargs: Any) -> Any:
        """``ApiClient.call_api`` with ``_request_timeout`` defaulted (the generated API
        methods pass it by keyword, ``None`` when the caller gave none)."""
        if kwargs.get("_request_timeout") is None:
            kwargs["_request_timeout"] = self.request_timeout
        return super().call_api(*args, **kwargs)


async def api_client(
    *,
    config_file: str | None = None,
    context: str | None = None,
    trust_env: bool = True,
    request_timeout: aiohttp.ClientTimeout | None = None,
) -> client.ApiClient:
    """A configured ``ApiClient``: the kubeconfig ``config_file`` (else ``KUBECONFIG``, else
    ``~/.kube/config``) with its ``context`` (else its current one), else the in-cluster
    credentials. Raises ``ConfigException`` when no configuration is found, when a
    ``config_file`` or ``context`` is asked for and there is no such file, or no such context.

    ``trust_env=False`` (the operator, the worker): the client does not read ``HTTPS_PROXY``,
    ``NO_PROXY`` or ``~/.netrc``, as kopf's own client does not (its default). With it on
    (``kubernetes_asyncio``'s fixed choice, kept for the CLI, as ``kubectl`` honours a proxy)
    aiohttp looks both up on a thread for every request: two thread hand-offs per API call.
    A kubeconfig's ``proxy-url`` is sent either way.

    ``request_timeout`` (``REQUEST_TIMEOUT`` for the operator and the worker, which never
    watch through this client): every call setting no timeout of its own gets it
    (``TimedApiClient``); ``None``: none (``kubernetes_asyncio``'s default).
    """
    path = config_file or os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")
    if os.path.exists(path):
        await config.load_kube_config(config_file=path, context=context)
    elif config_file is not None or context is not None:
        raise ConfigException(f"no kubeconfig at {path}")
    else:
        try:
            config.load_incluster_config()  # type: ignore[no-untyped-call]
        except ConfigException as err:
            raise ConfigException(f"no kubeconfig at {path} and not in a cluster: {err}") from err
    api = client.ApiClient() if request_timeout is None else TimedApiClient(request_timeout)
    if not trust_env:
        _ignore_environment(api)
    return api


def _ignore_environment(api: client.ApiClient) -> None:
    """Give ``api`` an aiohttp session with ``trust_env=False`` on the same connector (pool
    and TLS context): ``kubernetes_asyncio`` fixes ``trust_env=True`` and offers no option."""
    rest = api.rest_client
    session: aiohttp.ClientSession = rest.pool_manager
    rest.pool_manager = aiohttp.ClientSession(
        connector=session.connector,
        trust_env=False,
        read_bufsize=2**21,  # as kubernetes_asyncio sets it: large objects' watch events
    )
    session.detach()  # the connector now belongs to the new session, which closes it


async def secret_values(
    core: client.CoreV1Api, *, namespace: str, name: str, keys: Collection[str]
) -> dict[str, str]:
    """The ``keys`` of Secret ``namespace/name`` with their decoded (UTF-8, stripped) values;
    the Secret's other keys are neither decoded nor returned.

    Every value read is added to ``display.KNOWN`` (this process's log lines never show it).
    Raises ``ApiException`` when the Secret cannot be read, ``ValueError`` (naming the key)
    when a key is missing or its value is not UTF-8 text.
    """
    secret = await core.read_namespaced_secret(name, namespace)
    data_of = secret.data or {}
    missing = sorted(set(keys) - set(data_of))
    if missing:
        raise ValueError(f"Secret {namespace}/{name} has no key {', '.join(map(repr, missing))}")
    values: dict[str, str] = {}
    for key in sorted(set(keys)):
        data = data_of[key]
        try:
            values[key] = base64.b64decode(data).decode().strip()
        except UnicodeDecodeError:
            raise ValueError(f"Secret {namespace}/{name} key {key!r} is not UTF-8 text") from None
        display.KNOWN.add(values[key])  # taken out of this process's logs from now on
    return values


async def raw_json(call: Awaitable[Any]) -> dict[str, Any]:
    """The JSON object answered to a client call made with ``_preload_content=False``, read
    without the client's decoding into its models (which parses every timestamp with dateutil:
    more CPU than the request itself, for calls made every second or per run). Raises
    ``ApiException`` (``status``, ``reason`` the body) on a status other than 2xx, as the
    decoding call would."""
    response = await call
    try:
        body = await response.read()
        if not 200 <= response.status <= 299:
            raise ApiException(status=response.status, reason=body.decode(errors="replace"))
    finally:
        response.release()
    found = json.loads(body) if body else {}
    return found if isinstance(found, dict) else {}
