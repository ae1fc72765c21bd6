"""nats-server starts with JetStream enabled and answers a client."""

from __future__ import annotations

from pathlib import Path

import nats
import nats.errors
import pytest

from agentrun.natsauth import Authority
from agentrun.natsclient import NatsAuth, connect_options
from agentrun_dev import natsserver


async def test_jetstream_answers_account_info(nats_server: natsserver.NatsServer) -> None:
    client = await nats.connect(**nats_server.client_options())
    try:
        jetstream = client.jetstream()
        info = await jetstream.account_info()
        assert info.limits is not None
        await jetstream.add_stream(name="DEVENV_CHECK", subjects=["devenv.check"])
        ack = await jetstream.publish("devenv.check", b"hello")
        assert ack.stream == "DEVENV_CHECK"
        assert ack.seq == 1
        await jetstream.delete_stream("DEVENV_CHECK")
    finally:
        await client.close()


def test_the_store_lives_in_the_given_directory(nats_server: natsserver.NatsServer) -> None:
    assert nats_server.store_dir.is_dir()
    assert nats_server.component.is_alive()
    assert nats_server.url.startswith("tls://127.0.0.1:")


async def test_a_given_server_trusts_the_users_of_the_auth_conf_it_was_given(
    tmp_path: Path,
) -> None:
    """``start_given_server``: a platform's own server (docs/install.md, "Bringing your own
    NATS") trusting an ``auth.conf`` made elsewhere — here by an authority of the test, as
    ``agentrun nats bootstrap`` makes one — on the address asked, TLS by its own CA; a user of
    another authority is refused."""
    authority, stranger = Authority.generate(), Authority.generate()
    server = natsserver.start_given_server(
        tmp_path / "given", host="127.0.0.1", auth_conf=authority.server_config()
    )
    try:
        assert server.url.startswith("tls://127.0.0.1:") and server.auth_dir is not None
        ca = server.auth_dir / "ca.crt"

        def auth_of(users: Authority, name: str) -> NatsAuth:
            creds = tmp_path / f"{name}.creds"
            creds.write_text(users.mint_unrestricted(name=name).text())
            return NatsAuth(creds_file=creds, ca_file=ca)

        client = await nats.connect(server.url, **connect_options(auth_of(authority, "ours")))
        try:
            assert (await client.jetstream().account_info()).limits is not None
        finally:
            await client.close()
        with pytest.raises(nats.errors.Error):
            await nats.connect(
                server.url,
                allow_reconnect=False,
                max_reconnect_attempts=0,
                **connect_options(auth_of(stranger, "theirs")),
            )
    finally:
        server.stop()
