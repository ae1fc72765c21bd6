"""The trajectory API's authentication and authorisation decisions, paths and bodies (pure)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

import pytest

from agentrun.cli import trajectoryapi as cli_api
from agentrun.trajectoryapi import access
from agentrun_dev import certs

CONFIGMAP = {
    "client-ca-file": "CLUSTER CA",
    "requestheader-client-ca-file": "FRONT PROXY CA",
    "requestheader-allowed-names": '["front-proxy-client"]',
    "requestheader-username-headers": '["X-Remote-User"]',
    "requestheader-group-headers": '["X-Remote-Group"]',
    "requestheader-extra-headers-prefix": '["X-Remote-Extra-"]',
}
PROXY = access.FrontProxy.from_configmap(CONFIGMAP)


def headers(pairs: Sequence[tuple[str, str]]) -> dict[str, object]:
    """The ``header``/``header_names`` callables of a request with ``pairs`` (names are
    case-insensitive, as HTTP's)."""

    def header(name: str) -> list[str]:
        return [v for k, v in pairs if k.lower() == name.lower()]

    return {"header": header, "header_names": lambda: [k for k, _ in pairs]}


def authenticate(cns: Sequence[str] | None, pairs: Sequence[tuple[str, str]]) -> object:
    return access.authenticate(PROXY, peer_common_names=cns, **headers(pairs))  # type: ignore[arg-type]


def test_the_configmap_is_parsed_and_one_without_a_request_header_ca_is_refused() -> None:
    assert PROXY.client_ca == "FRONT PROXY CA"
    assert PROXY.allowed_names == frozenset({"front-proxy-client"})
    assert PROXY.username_headers == ("X-Remote-User",)
    without = {k: v for k, v in CONFIGMAP.items() if k != "requestheader-client-ca-file"}
    with pytest.raises(ValueError, match="requestheader-client-ca-file"):
        access.FrontProxy.from_configmap(without)
    with pytest.raises(ValueError, match="no user can be named"):
        access.FrontProxy.from_configmap({**CONFIGMAP, "requestheader-username-headers": "[]"})
    with pytest.raises(ValueError, match="JSON list"):
        access.FrontProxy.from_configmap({**CONFIGMAP, "requestheader-allowed-names": '"x"'})


def test_the_front_proxy_names_the_user_groups_and_extra() -> None:
    user = authenticate(
        ["front-proxy-client"],
        [
            ("X-Remote-User", "alice"),
            ("x-remote-group", "team-a"),
            ("X-Remote-Group", "system:authenticated"),
            ("X-Remote-Extra-Scopes", "s1"),
            ("X-Remote-Extra-Scopes", "s2"),
        ],
    )
    assert user == access.User(
        "alice", ("team-a", "system:authenticated"), {"scopes": ("s1", "s2")}
    )


def test_extra_keys_are_unescaped_as_the_kube_apiserver_reads_them() -> None:
    user = authenticate(
        ["front-proxy-client"],
        [
            ("X-Remote-User", "system:serviceaccount:team-a:bot"),
            ("X-Remote-Extra-Authentication.kubernetes.io%2fcredential-id", "JTI=1"),
            ("X-Remote-Extra-Authentication.kubernetes.io%2Fpod-name", "bot-0"),
            ("X-Remote-Extra-100%25", "whole"),
            ("X-Remote-Extra-Odd%zz", "as written"),
            ("X-Remote-Extra-Bytes%ff", "replaced"),
        ],
    )
    assert isinstance(user, access.User)
    assert user.extra == {
        "authentication.kubernetes.io/credential-id": ("JTI=1",),
        "authentication.kubernetes.io/pod-name": ("bot-0",),
        "100%": ("whole",),
        "odd%zz": ("as written",),
        "bytes\ufffd": ("replaced",),
    }
    review = access.access_review(user, namespace="team-a", name="r1")
    assert review["spec"]["extra"]["authentication.kubernetes.io/pod-name"] == ["bot-0"]


@pytest.mark.parametrize(
    ("cns", "pairs", "why"),
    [
        (None, [("X-Remote-User", "alice")], "client certificate of the front proxy"),
        (["agentrun-admin"], [("X-Remote-User", "alice")], "not an allowed front proxy"),
        (["front-proxy-client"], [("X-Remote-Group", "system:masters")], "named no user"),
        (["front-proxy-client"], [("X-Remote-User", "")], "named no user"),
    ],
)
def test_anyone_but_the_front_proxy_naming_a_user_is_unauthorized(
    cns: Sequence[str] | None, pairs: Sequence[tuple[str, str]], why: str
) -> None:
    refusal = authenticate(cns, pairs)
    assert isinstance(refusal, access.Refusal)
    assert (refusal.code, refusal.reason) == (401, "Unauthorized")
    assert why in refusal.message
    status = refusal.status()
    assert (status["kind"], status["code"], status["status"]) == ("Status", 401, "Failure")


@pytest.fixture(scope="module")
def cas(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """PEM bundles of generated CAs: the cluster's client CA, a front-proxy CA of its own (as
    kubeadm makes them), and a bundle holding another CA and the cluster's."""
    pki = certs.generate_pki(tmp_path_factory.mktemp("pki"))
    cluster, front = pki.ca_cert.read_text(), pki.front_proxy_ca.read_text()
    other = certs.generate_server_tls(tmp_path_factory.mktemp("other"), common_name="x").ca_cert
    return {"cluster": cluster, "front": front, "mixed": other.read_text() + cluster}


def no_names(cas: Mapping[str, str], request_header_ca: str, **options: bool) -> access.FrontProxy:
    """The front proxy of a cluster that allows no names, its request-header CA
    ``cas[request_header_ca]`` and its client CA the cluster's."""
    data = {
        **CONFIGMAP,
        "requestheader-allowed-names": "[]",
        "requestheader-client-ca-file": cas[request_header_ca],
        "client-ca-file": cas["cluster"],
    }
    return access.FrontProxy.from_configmap(data, **options)


def bob_as(proxy: access.FrontProxy, cn: str = "anything") -> object:
    pairs = headers([("X-Remote-User", "bob")])
    return access.authenticate(proxy, peer_common_names=[cn], **pairs)  # type: ignore[arg-type]


def test_with_no_allowed_names_any_certificate_of_a_ca_of_its_own_is_the_proxy(
    cas: dict[str, str],
) -> None:
    proxy = no_names(cas, "front")
    assert not proxy.shares_cluster_ca and proxy.untrusted() is None
    user = bob_as(proxy)
    assert isinstance(user, access.User) and user.name == "bob"


@pytest.mark.parametrize("request_header_ca", ["cluster", "mixed"])
def test_no_allowed_names_and_the_clusters_client_ca_believe_no_header(
    cas: dict[str, str], request_header_ca: str
) -> None:
    proxy = no_names(cas, request_header_ca)
    assert proxy.shares_cluster_ca
    refusal = bob_as(proxy, "alice")  # any user's client certificate of the cluster
    assert isinstance(refusal, access.Refusal)
    assert (refusal.code, refusal.reason) == (401, "Unauthorized")
    assert "--requestheader-allowed-names" in refusal.message
    assert "trajectoryApi.trustAnyFrontProxyCertificate" in refusal.message
    assert access.discovery_without_user(proxy, peer_common_names=["alice"])
    assert not access.discovery_without_user(proxy, peer_common_names=None)


def test_the_opt_in_or_an_allowed_name_believes_the_clusters_client_ca_again(
    cas: dict[str, str],
) -> None:
    opted = no_names(cas, "cluster", trust_any_name=True)
    assert opted.shares_cluster_ca and opted.untrusted() is None
    assert isinstance(bob_as(opted), access.User)
    assert not access.discovery_without_user(opted, peer_common_names=["alice"])
    named = access.FrontProxy.from_configmap(
        {
            **CONFIGMAP,
            "requestheader-client-ca-file": cas["cluster"],
            "client-ca-file": cas["cluster"],
        }
    )
    assert named.untrusted() is None
    assert isinstance(bob_as(named, "front-proxy-client"), access.User)
    assert isinstance(bob_as(named, "alice"), access.Refusal)


def test_a_ca_bundle_without_a_certificate_is_refused_at_start_when_names_are_empty() -> None:
    with pytest.raises(ValueError):
        access.FrontProxy.from_configmap({**CONFIGMAP, "requestheader-allowed-names": "[]"})


def test_the_review_asks_get_on_the_trajectory_in_its_namespace() -> None:
    user = access.User("alice", ("team-a",), {"scopes": ("s1",)})
    review = access.access_review(user, namespace="a", name="r1")
    assert review["kind"] == "SubjectAccessReview"
    assert review["spec"]["user"] == "alice"
    assert review["spec"]["groups"] == ["team-a"]
    assert review["spec"]["extra"] == {"scopes": ["s1"]}
    assert review["spec"]["resourceAttributes"] == {
        "group": "trajectory.agentrun.dev",
        "version": "v1alpha1",
        "resource": "agentruntrajectories",
        "namespace": "a",
        "name": "r1",
        "verb": "get",
    }


@pytest.mark.parametrize(
    ("status", "allowed"),
    [
        ({"allowed": True}, True),
        ({"allowed": True, "denied": True}, False),
        ({"allowed": False}, False),
        ({"allowed": False, "reason": "no RBAC policy matched"}, False),
        ({}, False),
        (None, False),
        ({"allowed": "true"}, False),
    ],
)
def test_only_an_explicit_allow_lets_the_request_through(
    status: Mapping[str, object] | None, allowed: bool
) -> None:
    user = access.User("alice")
    refusal = access.authorize(user, status, namespace="b", name="r1")
    assert (refusal is None) is allowed
    if refusal is not None:
        assert (refusal.code, refusal.reason) == (403, "Forbidden")
        assert refusal.message.startswith(
            'agentruntrajectories.trajectory.agentrun.dev "r1" is forbidden: User "alice" '
            'cannot get resource "agentruntrajectories" in API group '
            '"trajectory.agentrun.dev" in the namespace "b"'
        )
        if status and status.get("reason"):
            assert refusal.message.endswith(": no RBAC policy matched")


@pytest.mark.parametrize(
    ("path", "target"),
    [
        ("/apis", access.Discovery("apis")),
        ("/apis/", access.Discovery("apis")),
        ("/apis/trajectory.agentrun.dev", access.Discovery("group")),
        ("/apis/trajectory.agentrun.dev/v1alpha1", access.Discovery("version")),
        (
            "/apis/trajectory.agentrun.dev/v1alpha1/namespaces/a/agentruntrajectories/r1",
            access.TrajectoryPath("a", "r1"),
        ),
        ("/apis/trajectory.agentrun.dev/v1alpha1/namespaces/a/agentruntrajectories", None),
        (
            "/apis/trajectory.agentrun.dev/v1alpha1/namespaces/a/agentruntrajectories/eval.case-1",
            access.TrajectoryPath("a", "eval.case-1"),
        ),
        ("/apis/trajectory.agentrun.dev/v1alpha1/namespaces/a/agentruntrajectories/>", None),
        ("/apis/trajectory.agentrun.dev/v1alpha1/namespaces/a/agentruntrajectories/*", None),
        ("/apis/trajectory.agentrun.dev/v1alpha1/namespaces/*/agentruntrajectories/r1", None),
        ("/apis/trajectory.agentrun.dev/v1alpha1/namespaces/a.b/agentruntrajectories/r1", None),
        ("/apis/trajectory.agentrun.dev/v1alpha1/namespaces/a/agentruntrajectories/R1", None),
        ("/apis/trajectory.agentrun.dev/v1alpha1/namespaces/a/agentruntrajectories/-r", None),
        ("/apis/trajectory.agentrun.dev/v1alpha1/namespaces/a/agentruns/r1", None),
        ("/apis/agentrun.dev/v1alpha1/namespaces/a/agentruntrajectories/r1", None),
        ("/apis/trajectory.agentrun.dev/v1/namespaces/a/agentruntrajectories/r1", None),
        ("/api/v1/namespaces/a/secrets/x", None),
        ("/openapi/v2", access.Discovery("openapi/v2")),
        ("/openapi/v3", access.Discovery("openapi/v3")),
        ("/openapi/v4", None),
        ("/", None),
    ],
)
def test_routes(path: str, target: object) -> None:
    assert access.route(path) == target


def test_discovery_documents_name_the_resource_and_its_verb() -> None:
    groups = access.discovery("apis")
    assert groups["kind"] == "APIGroupList"
    assert (
        groups["groups"][0]["preferredVersion"]["groupVersion"]
        == "trajectory.agentrun.dev/v1alpha1"
    )
    assert access.discovery("group")["kind"] == "APIGroup"
    resources = access.discovery("version")
    assert resources["groupVersion"] == "trajectory.agentrun.dev/v1alpha1"
    (resource,) = resources["resources"]
    assert (resource["name"], resource["kind"], resource["namespaced"], resource["verbs"]) == (
        "agentruntrajectories",
        "AgentRunTrajectory",
        True,
        ["get"],
    )
    assert access.discovery("openapi/v2")["swagger"] == "2.0"
    assert access.discovery("openapi/v3") == {"paths": {}}


def test_a_store_that_does_not_answer_is_unavailable() -> None:
    refusal = access.unavailable("a", "r1")
    assert (refusal.code, refusal.reason) == (503, "ServiceUnavailable")
    assert '"r1" in "a"' in refusal.message


def test_the_cli_asks_for_the_names_the_server_serves() -> None:
    assert (cli_api.GROUP, cli_api.VERSION, cli_api.RESOURCE) == (
        access.GROUP,
        access.VERSION,
        access.RESOURCE,
    )


def test_the_cli_reads_a_404_as_not_installed_and_other_refusals_as_errors() -> None:
    not_found = json.dumps(
        {"kind": "Status", "reason": "NotFound", "code": 404,
         "message": "the server could not find the requested resource"}
    )  # fmt: skip
    assert isinstance(cli_api.refusal(404, not_found), cli_api.NotInstalled)
    assert isinstance(cli_api.refusal(404, "404 page not found\n"), cli_api.NotInstalled)
    unserved = json.dumps(access.Refusal(404, "NotFound", "/apis/x is not served").status())
    error = cli_api.refusal(404, unserved)  # the trajectory server's own 404: installed
    assert isinstance(error, cli_api.ApiError)
    assert str(error) == "Error from server (NotFound): /apis/x is not served"
    forbidden = json.dumps(access.Refusal(403, "Forbidden", "x is forbidden").status())
    error = cli_api.refusal(403, forbidden)
    assert isinstance(error, cli_api.ApiError)
    assert str(error) == "Error from server (Forbidden): x is forbidden"
    assert str(cli_api.refusal(503, "service unavailable\n")) == (
        "Error from server (HTTP 503): service unavailable"
    )


def test_an_event_record_is_its_stored_payload_with_its_sequence_unparsed() -> None:
    payload = b'{"kind":"stop","summary":{"message":"a\\nb"},\n"time":1.0}'
    line = access.record(7, payload)
    assert b"\n" not in line  # a follow writes one record a line
    assert json.loads(line) == {"seq": 7, **json.loads(payload)}
    for bad in (b"", b"{}", b" { } ", b"[1]", b'"text"', b"{"):
        with pytest.raises(ValueError, match="not a JSON object"):
            access.record(1, bad)
