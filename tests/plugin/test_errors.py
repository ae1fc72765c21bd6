"""How ``kubectl agentrun`` and ``agentrun`` name themselves in errors (no cluster)."""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from http_support import loopback_kubeconfig, serving

from agentrun.cli import control, describe, kubectl, kubeflags
from agentrun.cli import main as agentrun_cli


class NothingWaits:
    """A ``control.RunClient`` stand-in whose run waits for no approval."""

    def __init__(self, namespace: str, options: object = None) -> None:
        self.namespace = namespace

    async def __aenter__(self) -> NothingWaits:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    async def status(self, name: str) -> dict[str, Any]:
        return {"phase": "Succeeded"}


def test_the_plugin_names_itself_kubectl_agentrun_in_errors(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("KUBECONFIG", "/nonexistent/kubeconfig")
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert kubectl.main(["approve", "idle", "-n", "default"]) == 1
    assert capsys.readouterr().err.startswith("kubectl agentrun: error: no kubeconfig")
    assert agentrun_cli.main(["approve", "idle", "-n", "default"]) == 1
    assert capsys.readouterr().err.startswith("agentrun: error: no kubeconfig")


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param(["get"], id="get"),
        pytest.param(["logs", "r"], id="logs"),
        pytest.param(["cancel", "r"], id="cancel"),
    ],
)
def test_without_a_kubeconfig_the_error_says_how_to_give_one(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    """The local stack's kubeconfig comes from `agentrun dev env` in the checkout; a cluster's,
    from KUBECONFIG or --kubeconfig."""
    monkeypatch.setenv("KUBECONFIG", "/nonexistent/kubeconfig")
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert kubectl.main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith("kubectl agentrun: error: no kubeconfig at /nonexistent/kubeconfig ")
    assert "set KUBECONFIG to your cluster's kubeconfig" in err
    assert ".;" not in err  # the cause's own full stop dropped before the hint
    assert "--kubeconfig" in err
    assert '`eval "$(.venv/bin/agentrun dev env)"` in that checkout' in err
    assert err.count("\n") == 1


def test_a_kubeconfig_named_and_missing_is_said_without_the_hint(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert kubectl.main(["get", "--kubeconfig", "/nonexistent/named"]) == 1
    assert capsys.readouterr().err == (
        "kubectl agentrun: error: no kubeconfig at /nonexistent/named\n"
    )


@pytest.mark.parametrize(
    ("main", "prog"),
    [
        pytest.param(kubectl.main, "kubectl agentrun", id="plugin"),
        pytest.param(agentrun_cli.main, "agentrun", id="cli"),
    ],
)
def test_approve_without_a_held_call_names_the_command_it_was_run_as(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], main: Any, prog: str
) -> None:
    monkeypatch.setattr(control, "RunClient", NothingWaits)
    assert main(["approve", "idle", "-n", "default"]) == 1
    assert capsys.readouterr().err == f"{prog}: error: idle is not waiting for an approval\n"


class Closable:
    """An API client stand-in: only closed."""

    async def close(self) -> None:
        return None


def test_a_malformed_signing_key_secret_is_one_line_not_a_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from agentrun import kube
    from agentrun.trust import KeyFileError, secrets

    async def client() -> Closable:
        return Closable()

    async def malformed(*args: object, **kwargs: object) -> list[str]:
        raise KeyFileError("Secret agentrun-signing: key 'keys.json' is not JSON")

    monkeypatch.setattr(kube, "api_client", client)
    monkeypatch.setattr(secrets, "bootstrap", malformed)
    assert agentrun_cli.main(["signing", "bootstrap", "-n", "ns", "--prefix", "agentrun"]) == 1
    assert capsys.readouterr().err == (
        "agentrun: error: a run-signing key Secret is malformed: "
        "Secret agentrun-signing: key 'keys.json' is not JSON\n"
    )


@pytest.mark.parametrize("program", [kubectl.main, agentrun_cli.main], ids=["kubectl", "agentrun"])
def test_the_cli_programs_drop_only_the_library_warnings_they_say_better(
    program: Any, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    """And kubernetes_asyncio's "Config not found", which their own error says better."""
    loggers = [logging.getLogger(name) for name in ("asyncio", *control.NOISE)]
    saved = [list(logger.filters) for logger in loggers]
    kube_config = logging.getLogger("kubernetes_asyncio.config.kube_config")
    try:
        with contextlib.suppress(SystemExit):
            program([])
        loggers[0].warning(control.SSL_EOF_WARNING)
        loggers[0].warning("Task was destroyed but it is pending!")
        kube_config.warning("Config not found: %s", "/root/.kube/config")
        kube_config.warning("Invalid kube-config file.")
        capsys.readouterr()
    finally:
        for logger, filters in zip(loggers, saved, strict=True):
            logger.filters[:] = filters
    assert [r.getMessage() for r in caplog.records if r.name.startswith(("asyncio", "kube"))] == [
        "Task was destroyed but it is pending!",
        "Invalid kube-config file.",
    ]


def not_found() -> Any:
    """The API server's 404 for an AgentRun named ``held``."""
    from kubernetes_asyncio.client.exceptions import ApiException

    err = ApiException(status=404, reason="Not Found")
    err.body = '{"reason": "NotFound", "message": "agentruns.agentrun.dev \\"held\\" not found"}'
    return err


async def test_a_run_not_found_names_the_namespace_it_was_looked_for_in() -> None:
    """A run of team-a looked for from a context in default: the error says where it looked
    and how to look elsewhere; a request of no namespace (whoami, -A) says no namespace."""

    async def refused() -> None:
        raise not_found()

    runs = control.RunClient("default")
    with pytest.raises(control.RunAccessError) as caught:
        await runs._call(refused())
    assert str(caught.value) == (
        'Error from server (NotFound): agentruns.agentrun.dev "held" not found'
        " in namespace 'default' (another: -n NAMESPACE)"
    )
    with pytest.raises(control.RunAccessError, match=r'"held" not found$'):
        await runs._call(refused(), namespaced=False)


def refusing(status: int, reason: str) -> Any:
    """An API server's handler answering every request with a ``Status`` of ``status``."""

    async def handle(request: web.Request) -> web.Response:
        body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": status}
        body |= {"reason": reason, "message": f'events is {reason.lower()}: User "carol"'}
        return web.json_response(body, status=status)

    return handle


async def test_describe_by_someone_who_may_not_list_events_shows_the_run_without_them(
    tmp_path: Path,
) -> None:
    """None of the agentrun roles grants Events: a person bound only agentrun-approve (who
    reads the held call's digest there) or agentrun-view describes the run, as kubectl's own
    describe shows an object it may not list Events of. Failed before: the whole describe was
    `Error from server (Forbidden): events is forbidden`."""
    route = {"/api/v1/namespaces/team-a/events": refusing(403, "Forbidden")}
    async with serving(route) as server:
        config = str(loopback_kubeconfig(tmp_path / "config", server))
        async with control.RunClient("team-a", kubeflags.KubeOptions(kubeconfig=config)) as runs:
            assert await runs.events_of("uid-1") is None
    lines = describe.describe_lines({"metadata": {"name": "held", "namespace": "team-a"}}, None)
    assert lines[-1] == "Events:        <not shown: you may not list Events in this namespace>"


async def test_describe_still_fails_on_any_other_refusal_of_the_events(tmp_path: Path) -> None:
    route = {"/api/v1/namespaces/team-a/events": refusing(500, "InternalError")}
    async with serving(route) as server:
        config = str(loopback_kubeconfig(tmp_path / "config", server))
        async with control.RunClient("team-a", kubeflags.KubeOptions(kubeconfig=config)) as runs:
            with pytest.raises(control.RunAccessError, match=r"^Error from server \(InternalError"):
                await runs.events_of("uid-1")
