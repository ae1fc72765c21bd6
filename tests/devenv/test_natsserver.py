"""nats-server starts with JetStream enabled and answers a client."""

from __future__ import annotations

import nats

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
