"""From one NATS server to three, the NATS half of docs/operations.md's path ("From one NATS
server to three"): a closed single server's state (a run's events, a ledger entry, an effect
entry) backed up with the pinned ``nats`` CLI and the operator's identity as the docs say; the
same server's store then becomes the first of three servers forming a cluster, which does NOT
carry the single server's streams over (why the chart refuses that change without
``nats.install.restoreFromBackup``); the backups restored into the cluster, and the operator's
provisioning at ``AGENTRUN_NATS_REPLICAS=3`` raising each to R3 with every event and entry
kept."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import nats
import nats.js.errors
import pytest
from cluster_nats_support import jetstream_usable

from agentrun import protocol
from agentrun.bus import connect_nats
from agentrun.natsauth.permissions import Role, inbox_prefix
from agentrun_dev import components, natscluster, natsserver
from bus.test_replicated import STREAMS, event, provision, replicas, settled

BACKED_UP = (
    protocol.STREAM_EVENTS,
    protocol.kv_stream(protocol.LEDGER_BUCKET),
    protocol.kv_stream(protocol.EFFECTS_BUCKET),
)
"""The streams docs/operations.md says to back up (AGENTRUN_TURNS holds nothing durable)."""


def nats_cli(cli: Path, url: str, auth_dir: Path, *args: str) -> str:
    """The pinned ``nats`` CLI `cli` (``natscli_binary``) against ``url`` with the operator's
    credentials and inbox, as docs/operations.md has it; its output. Fails the test with the
    CLI's output."""
    argv = [str(cli), "--server", url, "--no-context"]
    argv += ["--creds", str(auth_dir / "operator.creds"), "--tlsca", str(auth_dir / "ca.crt")]
    argv += ["--inbox-prefix", inbox_prefix(Role.OPERATOR), *args]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.fixture
def single(tmp_path: Path, devenv_launch: components.Launch) -> Iterator[natsserver.NatsServer]:
    """One closed nats-server of this test's own (stopped by the test; again here if it
    failed first)."""
    server = natsserver.start_nats_server(tmp_path / "one", launch=devenv_launch)
    try:
        yield server
    finally:
        server.stop()


async def test_a_single_server_s_backups_restored_into_three_servers_come_back_at_r3(
    single: natsserver.NatsServer,
    tmp_path: Path,
    devenv_launch: components.Launch,
    natscli_binary: Path,
) -> None:
    assert single.auth_dir is not None
    bus = await provision(single.url, single.auth("operator"), 1)
    try:
        for turn in range(3):
            await bus.append_event("ns", "kept", event("u-kept", turn), expected_seq=turn)
        kept_events = await bus.read_events("ns", "kept")
        admin = await connect_nats(single.url, name="b-admin", auth=single.auth("admin"))
        try:  # an entry in each bucket (which the operator's identity may not all write)
            await (await admin.jetstream().key_value(protocol.LEDGER_BUCKET)).put("kept", b"1")
            await (await admin.jetstream().key_value(protocol.EFFECTS_BUCKET)).put("kept", b"2")
        finally:
            await admin.close()
    finally:
        await bus.close()
    backup = tmp_path / "backup"
    for stream in BACKED_UP:
        nats_cli(natscli_binary, single.url, single.auth_dir, "backup", "stream", stream,
                 str(backup / stream), "--no-progress")  # fmt: skip
    single.stop()

    cluster = natscluster.start_nats_cluster(
        tmp_path / "three", launch=devenv_launch, auth_dir=single.auth_dir,
        first_store=single.store_dir,
    )  # fmt: skip
    try:
        await jetstream_usable(cluster)
        admin = await nats.connect(**cluster.client_options("admin"))
        try:
            for stream in STREAMS:  # the one server's streams are not the cluster's
                with pytest.raises(nats.js.errors.NotFoundError):
                    await admin.jetstream().stream_info(stream)
        finally:
            await admin.close()
        for stream in BACKED_UP:
            nats_cli(natscli_binary, cluster.url, cluster.auth_dir, "backup", "restore", "stream",
                     str(backup / stream), "--no-progress")  # fmt: skip
        bus = await provision(cluster.url, cluster.auth("operator"), 3)
        try:
            assert await replicas(bus) == dict.fromkeys(STREAMS, 3)
            for stream in STREAMS:
                await settled(bus, stream)
            assert await bus.read_events("ns", "kept") == kept_events
        finally:
            await bus.close()
        admin = await nats.connect(**cluster.client_options("admin"))
        try:
            ledger = await admin.jetstream().key_value(protocol.LEDGER_BUCKET)
            effects = await admin.jetstream().key_value(protocol.EFFECTS_BUCKET)
            assert ((await ledger.get("kept")).value, (await effects.get("kept")).value) == (
                b"1",
                b"2",
            )
        finally:
            await admin.close()
    finally:
        cluster.stop()
