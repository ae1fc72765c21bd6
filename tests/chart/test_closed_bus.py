"""The chart closes its NATS: TLS with a CA it makes (kept across upgrades) or cert-manager's,
the bootstrap hook that makes the credentials, each role's Secret and the CA mounted as files
in its pods, no monitoring port on the clients' Service; and the NATS it renders, run by the
real nats-server with the bootstrap's auth configuration, verifies its name to a client that
holds the chart's CA and the operator's credentials, and refuses an anonymous one."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path
from typing import Any

import nats
import nats.errors
import pytest
from chart_support import CHART_DIR, FEATURES, documents
from test_render import closed_nats_files, env_of, find, render

from agentrun import natsclient, protocol
from agentrun.natsauth import Authority, Role
from agentrun.natsauth.permissions import inbox_prefix
from agentrun_dev import components, helm, natsserver, probes


def mounts_of(workload: dict[str, Any]) -> dict[str, str]:
    container = workload["spec"]["template"]["spec"]["containers"][0]
    return {m["name"]: m["mountPath"] for m in container.get("volumeMounts", [])}


def secrets_of(workload: dict[str, Any]) -> dict[str, str]:
    volumes = workload["spec"]["template"]["spec"]["volumes"]
    return {v["name"]: v["secret"]["secretName"] for v in volumes if "secret" in v}


def test_each_role_gets_its_own_credentials_and_the_ca_as_files(offline_helm: helm.Helm) -> None:
    docs = render(offline_helm, "nats", namespace="ops")
    for role in ("operator", "worker"):
        workload = find(docs, "Deployment", f"agentrun-{role}")
        env = env_of(workload)
        assert env["AGENTRUN_NATS_CREDS_FILE"] == "/var/run/agentrun/nats/nats.creds"
        assert env["AGENTRUN_NATS_CA_FILE"] == "/var/run/agentrun/nats-ca/ca.crt"
        assert mounts_of(workload)["nats-creds"] == "/var/run/agentrun/nats"
        assert {k: v for k, v in secrets_of(workload).items() if k.startswith("nats-")} == {
            "nats-creds": f"agentrun-nats-{role}",
            "nats-ca": "agentrun-nats-tls",
        }
        assert not any("password" in v.lower() or "@" in v for v in env.values())


def test_the_bootstrap_hook_runs_before_install_and_upgrade_with_secret_rights_only(
    offline_helm: helm.Helm,
) -> None:
    docs = render(offline_helm, "nats", namespace="ops")
    job = find(docs, "Job", "agentrun-nats-bootstrap")
    role = find(docs, "Role", "agentrun-nats-bootstrap")
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade"
    command = job["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command == ["agentrun", "nats", "bootstrap", "--namespace=ops", "--prefix=agentrun-nats"]
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "create", "update"]}
    ]
    server = find(docs, "StatefulSet", "agentrun-nats")["spec"]["template"]["spec"]
    [adopt] = server["initContainers"]
    assert adopt["command"][:3] == ["agentrun", "nats", "adopt-store"]


def test_credentials_brought_by_the_user_need_no_hook(offline_helm: helm.Helm) -> None:
    values = {
        "nats.auth.operatorSecret": "my-operator",
        "nats.auth.workerSecret": "my-worker",
        "nats.tls.existingSecret": "my-ca",
    }
    docs = documents(offline_helm.template(CHART_DIR, namespace="ops", values=values))
    assert not [d for d in docs if "nats-bootstrap" in d["metadata"]["name"]]
    assert secrets_of(find(docs, "Deployment", "agentrun-worker")) == {
        "nats-creds": "my-worker",
        "nats-ca": "my-ca",
        "run-trust": "agentrun-trust",
    }


def test_an_installed_nats_with_every_secret_brought_needs_no_hook(
    offline_helm: helm.Helm,
) -> None:
    docs = render(offline_helm, "nats-credentials-brought", namespace="ops")
    assert not [d for d in docs if "nats-bootstrap" in d["metadata"]["name"]]
    assert secrets_of(find(docs, "StatefulSet", "agentrun-nats"))["auth"] == "bus-server"
    assert secrets_of(find(docs, "Deployment", "agentrun-operator"))["nats-creds"] == "bus-operator"


def test_an_installed_nats_without_its_server_secret_still_runs_the_hook(
    offline_helm: helm.Helm,
) -> None:
    values = dict(FEATURES["nats-credentials-brought"])
    del values["nats.auth.serverSecret"]
    docs = documents(offline_helm.template(CHART_DIR, namespace="ops", values=values))
    find(docs, "Job", "agentrun-nats-bootstrap")
    assert secrets_of(find(docs, "StatefulSet", "agentrun-nats"))["auth"] == "agentrun-nats-server"


@pytest.mark.parametrize(
    "brought",
    [
        pytest.param({}, id="no-role-credentials"),
        pytest.param({"nats.auth.operatorSecret": "bus-operator"}, id="no-worker-credentials"),
    ],
)
def test_a_server_secret_without_both_roles_credentials_fails_naming_the_field(
    offline_helm: helm.Helm, brought: dict[str, str]
) -> None:
    values = {"nats.install.enabled": "true", "nats.auth.serverSecret": "bus-server", **brought}
    with pytest.raises(helm.HelmError, match=r"nats\.auth\.serverSecret: bring"):
        offline_helm.template(CHART_DIR, namespace="ops", values=values)


def test_the_open_bus_escape_hatch_mounts_nothing(offline_helm: helm.Helm) -> None:
    values = {"nats.auth.enabled": "false", "nats.tls.enabled": "false"}
    docs = documents(offline_helm.template(CHART_DIR, namespace="ops", values=values))
    env = env_of(find(docs, "Deployment", "agentrun-worker"))
    assert "AGENTRUN_NATS_CREDS_FILE" not in env and "AGENTRUN_NATS_CA_FILE" not in env
    jobs = [d["metadata"]["name"] for d in docs if d["kind"] == "Job"]
    assert jobs == ["agentrun-run-signing"]  # the run-signing keys: needed on any bus


def test_cert_manager_issues_the_certificate_for_the_service_names(
    offline_helm: helm.Helm,
) -> None:
    values = {
        "nats.install.enabled": "true",
        "nats.tls.certManager.enabled": "true",
        "nats.tls.certManager.issuerRef.name": "ca-issuer",
    }
    docs = documents(offline_helm.template(CHART_DIR, namespace="ops", values=values))
    certificate = find(docs, "Certificate", "agentrun-nats")
    assert certificate["spec"]["secretName"] == "agentrun-nats-tls"
    assert "agentrun-nats.ops.svc" in certificate["spec"]["dnsNames"]
    assert not [
        d for d in docs if d["kind"] == "Secret" and d["metadata"]["name"] == "agentrun-nats-tls"
    ]


async def test_the_rendered_nats_runs_closed_and_verifies_its_service_name(
    offline_helm: helm.Helm, tmp_path: Path, devenv_launch: components.Launch
) -> None:
    docs = render(offline_helm, "nats", namespace="ops")
    authority = Authority.generate()
    directory = closed_nats_files(docs, tmp_path, authority)
    port, monitor = probes.free_port(), probes.free_port()
    config = directory / "config" / "nats.conf"
    text = (
        config.read_text()
        .replace("port: 4222", f"port: {port}")
        .replace("http_port: 8222", f"http: 127.0.0.1:{monitor}")
    )
    config.write_text(text)
    spec = devenv_launch.spec(
        "nats-from-chart",
        [str(natsserver.find_nats_server()), "-c", str(config)],
        env={"POD_NAME": "agentrun-nats-0"},
    )
    probe = probes.Probe(
        url=f"http://127.0.0.1:{monitor}/healthz?js-enabled-only=true", expect="ok"
    )
    running = devenv_launch.start(spec, probe=probe, ports={"client": port})
    try:
        creds = tmp_path / "operator.creds"
        creds.write_text(authority.mint(Role.OPERATOR, name="operator").text())
        auth = natsclient.NatsAuth(creds_file=creds, ca_file=directory / "tls" / "ca.crt")
        options = natsclient.connect_options(auth)
        url = f"tls://127.0.0.1:{port}"
        nc = await nats.connect(
            url, allow_reconnect=False, tls_hostname="agentrun-nats.ops.svc", **options
        )
        await nc.close()
        with pytest.raises(Exception, match=r"(?i)hostname|match"):  # a name it does not carry
            await nats.connect(
                url, allow_reconnect=False, tls_hostname="elsewhere.ops.svc", **options
            )
        anonymous = natsclient.connect_options(natsclient.NatsAuth(ca_file=auth.ca_file))
        with pytest.raises(nats.errors.Error, match="Authorization Violation"):
            await nats.connect(
                url, allow_reconnect=False, tls_hostname="agentrun-nats.ops.svc", **anonymous
            )
    finally:
        components.stop_component(running)


def test_the_nats_cli_in_the_nats_pod_uses_the_operators_identity_through_its_context(
    offline_helm: helm.Helm,
    own_nats_server: natsserver.NatsServer,
    tmp_path: Path,
    natscli_binary: Path,
) -> None:
    """``kubectl exec sts/agentrun-nats -c nats -- nats …`` needs no flags: the pod's
    environment selects the rendered context, which names the Service, the chart's CA and the
    operator's credentials and inbox, mounted read-only. The pinned CLI, given that context
    (its URL and files pointed at a real closed server), reads a stream's info; the operator's
    identity may not list the account's streams."""
    docs = render(offline_helm, "nats", namespace="ops")
    server = find(docs, "StatefulSet", "agentrun-nats")["spec"]["template"]["spec"]
    container = server["containers"][0]
    env = env_of({"spec": {"template": {"spec": server}}})
    assert (env["XDG_CONFIG_HOME"], env["NATS_CONTEXT"]) == ("/etc/nats/cli-config", "agentrun")
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["cli-context"]["mountPath"] == "/etc/nats/cli-config/nats/context"
    assert mounts["cli-creds"]["mountPath"] == "/etc/nats/cli"
    assert all(m.get("readOnly") for n, m in mounts.items() if n != "data")
    assert secrets_of({"spec": {"template": {"spec": server}}})["cli-creds"] == (
        "agentrun-nats-operator"
    )
    context = json.loads(find(docs, "ConfigMap", "agentrun-nats-config")["data"]["agentrun.json"])
    assert context == {
        "description": "agentrun's NATS with the operator's identity",
        "url": "tls://agentrun-nats.ops.svc:4222",
        "creds": "/etc/nats/cli/nats.creds",
        "ca": "/etc/nats/tls/ca.crt",
        "inbox_prefix": inbox_prefix(Role.OPERATOR),
    }

    auth = own_nats_server.auth("operator")
    assert auth is not None and auth.creds_file is not None and auth.ca_file is not None
    here = dict(context, url=own_nats_server.url, creds=str(auth.creds_file), ca=str(auth.ca_file))
    directory = tmp_path / "cli-config" / "nats" / "context"
    directory.mkdir(parents=True)
    (directory / "agentrun.json").write_text(json.dumps(here))
    directory.chmod(0o555)  # mounted read-only
    cli_env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path / "home")}
    cli_env.update(
        {k: env[k] for k in ("NATS_CONTEXT",)}, XDG_CONFIG_HOME=str(directory.parents[1])
    )
    nats_cli = str(natscli_binary)

    async def make_stream() -> None:
        nc = await nats.connect(**own_nats_server.client_options("admin"))
        await nc.jetstream().add_stream(name=protocol.STREAM_EVENTS, subjects=["dr.cli.test"])
        await nc.close()

    asyncio.run(make_stream())
    info = subprocess.run(
        [nats_cli, "stream", "info", protocol.STREAM_EVENTS, "--json"],
        env=cli_env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert info.returncode == 0, info.stdout + info.stderr
    assert json.loads(info.stdout)["config"]["name"] == protocol.STREAM_EVENTS
    listed = subprocess.run(
        [nats_cli, "stream", "ls"],
        env=cli_env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert listed.returncode != 0 and "permission" in (listed.stdout + listed.stderr).lower()
