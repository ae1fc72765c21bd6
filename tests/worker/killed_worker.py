"""Child process: one turn of run ``uid`` of ``tenant`` through the worker's turn code with a
real ledger hold; the test SIGKILLs it mid-response. argv: nats url, creds|-, ca|-, bucket,
tenant, uid, model url."""

import asyncio
import sys
from pathlib import Path

import nats

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agentrun import kernel
from agentrun.ledger import LedgerStore, TurnRef
from agentrun.natsclient import NatsAuth, connect_options
from worker.rawmodel import one_turn


async def main() -> None:
    url, creds, ca, bucket, tenant, uid, model = sys.argv[1:8]
    auth = NatsAuth(None if creds == "-" else Path(creds), None if ca == "-" else Path(ca))
    client = await nats.connect(servers=url, **connect_options(auth))
    store = await LedgerStore.open(client.jetstream(), bucket=bucket)
    async with store.turn_hold(TurnRef(tenant, uid, "ns", uid, 0), ttl=3.0) as hold:
        await one_turn(
            model, limits=kernel.Limits(max_output_tokens=3000), hold=hold, pricing=kernel.Pricing()
        )


asyncio.run(main())
