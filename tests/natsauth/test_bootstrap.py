"""``agentrun nats bootstrap`` on a real API server makes the installation's Secrets once and
then changes nothing; credentials without their keys are refused; a rotation replaces a user
and revokes the old one, which a nats-server configured from the Secrets then refuses. The
open bus's JetStream store is adopted by the closed server with every stream and bucket."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import nats
import nats.errors
import pytest
from kubernetes_asyncio import client

from agentrun import kube, natsclient
from agentrun.natsauth import Authority, bootstrap
from agentrun.natsauth.permissions import Role
from agentrun_dev import components, controlplane, natsserver

pytestmark = pytest.mark.e2e


@pytest.fixture
async def secrets(
    control_plane: controlplane.Cluster, test_namespace: str, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[bootstrap.SecretStore]:
    monkeypatch.setenv("KUBECONFIG", str(control_plane.kubeconfig))
    api = await kube.api_client()
    yield bootstrap.SecretStore(client.CoreV1Api(api), test_namespace)
    await api.close()


NAMES = bootstrap.SecretNames("agentrun-nats")


async def test_bootstrap_makes_the_secrets_once(secrets: bootstrap.SecretStore) -> None:
    first = await bootstrap.bootstrap(secrets, NAMES)
    assert sorted(first.created) == sorted(
        [NAMES.keys, NAMES.role(Role.OPERATOR), NAMES.role(Role.WORKER), NAMES.server]
    )
    before = {name: await secrets.read(name) for name in first.created}
    again = await bootstrap.bootstrap(secrets, NAMES)
    assert again == bootstrap.Outcome((), ())
    assert {name: await secrets.read(name) for name in first.created} == before
    operator = before[NAMES.role(Role.OPERATOR)]
    assert operator is not None and set(operator) == {
        "nats.creds",
        "reader-signer.nk",
        "account.pub",
    }


async def test_credentials_without_their_keys_are_refused(secrets: bootstrap.SecretStore) -> None:
    await secrets.write(NAMES.role(Role.WORKER), {"nats.creds": "x"}, replace=False)
    with pytest.raises(bootstrap.BootstrapError, match="agentrun-nats-keys does not"):
        await bootstrap.bootstrap(secrets, NAMES)


async def test_a_rotated_user_is_refused_and_its_successor_accepted(
    secrets: bootstrap.SecretStore, tmp_path: Path, devenv_launch: components.Launch
) -> None:
    await bootstrap.bootstrap(secrets, NAMES)
    old = await secrets.read(NAMES.role(Role.WORKER))
    await asyncio.sleep(1.1)  # a revocation covers the JWTs issued up to its second
    await bootstrap.rotate(secrets, NAMES, Role.WORKER)
    new = await secrets.read(NAMES.role(Role.WORKER))
    server = await secrets.read(NAMES.server)
    assert old is not None and new is not None and server is not None
    assert old != new

    directory = tmp_path / "nats"
    directory.mkdir()
    (directory / "auth.conf").write_text(server["auth.conf"])
    port = natsserver.probes.free_port()
    monitor = natsserver.probes.free_port()
    (directory / "nats.conf").write_text(
        f"host: 127.0.0.1\nport: {port}\nhttp: 127.0.0.1:{monitor}\n"
        f'jetstream {{ store_dir: "{directory / "js"}" }}\ninclude ./auth.conf\n'
    )
    spec = devenv_launch.spec(
        "nats-from-secrets",
        [str(natsserver.find_nats_server()), "-c", str(directory / "nats.conf")],
    )
    probe = natsserver.probes.Probe(url=f"http://127.0.0.1:{monitor}/healthz", expect="ok")
    running = devenv_launch.start(spec, probe=probe, ports={"client": port})
    try:
        for name, data in (("old", old), ("new", new)):
            (tmp_path / f"{name}.creds").write_text(data["nats.creds"])
        url = f"nats://127.0.0.1:{port}"
        with pytest.raises(nats.errors.Error, match=r"(?i)authorization violation"):
            await nats.connect(
                url, allow_reconnect=False, user_credentials=str(tmp_path / "old.creds")
            )
        options = natsclient.connect_options(natsclient.NatsAuth(creds_file=tmp_path / "new.creds"))
        nc = await nats.connect(url, allow_reconnect=False, **options)
        await nc.close()
    finally:
        components.stop_component(running)


async def test_the_closed_server_adopts_the_open_bus_store(
    tmp_path: Path, devenv_launch: components.Launch
) -> None:
    """An install upgraded from the open bus: its streams, consumers and buckets were kept
    under ``$G``; after ``adopt-store`` the closed server serves them to the operator."""
    workdir = tmp_path / "nats"
    open_server = natsserver.start_nats_server(workdir, launch=devenv_launch, closed=False)
    nc = await nats.connect(open_server.url)
    js = nc.jetstream()
    await js.add_stream(name="AGENTRUN_EVENTS", subjects=["agentrun.event.>"])
    await js.publish("agentrun.event.ns.run", b"checkpoint")
    kv = await js.create_key_value(bucket="AGENTRUN_LEDGER")
    await kv.put("book.t", b"525")
    await nc.close()
    open_server.stop()

    closed = natsserver.start_nats_server(workdir, launch=devenv_launch)
    try:
        components.stop_component(closed.component)
        account = closed.authority().account.public
        account_file = tmp_path / "account.pub"
        account_file.write_text(account)
        jetstream = workdir / "jetstream" / "jetstream"
        argv = [str(Path(sys.executable).parent / "agentrun"), "nats", "adopt-store"]
        argv += ["--store", str(jetstream), "--account-file", str(account_file)]
        done = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=60)
        assert "moved" in done.stdout
        again = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=60)
        assert "nothing to adopt" in again.stdout
        restarted = components.restart_component(closed.component, log=devenv_launch.log)
        try:
            nc = await nats.connect(**closed.client_options("operator"))
            info = await nc.jetstream().stream_info("AGENTRUN_EVENTS")  # the operator's view
            assert info.state.messages == 1
            await nc.close()
            admin = await nats.connect(**closed.client_options())
            js = admin.jetstream()
            last = await js._jsm.get_last_msg("AGENTRUN_EVENTS", "agentrun.event.ns.run")
            assert last.data == b"checkpoint"
            book = await (await js.key_value("AGENTRUN_LEDGER")).get("book.t")
            assert book.value == b"525"
            await admin.close()
        finally:
            components.stop_component(restarted)
    finally:
        components.stop_component(closed.component)


def test_an_authority_round_trips_through_its_files() -> None:
    authority = Authority.generate().revoke("UABC", now=2_000_000_000)
    assert Authority.load(authority.files()) == authority
    with pytest.raises(ValueError, match=r"account\.nk"):
        Authority.load({k: v for k, v in authority.files().items() if k != "account.nk"})
