"""``agentrun-trajectory``: the trajectory API server's entry point (console script).

Serves ``trajectory.agentrun.dev/v1alpha1`` over HTTPS for the kube-apiserver's aggregation
layer (the chart's APIService points at it). Flags (each with an environment default):

- ``--bind-address`` (``0.0.0.0``), ``--secure-port`` (8443);
- ``--tls-cert-file``, ``--tls-private-key-file``: its serving certificate (the APIService's
  ``caBundle`` signs it);
- ``--nats-url`` (``AGENTRUN_NATS_URL``), ``--nats-ca`` (``AGENTRUN_NATS_CA_FILE``);
- ``--reader-signer-file``, ``--account-file``: the readers' signing key seed and the
  ``AGENTRUN`` account's public key (``reader-signer.nk``, ``account.pub`` of the operator's
  NATS Secret);
- ``--trust-any-front-proxy-certificate`` (off): believe any client certificate of the
  request-header CA when the cluster allows no front-proxy name *and* that CA is also its
  client CA (``access.FrontProxy.untrusted``; off, every trajectory read is then refused
  ``401`` and the reason logged at start). Only for a cluster where no user holds a client
  certificate of that CA;
- ``--event-budget-mib`` (32): MiB of event records held at once across every read and
  follow (``server.EVENT_BUDGET``); a read or follow waits for room, nothing is dropped.

It needs, in Kubernetes: ``get`` on ``kube-system/extension-apiserver-authentication``
(the Role ``extension-apiserver-authentication-reader``), ``create`` on
SubjectAccessReviews (the ClusterRole ``system:auth-delegator``), and, to share its places
and bytes by AgentTenant (``tenants``), ``get``, ``list`` and ``watch`` on AgentTenants and
``get`` on namespaces (the chart's ClusterRole ``<fullname>-trajectory:tenants``); nothing
else. The front-proxy
configuration is read once at start-up: restart the server when the cluster's request-header CA
changes. Exit status 1 with one line on stderr when it cannot start; 0 after SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from aiohttp import web
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.config.config_exception import ConfigException

from agentrun import bytebudget, kube, loops
from agentrun.trajectoryapi import access, server, tenants


def build_parser() -> argparse.ArgumentParser:
    """The command line (see the module docstring)."""
    env = os.environ.get
    parser = argparse.ArgumentParser(prog="agentrun-trajectory", description=__doc__)
    parser.add_argument("--bind-address", default="0.0.0.0")
    parser.add_argument("--secure-port", type=int, default=8443)
    parser.add_argument("--tls-cert-file", type=Path, required=True)
    parser.add_argument("--tls-private-key-file", type=Path, required=True)
    parser.add_argument("--nats-url", default=env("AGENTRUN_NATS_URL", "nats://127.0.0.1:4222"))
    ca = env("AGENTRUN_NATS_CA_FILE")
    parser.add_argument("--nats-ca", type=Path, default=Path(ca) if ca else None)
    parser.add_argument("--reader-signer-file", type=Path, required=True)
    parser.add_argument("--account-file", type=Path, required=True)
    parser.add_argument("--trust-any-front-proxy-certificate", action="store_true")
    parser.add_argument(
        "--event-budget-mib", type=int, default=server.EVENT_BUDGET // 2**20, metavar="MIB"
    )
    return parser


async def serve(args: argparse.Namespace) -> None:
    """Start the server and serve until SIGTERM or SIGINT.

    Raises ConfigException (no Kubernetes configuration), ApiException (the front-proxy
    ConfigMap cannot be read), ValueError (it names no request-header CA, a bad key file, an
    event budget under 1 byte),
    OSError (a file or the port).
    """
    reader = server.Reader.from_files(
        args.nats_url,
        signer_file=args.reader_signer_file,
        account_file=args.account_file,
        ca_file=args.nats_ca,
    )
    api = await kube.api_client()
    try:
        proxy = await server.front_proxy(api, trust_any_name=args.trust_any_front_proxy_certificate)
        context = server.tls_context(
            cert_file=args.tls_cert_file, key_file=args.tls_private_key_file,
            client_ca=proxy.client_ca,
        )  # fmt: skip
        with tempfile.TemporaryDirectory(prefix="agentrun-trajectory-") as scratch:
            parties = tenants.Parties(tenants.KubeTenants(api))
            following = asyncio.create_task(parties.follow(), name="agenttenants")
            loops.log_failure(following, what="the watch of AgentTenants")
            app = server.Server(
                proxy=proxy, api=api, reader=reader, scratch=Path(scratch),
                event_bytes=bytebudget.ByteBudget(args.event_budget_mib * 2**20), parties=parties,
            ).app()  # fmt: skip
            # a follow whose client left is cancelled (aiohttp's default is to let it run)
            runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
            await runner.setup()
            site = web.TCPSite(runner, args.bind_address, args.secure_port, ssl_context=context)
            await site.start()
            logging.getLogger("agentrun.trajectoryapi").info(
                "serving %s on %s:%d", access.GROUP_VERSION, args.bind_address,
                args.secure_port,
            )  # fmt: skip
            await _stopped()
            following.cancel()
            await runner.cleanup()
    finally:
        await api.close()


async def _stopped() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


def main(argv: Sequence[str] | None = None) -> int:
    """Run the server; 0 after a stop signal, 1 when it cannot start (one line on stderr)."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    try:
        asyncio.run(serve(args))
    except (ConfigException, ApiException, ValueError, OSError) as err:
        print(f"agentrun-trajectory: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
