"""kubectl's global flags on ``kubectl agentrun``: parsed on every subcommand (before or after
it), and the client they build: the kubeconfig file and context loaded, the impersonation
headers sent on the wire (a local HTTP server stands in for the API server)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web
from kubernetes_asyncio.config.config_exception import ConfigException

from agentrun.cli import control, kubectl, kubeflags, trajectoryapi

COMMANDS = {
    "get": [],
    "logs": ["r"],
    "describe": ["r"],
    "approve": ["r"],
    "deny": ["r"],
    "cancel": ["r"],
    "eval": ["e"],
    "rerun": ["r"],
}
FLAGS = ["-n", "ns", "--kubeconfig", "/k", "--context", "c", "--as", "alice"]
GROUPS = ["--as-group", "approvers", "--as-group", "oncall"]


def kubeconfig(path: Path, server: str) -> Path:
    """Two contexts on ``server``: ``one`` (current, namespace ``first``) and ``two``
    (namespace ``second``)."""
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": server}}],
        "users": [{"name": "u", "user": {"token": "t0k"}}],
        "contexts": [
            {"name": "one", "context": {"cluster": "c", "user": "u", "namespace": "first"}},
            {"name": "two", "context": {"cluster": "c", "user": "u", "namespace": "second"}},
        ],
        "current-context": "one",
    }
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("before", [False, True])
def test_every_command_takes_the_global_flags_before_or_after_it(
    command: str, before: bool
) -> None:
    argv = [*FLAGS, *GROUPS, command, *COMMANDS[command]]
    if not before:
        argv = [command, *COMMANDS[command], *FLAGS, *GROUPS]
    args = kubectl.build_parser().parse_args(argv)
    assert args.namespace == "ns"
    assert kubeflags.KubeOptions.from_args(args) == kubeflags.KubeOptions(
        kubeconfig="/k", context="c", as_user="alice", as_groups=("approvers", "oncall")
    )


def test_flags_not_given_mean_the_kubeconfigs_own_identity() -> None:
    args = kubectl.build_parser().parse_args(["approve", "r", "--digest", "d"])
    assert args.namespace is None
    assert kubeflags.KubeOptions.from_args(args) == kubeflags.KubeOptions()
    assert kubeflags.KubeOptions().headers() == []


def test_headers_name_the_user_then_each_group() -> None:
    options = kubeflags.KubeOptions(as_user="alice", as_groups=("a", "b"))
    assert options.headers() == [
        ("Impersonate-User", "alice"),
        ("Impersonate-Group", "a"),
        ("Impersonate-Group", "b"),
    ]


def test_a_group_without_a_user_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        kubectl.main(["get", "--as-group", "admins"])
    assert exit_.value.code == 2
    assert "--as-group requires --as" in capsys.readouterr().err


def test_the_default_namespace_is_the_named_contexts(tmp_path: Path) -> None:
    path = str(kubeconfig(tmp_path / "config", "http://127.0.0.1:1"))
    assert kubeflags.current_namespace(kubeflags.KubeOptions(kubeconfig=path)) == "first"
    two = kubeflags.KubeOptions(kubeconfig=path, context="two")
    assert kubeflags.current_namespace(two) == "second"
    unknown = kubeflags.KubeOptions(kubeconfig=path, context="nope")
    assert kubeflags.current_namespace(unknown) == "default"
    missing = kubeflags.KubeOptions(kubeconfig=str(tmp_path / "missing"))
    assert kubeflags.current_namespace(missing) == "default"


async def test_a_missing_kubeconfig_or_context_is_refused_not_replaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig(tmp_path / "config", "http://127.0.0.1:1")))
    with pytest.raises(ConfigException, match=r"no kubeconfig at .*missing"):
        await kubeflags.KubeOptions(kubeconfig=str(tmp_path / "missing")).api_client()
    with pytest.raises(ConfigException):
        await kubeflags.KubeOptions(context="nope").api_client()


class Recorder:
    """A stand-in API server: answers a SelfSubjectReview with the impersonated user, the
    trajectory API with no events, and keeps every request's headers."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, list[tuple[str, str]]]] = []

    async def handle(self, request: web.Request) -> web.Response:
        self.requests.append((request.path, list(request.headers.items())))
        if request.path.endswith("selfsubjectreviews"):
            user = request.headers.get("Impersonate-User", "admin")
            body: dict[str, Any] = {
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "SelfSubjectReview",
                "status": {"userInfo": {"username": user}},
            }
            return web.json_response(body, status=201)
        return web.json_response({"events": []})


@pytest.fixture
async def recorder() -> AsyncIterator[tuple[Recorder, str]]:
    seen = Recorder()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", seen.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    yield seen, f"http://127.0.0.1:{port}"
    await runner.cleanup()


async def test_requests_carry_the_impersonation_headers_and_the_chosen_context(
    tmp_path: Path, recorder: tuple[Recorder, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    seen, server = recorder
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))  # --kubeconfig is what counts
    path = str(kubeconfig(tmp_path / "config", server))
    options = kubeflags.KubeOptions(
        kubeconfig=path, context="two", as_user="alice", as_groups=("approvers", "oncall")
    )
    async with control.RunClient("second", options) as runs:
        assert await runs.whoami() == "alice"
        await trajectoryapi.TrajectoryApi(runs.api, "second", "r").read()
    assert [path for path, _ in seen.requests] == [
        "/apis/authentication.k8s.io/v1/selfsubjectreviews",
        "/apis/trajectory.agentrun.dev/v1alpha1/namespaces/second/agentruntrajectories/r",
    ]
    for _, headers in seen.requests:
        assert [v for k, v in headers if k == "Impersonate-User"] == ["alice"]
        assert [v for k, v in headers if k == "Impersonate-Group"] == ["approvers", "oncall"]
        assert ("Authorization", "Bearer t0k") in headers


async def test_without_as_no_impersonation_header_is_sent(
    tmp_path: Path, recorder: tuple[Recorder, str]
) -> None:
    seen, server = recorder
    options = kubeflags.KubeOptions(kubeconfig=str(kubeconfig(tmp_path / "config", server)))
    async with control.RunClient("first", options) as runs:
        assert await runs.whoami() == "admin"
    headers = dict(seen.requests[0][1])
    assert not {"Impersonate-User", "Impersonate-Group"} & set(headers)
