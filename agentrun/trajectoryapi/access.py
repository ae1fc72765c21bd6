"""Who is asking, and may they read this trajectory: the aggregated API's pure decisions.

The trajectory API is an *aggregated* API server (Kubernetes docs, "Configure the Aggregation
Layer"): users never reach it directly. The kube-apiserver authenticates them, authorises the
request, and proxies it with its own client certificate (``--proxy-client-cert-file``) and the
user in request headers (``X-Remote-User``, ``X-Remote-Group``, ``X-Remote-Extra-<key>``). This
server therefore believes those headers only from a client whose certificate chains to the
*request-header* CA and, when the cluster names them, carries one of the allowed common names
(both from ``kube-system/extension-apiserver-authentication``); then it asks a
SubjectAccessReview whether that user may ``get`` the trajectory (defence in depth: the
kube-apiserver authorised it too).

With no allowed names, Kubernetes' own aggregated servers believe any certificate the
request-header CA signed (``--requestheader-allowed-names``: "If empty, any client certificate
validated by the authorities in --requestheader-client-ca-file is allowed"). Where that CA is
also the cluster's client CA (``client-ca-file``: a hand-made cluster reusing one CA; kubeadm
makes a ``front-proxy-ca`` of its own and allows ``front-proxy-client`` only), every user's
client certificate would then be a front proxy, and one who reaches this server directly (a
Service in the cluster) could claim to be anyone. This server refuses to believe headers in
that configuration (`FrontProxy.untrusted`) unless its operator opted in.

What belongs here: the API's names, parsing the front proxy's configuration and request
headers, the SubjectAccessReview body and its verdict, the paths served, and every response
body (discovery documents, ``Status`` refusals, the trajectory object). Pure: no I/O.
What does not: TLS, HTTP and the Kubernetes and NATS calls (``server``).
"""

from __future__ import annotations

import dataclasses
import json
import re
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import serialization

GROUP = "trajectory.agentrun.dev"
VERSION = "v1alpha1"
GROUP_VERSION = f"{GROUP}/{VERSION}"
RESOURCE = "agentruntrajectories"
KIND = "AgentRunTrajectory"
VERBS = ("get",)
"""What the API offers: ``get`` of one run's trajectory (``?follow=true`` streams it)."""

CONFIGMAP_NAMESPACE = "kube-system"
CONFIGMAP_NAME = "extension-apiserver-authentication"
"""Where the kube-apiserver publishes its front-proxy (request-header) configuration."""


@dataclasses.dataclass(frozen=True, slots=True)
class FrontProxy:
    """The request-header configuration of the cluster: whom to believe, which headers."""

    client_ca: str
    """PEM bundle of the CA that signs the front proxy's client certificate."""
    allowed_names: frozenset[str]
    """Common names the front proxy's certificate may carry; empty: any the CA signed (unless
    `untrusted`)."""
    username_headers: tuple[str, ...]
    group_headers: tuple[str, ...]
    extra_prefixes: tuple[str, ...]
    shares_cluster_ca: bool = False
    """With no allowed names: the request-header CA bundle holds a certificate whose public
    key one of the cluster's client CA bundle (``client-ca-file``) holds too, so that a
    user's client certificate chains to it. Not looked at (False) when names are allowed."""
    trust_any_name: bool = False
    """The server's operator opted in (``--trust-any-front-proxy-certificate``) to believe
    any certificate of the request-header CA even when it `shares_cluster_ca`."""

    @classmethod
    def from_configmap(cls, data: Mapping[str, str], *, trust_any_name: bool = False) -> FrontProxy:
        """Parse ``extension-apiserver-authentication``'s ``data`` (its ``requestheader-*``
        keys hold JSON lists; ``client-ca-file`` the cluster's client CA bundle, read only
        when no name is allowed: `shares_cluster_ca`). Raises ``ValueError`` when it names no
        request-header CA (the kube-apiserver runs without ``--requestheader-client-ca-file``:
        no front proxy to trust), no user-name header, or, with no allowed names, a CA bundle
        that holds no PEM certificate."""
        ca = data.get("requestheader-client-ca-file", "").strip()
        if not ca:
            raise ValueError(
                f"{CONFIGMAP_NAMESPACE}/{CONFIGMAP_NAME} has no requestheader-client-ca-file: "
                "the kube-apiserver needs --requestheader-client-ca-file for aggregated APIs"
            )

        def names(key: str) -> tuple[str, ...]:
            value = json.loads(data.get(key) or "[]")
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ValueError(f"{key} is not a JSON list of strings: {value!r}")
            return tuple(value)

        allowed = frozenset(names("requestheader-allowed-names"))
        cluster_ca = data.get("client-ca-file", "").strip()
        proxy = cls(
            client_ca=ca,
            allowed_names=allowed,
            username_headers=names("requestheader-username-headers"),
            group_headers=names("requestheader-group-headers"),
            extra_prefixes=names("requestheader-extra-headers-prefix"),
            shares_cluster_ca=not allowed and bool(cluster_ca) and shares_a_key(ca, cluster_ca),
            trust_any_name=trust_any_name,
        )
        if not proxy.username_headers:
            raise ValueError("requestheader-username-headers is empty: no user can be named")
        return proxy

    def untrusted(self) -> str | None:
        """Why no request's ``X-Remote-*`` headers may be believed in this configuration, or
        None: no allowed names, a request-header CA that is also the cluster's client CA
        (`shares_cluster_ca`), and no opt-in. The message names the fix."""
        if self.allowed_names or not self.shares_cluster_ca or self.trust_any_name:
            return None
        return (
            f"the trajectory API does not believe its front proxy: {CONFIGMAP_NAMESPACE}/"
            f"{CONFIGMAP_NAME} allows any front-proxy name and its request-header CA is also "
            "the cluster's client CA, so any user's client certificate could claim to be "
            "anyone. Set the kube-apiserver's --requestheader-allowed-names to its front "
            "proxy's name (kubeadm: front-proxy-client), or give the front proxy a CA of its "
            "own (--requestheader-client-ca-file), then restart the trajectory server; or opt "
            "in with the chart value trajectoryApi.trustAnyFrontProxyCertificate "
            "(--trust-any-front-proxy-certificate)"
        )


def shares_a_key(bundle: str, other: str) -> bool:
    """Whether two PEM CA bundles hold a certificate each with the same public key (a
    certificate one's key signed verifies against the other too, whatever its subject or
    validity). Raises ``ValueError`` when either holds no PEM certificate."""

    def keys(pem: str) -> set[bytes]:
        return {
            cert.public_key().public_bytes(
                serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
            )
            for cert in x509.load_pem_x509_certificates(pem.encode())
        }

    return not keys(bundle).isdisjoint(keys(other))


@dataclasses.dataclass(frozen=True, slots=True)
class User:
    """The user the kube-apiserver authenticated, as its front proxy named them."""

    name: str
    groups: tuple[str, ...] = ()
    extra: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True, slots=True)
class Refusal:
    """A request refused: its HTTP status, Kubernetes ``reason`` and message."""

    code: int
    reason: str
    message: str
    retry_after: int | None = None
    """Seconds to wait before asking again (``Retry-After``, ``details.retryAfterSeconds``)."""

    def status(self) -> dict[str, Any]:
        """The ``meta/v1`` ``Status`` body kubectl prints. Its ``details.group`` names this
        API's group, so a client tells this server's ``404`` (a path it does not serve: a
        plugin newer than the server) from the kube-apiserver's (the group is not installed)."""
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "details": {
                "group": GROUP,
                "kind": RESOURCE,
                **({} if self.retry_after is None else {"retryAfterSeconds": self.retry_after}),
            },
            "code": self.code,
        }


Headers = Callable[[str], Sequence[str]]
"""Every value of a request header (case-insensitive name), in order; [] when absent."""
HeaderNames = Callable[[], Sequence[str]]


def authenticate(
    proxy: FrontProxy,
    *,
    peer_common_names: Sequence[str] | None,
    header: Headers,
    header_names: HeaderNames,
) -> User | Refusal:
    """The user of a request, or a 401 ``Unauthorized`` refusal: no certificate, a
    configuration whose headers cannot be believed (`FrontProxy.untrusted`), a name not
    allowed, or no user named.

    Args:
        proxy: the cluster's front-proxy configuration.
        peer_common_names: common names of the client certificate the TLS layer *verified*
            against ``proxy.client_ca``; None when the client presented none.
        header: the request's header values by name.
        header_names: every header name of the request (for the ``extra`` prefixes).
    """
    if peer_common_names is None:
        return Refusal(401, "Unauthorized", "a client certificate of the front proxy is required")
    if (why := proxy.untrusted()) is not None:
        return Refusal(401, "Unauthorized", why)
    if proxy.allowed_names and not proxy.allowed_names.intersection(peer_common_names):
        return Refusal(
            401,
            "Unauthorized",
            f"client certificate {list(peer_common_names)} is not an allowed front proxy",
        )
    name = next((v for h in proxy.username_headers for v in header(h) if v), "")
    if not name:
        return Refusal(401, "Unauthorized", "the front proxy named no user")
    groups = tuple(v for h in proxy.group_headers for v in header(h) if v)
    extra: dict[str, tuple[str, ...]] = {}
    names = {raw.lower(): raw for raw in header_names()}  # a repeated header: once
    for prefix in proxy.extra_prefixes:
        for lowered, raw in names.items():
            if lowered.startswith(prefix.lower()) and len(raw) > len(prefix):
                key = extra_key(lowered[len(prefix) :])
                extra[key] = extra.get(key, ()) + tuple(header(raw))
    return User(name=name, groups=groups, extra=extra)


def discovery_without_user(proxy: FrontProxy, *, peer_common_names: Sequence[str] | None) -> bool:
    """Whether a discovery document may be answered without believing the request's headers:
    only when they cannot be (`FrontProxy.untrusted`) and the TLS layer verified the client's
    certificate. The kube-apiserver's availability check and every client's discovery (the
    namespace controller's included: a group it cannot discover keeps namespaces from being
    deleted) still work, and they hold nothing a user cannot read through the kube-apiserver;
    trajectories are refused."""
    return peer_common_names is not None and proxy.untrusted() is not None


PERCENT_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")
"""A ``%`` that does not start an escape: the key is then taken as written."""


def extra_key(encoded: str) -> str:
    """The ``extra`` key an ``X-Remote-Extra-<key>`` header names: lower case, then
    %-decoded, as the kube-apiserver reads its own front proxy's headers (``headerrequest``:
    a header name cannot hold ``/``, so the proxy escapes a key such as
    ``authentication.kubernetes.io/credential-id``), so the access review asks about the user
    the kube-apiserver authorised. A key with a ``%`` that starts no escape is taken as
    written (Go's ``url.PathUnescape`` fails); bytes that are not UTF-8 become U+FFFD (as the
    kube-apiserver's JSON carries them to a webhook authoriser)."""
    if PERCENT_ESCAPE.search(encoded):
        return encoded
    return urllib.parse.unquote(encoded, errors="replace")


def access_review(user: User, *, namespace: str, name: str, verb: str = "get") -> dict[str, Any]:
    """The ``authorization.k8s.io/v1`` SubjectAccessReview asking whether ``user`` may ``verb``
    the trajectory ``namespace/name``."""
    return {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": user.name,
            "groups": list(user.groups),
            "extra": {k: list(v) for k, v in user.extra.items()},
            "resourceAttributes": {
                "group": GROUP,
                "version": VERSION,
                "resource": RESOURCE,
                "namespace": namespace,
                "name": name,
                "verb": verb,
            },
        },
    }


def authorize(
    user: User, review_status: Mapping[str, Any] | None, *, namespace: str, name: str
) -> Refusal | None:
    """None when the SubjectAccessReview's ``status`` allows; else a 403 ``Forbidden`` refusal
    worded as the kube-apiserver words its own (naming the resource and the namespace), with
    the authoriser's reason or evaluation error appended."""
    status = review_status or {}
    if status.get("allowed") is True and not status.get("denied"):
        return None
    why = status.get("reason") or status.get("evaluationError") or ""
    message = (
        f'{RESOURCE}.{GROUP} "{name}" is forbidden: User "{user.name}" cannot get resource '
        f'"{RESOURCE}" in API group "{GROUP}" in the namespace "{namespace}"'
    )
    return Refusal(403, "Forbidden", f"{message}: {why}" if why else message)


# --- paths and bodies ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Discovery:
    """A discovery document: ``level`` is ``apis``, ``group``, ``version``, or
    ``openapi/v2`` / ``openapi/v3`` (the kube-apiserver fetches both from every aggregated
    API; this one publishes no schema)."""

    level: str


@dataclasses.dataclass(frozen=True, slots=True)
class TrajectoryPath:
    """``/apis/<group>/<version>/namespaces/<namespace>/agentruntrajectories/<name>``."""

    namespace: str
    name: str


NAMESPACE_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
"""A namespace's name: an RFC 1123 label (Kubernetes' rule for namespaces)."""
OBJECT_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
"""An AgentRun's name: an RFC 1123 subdomain (Kubernetes' rule for object names)."""


def route(path: str) -> Discovery | TrajectoryPath | None:
    """What ``path`` asks for, or None (404). A trajectory's namespace and name must be valid
    Kubernetes names (``NAMESPACE_NAME``, ``OBJECT_NAME``): no other text, NATS's wildcards
    ``*`` and ``>`` included, ever reaches a subject."""
    parts = [p for p in path.split("/") if p]
    if parts in (["openapi", "v2"], ["openapi", "v3"]):
        return Discovery("/".join(parts))
    if parts == ["apis"]:
        return Discovery("apis")
    if parts == ["apis", GROUP]:
        return Discovery("group")
    if parts == ["apis", GROUP, VERSION]:
        return Discovery("version")
    prefix = ["apis", GROUP, VERSION, "namespaces"]
    if len(parts) == 7 and parts[:4] == prefix and parts[5] == RESOURCE:
        namespace, name = parts[4], parts[6]
        if NAMESPACE_NAME.fullmatch(namespace) and OBJECT_NAME.fullmatch(name):
            return TrajectoryPath(namespace=namespace, name=name)
    return None


def discovery(level: str) -> dict[str, Any]:
    """The discovery document of ``level`` (see `Discovery`)."""
    if level == "openapi/v2":
        info = {"title": "agentrun trajectory API", "version": VERSION}
        return {"swagger": "2.0", "info": info, "paths": {}}
    if level == "openapi/v3":
        return {"paths": {}}
    version = {"groupVersion": GROUP_VERSION, "version": VERSION}
    group = {"name": GROUP, "versions": [version], "preferredVersion": version}
    if level == "apis":
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [group]}
    if level == "group":
        return {"kind": "APIGroup", "apiVersion": "v1", **group}
    resource = {
        "name": RESOURCE,
        "singularName": "agentruntrajectory",
        "namespaced": True,
        "kind": KIND,
        "verbs": list(VERBS),
        "categories": ["agents"],
    }
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": GROUP_VERSION,
        "resources": [resource],
    }


def trajectory(namespace: str, name: str, events: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The ``AgentRunTrajectory`` object: every event of the run's stream (its subject, so a
    run deleted and made again under the same name shows both; each event names its
    ``runUID``), oldest first, each ``{"seq": <stream sequence>, …the event's fields}``."""
    return {
        "kind": KIND,
        "apiVersion": GROUP_VERSION,
        "metadata": {"name": name, "namespace": namespace},
        "events": list(events),
    }


RECORD_EXTRA = 32
"""Bytes a record (and the ``,`` before it in a whole read) may take beyond its payload: its
``{"seq":<up to 20 digits>,`` less the payload's ``{``, rounded up."""


def record(seq: int, payload: bytes) -> bytes:
    """One event record of a trajectory, ``{"seq": <stream sequence>, …the event's fields}``,
    made from the event's payload as stored, without parsing it: a parsed event takes up to
    some 25 times its bytes in memory (a Python object for each JSON value, which the run's
    model and tool servers choose), the stored bytes once. Line ends, which valid JSON holds
    only as whitespace between tokens, become spaces (a follow writes one record a line).
    Raises ``ValueError`` when the payload is not a JSON object with a field."""
    body = payload.strip()
    if (body[:1], body[-1:], body[1:-1].lstrip()[:1]) != (b"{", b"}", b'"'):
        raise ValueError(f"event {seq} is not a JSON object with a field")
    return b'{"seq":%d,' % seq + body[1:].replace(b"\n", b" ").replace(b"\r", b" ")


TOO_MANY_RETRY_AFTER = 5
"""Seconds a 429 asks a client to wait before asking again."""


def too_many(namespace: str, name: str, *, limit: str) -> Refusal:
    """429 when this server already reads as many trajectories as it may at once for the
    request's user, tenant, namespace or all: ``limit`` names the one found full, and the
    refusal asks to try again after ``TOO_MANY_RETRY_AFTER`` seconds (``Retry-After``)."""
    return Refusal(
        429,
        "TooManyRequests",
        f"too many requests: {limit}; try {RESOURCE} {name!r} in namespace "
        f"{namespace!r} again in {TOO_MANY_RETRY_AFTER} seconds",
        retry_after=TOO_MANY_RETRY_AFTER,
    )


def review_failed(namespace: str, name: str) -> Refusal:
    """503 when the SubjectAccessReview could not be made (the API server refused or did not
    answer it): the reader is neither allowed nor denied, and asks again."""
    return Refusal(
        503,
        "ServiceUnavailable",
        f'{RESOURCE}.{GROUP} "{name}" in "{namespace}": the access review could not be made;'
        " try again in a few seconds",
    )


def unavailable(namespace: str, name: str) -> Refusal:
    """503 when the run's events cannot be read now (NATS unreachable or too slow)."""
    return Refusal(
        503,
        "ServiceUnavailable",
        f'{RESOURCE}.{GROUP} "{name}" in "{namespace}": the event store did not answer',
    )
