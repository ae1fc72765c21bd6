"""The ``agentrun`` command line (console script ``agentrun``).

Each subcommand is one ``register_<name>(subparsers)`` function that adds its parser and sets
``handler`` to a ``cmd_<name>(args) -> int`` function returning the exit code. `COMMANDS`
lists the runtime's registrars; to add ``agentrun pause RUN``, write ``register_pause`` and
``cmd_pause`` and append ``register_pause`` to `COMMANDS`. Other distributions add
subcommands through the ``agentrun.cli`` entry point group (`PLUGIN_GROUP`): each entry point
names a registrar of the same shape. ``agentrun dev …`` (the local stack) comes that way from
the ``agentrun-dev`` distribution (``devtools/`` in the repository); without it, ``agentrun
dev`` says to install it. `main` maps the errors our modules raise (which say what to do next)
to a one-line message and exit status 1.

What belongs here: the ``agentrun`` program: its parser, its plugins, its exit statuses and the
commands only it has (``nats bootstrap|rotate|adopt-store``: the closed bus's Secrets;
``signing bootstrap|rotate|retire``: the run-signing keys).
What does not: the Kubernetes calls and the run commands it shares with ``kubectl agentrun``
(``control``: ``cancel``, ``approve``, ``deny`` over one API session per command).

A command imports the clients it uses (Kubernetes, NATS) when it runs, not with this module:
``--help`` and a usage error import none of them.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
from collections.abc import Callable, Sequence
from importlib import metadata
from typing import TypeAlias

from agentrun import display
from agentrun.cli import control
from agentrun.cli.check import register_check

Handler = Callable[[argparse.Namespace], int]
Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"  # no public name
Registrar = Callable[[Subparsers], None]

PLUGIN_GROUP = "agentrun.cli"
"""Entry point group whose entry points are extra registrars (``dev`` from agentrun-dev)."""

DEV_MISSING = (
    "`agentrun dev` (the local stack: control plane, nats-server, mock model, operator, "
    "workers) is in the agentrun-dev distribution: install agentrun-dev "
    "(`pip install -e ./devtools` in a checkout; `make demo` and `make test` install it)"
)


def register_cancel(subparsers: Subparsers) -> None:
    """``agentrun cancel RUN``: annotate the AgentRun so the operator ends it ``cancelled``."""
    cancel = subparsers.add_parser(
        "cancel",
        help="cancel a run (sets the agentrun.dev/cancel annotation)",
        description="End an AgentRun (running, awaiting approval or queued) with terminal reason "
        "`cancelled`: no new model or tool call starts after the operator sees it; a queued run "
        "leaves its tenant's queue. Uses KUBECONFIG, like kubectl.",
    )
    cancel.add_argument("run", metavar="RUN", help="AgentRun name")
    cancel.add_argument("-n", "--namespace", default="default", help="namespace (default: default)")
    cancel.set_defaults(handler=control.cmd_cancel)


def register_review(subparsers: Subparsers) -> None:
    """``agentrun approve|deny RUN``: decide the run's pending held tool call."""
    for verb, text in (("approve", "run"), ("deny", "refuse")):
        review = subparsers.add_parser(
            verb,
            help=f"{verb} the tool call a run is waiting on (phase AwaitingApproval)",
            description=f"Reads .status.pendingApproval of RUN, shows the call in full, and sets "
            f"the agentrun.dev/{verb} annotation to its digest: the operator will {text} exactly "
            "that call (same tool, same arguments) and nothing else. Uses KUBECONFIG.",
        )
        review.add_argument("run", metavar="RUN", help="AgentRun name")
        review.add_argument("-n", "--namespace", default="default", help="namespace")
        control.add_digest_option(review, verb=verb)
        review.set_defaults(handler=control.cmd_review, verb=verb)


def register_dev_missing(subparsers: Subparsers) -> None:
    """``agentrun dev …`` when agentrun-dev is not installed: say how to get it (exit 1)."""
    dev = subparsers.add_parser(
        "dev", help="the local stack (needs agentrun-dev)", description=DEV_MISSING
    )
    dev.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    dev.set_defaults(handler=cmd_dev_missing)


def register_nats(subparsers: Subparsers) -> None:
    """``agentrun nats bootstrap|rotate|adopt-store|status``: the closed bus's keys and
    credentials in Kubernetes Secrets (``agentrun.natsauth.bootstrap``), the open bus's store
    adopted, and a read-only look at the streams and consumers for runbooks."""
    nats_cmd = subparsers.add_parser(
        "nats",
        help="NATS identities and credentials of an installation (the chart's hooks use it)",
        description="Keys, credentials and the server's auth configuration of the closed bus, "
        "kept in Kubernetes Secrets named PREFIX-keys, -operator, -worker and -server.",
    )
    verbs = nats_cmd.add_subparsers(dest="verb", required=True, metavar="VERB")
    for verb, text in (
        ("bootstrap", "make the Secrets that are missing (idempotent; never overwrites creds)"),
        ("rotate", "replace ROLE's user with a new one and revoke the old one"),
    ):
        parser = verbs.add_parser(verb, help=text, description=text)
        parser.add_argument("-n", "--namespace", required=True, help="namespace of the Secrets")
        parser.add_argument(
            "--prefix", required=True, help="Secret name prefix, e.g. agentrun-nats"
        )
        if verb == "rotate":
            parser.add_argument("role", choices=["operator", "worker"], help="whose user")
        parser.set_defaults(handler=cmd_nats)
    adopt = verbs.add_parser(
        "adopt-store",
        help="move an open server's JetStream data ($G) under the AGENTRUN account",
        description="Before a closed nats-server starts on the store an open one used: move "
        "STORE/$G to STORE/<account>, unless that exists (runs and buckets are kept).",
    )
    adopt.add_argument("--store", required=True, help="JetStream's directory (…/jetstream)")
    adopt.add_argument("--account-file", required=True, help="file holding the account key")
    adopt.set_defaults(handler=cmd_nats)
    status = verbs.add_parser(
        "status",
        help="agentrun's streams and consumers: stored bytes and messages, lag (read-only)",
        description="Connect as this process's environment says (AGENTRUN_NATS_URL, "
        "AGENTRUN_NATS_CREDS_FILE, AGENTRUN_NATS_CA_FILE: in the operator's pod, its own "
        "identity) and print what each stream stores, each durable consumer's lag and the "
        "share of the store used (AGENTRUN_JETSTREAM_STORE_BYTES).",
    )
    status.set_defaults(handler=cmd_nats)


def register_signing(subparsers: Subparsers) -> None:
    """``agentrun signing bootstrap|rotate|retire``: the run-signing keys with which the
    operator seals what it admits, in Kubernetes Secrets (``agentrun.trust.secrets``)."""
    signing = subparsers.add_parser(
        "signing",
        help="the operator's run-signing keys (the chart's hook bootstraps them)",
        description="The Ed25519 keys with which the operator seals every run config it admits "
        "and every approval, kept in the Secrets PREFIX-signing (private, the operator's) and "
        "PREFIX-trust (public, every process's).",
    )
    verbs = signing.add_subparsers(dest="verb", required=True, metavar="VERB")
    for verb, text in (
        ("bootstrap", "make the keys that are missing (idempotent; never replaces a key)"),
        ("rotate", "add a new key: trusted at once, signing after --activate-after seconds"),
        ("retire", "untrust KEY_ID once no run still going can carry its seal"),
    ):
        parser = verbs.add_parser(verb, help=text, description=text)
        parser.add_argument("-n", "--namespace", required=True, help="namespace of the Secrets")
        parser.add_argument("--prefix", required=True, help="Secret name prefix, e.g. agentrun")
        if verb == "rotate":
            parser.add_argument(
                "--activate-after",
                type=float,
                default=120.0,
                help="seconds before the new key signs (default 120: every pod's mounted "
                "Secret has the new public key by then)",
            )
        if verb == "retire":
            parser.add_argument("key_id", metavar="KEY_ID", help="the key to untrust")
        parser.set_defaults(handler=cmd_signing)


COMMANDS: list[Registrar] = [
    register_cancel,
    register_review,
    register_check,
    register_nats,
    register_signing,
]
"""The runtime's own registrars of top-level subcommands, in help order."""


def plugin_registrars() -> dict[str, Registrar]:
    """The registrars other distributions declare in `PLUGIN_GROUP`, by entry point name.

    Raises ImportError (or what the plugin's import raises) when a declared plugin is broken.
    """
    return {ep.name: ep.load() for ep in metadata.entry_points(group=PLUGIN_GROUP)}


def build_parser() -> argparse.ArgumentParser:
    """The ``agentrun`` parser: every subcommand of `COMMANDS`, then the plugins'.

    Without a ``dev`` plugin, ``agentrun dev`` is `register_dev_missing`'s explanation.
    """
    parser = argparse.ArgumentParser(
        prog="agentrun", description="A Kubernetes-native runtime for LLM agent loops."
    )
    parser.set_defaults(handler=lambda _: _usage(parser), prog=parser.prog)
    subparsers = parser.add_subparsers(title="commands", metavar="COMMAND")
    plugins = plugin_registrars()
    plugins.setdefault("dev", register_dev_missing)
    for register in [*COMMANDS, *plugins.values()]:
        register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``agentrun`` with `argv` (default ``sys.argv[1:]``); return the exit status.

    0 is success, 1 an error (printed as one line on stderr), 2 a usage error, 130 Ctrl-C.
    """
    control.quiet_library_noise()
    args = build_parser().parse_args(argv)
    handler: Handler = args.handler
    try:
        return handler(args)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        if not isinstance(exc, (subprocess.SubprocessError, *_client_errors())):
            raise
        print(display.printable(f"agentrun: error: {exc}"), file=sys.stderr)
        return 1


def _client_errors() -> tuple[type[Exception], ...]:
    """Ours (``OSError``, ``RuntimeError``) and the Kubernetes client's configuration error,
    printed as one line; imported after a command failed, on that path only."""
    from kubernetes_asyncio.config.config_exception import ConfigException

    return (OSError, RuntimeError, ConfigException)


def cmd_dev_missing(args: argparse.Namespace) -> int:
    """``agentrun dev …`` without agentrun-dev: print `DEV_MISSING`, exit 1."""
    del args
    print(f"agentrun: error: {DEV_MISSING}", file=sys.stderr)
    return 1


def cmd_nats(args: argparse.Namespace) -> int:
    """``agentrun nats VERB``: print what was made or changed."""
    from pathlib import Path

    from kubernetes_asyncio import client

    from agentrun import kube
    from agentrun.natsauth import bootstrap
    from agentrun.natsauth.permissions import Role

    if args.verb == "status":
        return asyncio.run(_bus_status())
    if args.verb == "adopt-store":
        account = Path(args.account_file).read_text().strip()
        moved = bootstrap.adopt_store(Path(args.store), account)
        print(f"moved {args.store}/$G to {account}" if moved else "nothing to adopt")
        return 0

    async def run() -> int:
        api = await kube.api_client()
        try:
            store = bootstrap.SecretStore(client.CoreV1Api(api), args.namespace)
            names = bootstrap.SecretNames(args.prefix)
            if args.verb == "rotate":
                public = await bootstrap.rotate(store, names, Role(args.role))
                print(f"{args.role}: new user {public}; the previous one is revoked")
                return 0
            outcome = await bootstrap.bootstrap(store, names)
            print(f"created: {', '.join(outcome.created) or 'nothing'}")
            print(f"updated: {', '.join(outcome.updated) or 'nothing'}")
            return 0
        finally:
            await api.close()

    return asyncio.run(run())


async def _bus_status() -> int:
    """``agentrun nats status``: one look at the bus (``Bus.stats``), printed as tables."""
    from agentrun.bus import Bus, BusSettings
    from agentrun.settings import OperatorSettings

    settings = OperatorSettings()
    bus = await Bus.connect(
        BusSettings(url=settings.nats_url, auth=settings.nats_auth),
        name="agentrun-nats-status",
        provision=False,
    )
    try:
        stats = await bus.stats()
    finally:
        await bus.close()
    print(f"{'STREAM':<28}{'MESSAGES':>12}{'BYTES':>16}")
    for stream, (size, messages) in stats.streams.items():
        print(f"{stream:<28}{messages:>12}{size:>16}")
    print(f"\n{'CONSUMER':<28}{'PENDING':>12}{'ACK PENDING':>16}")
    for consumer, (pending, ack_pending) in stats.consumers.items():
        print(f"{consumer:<28}{pending:>12}{ack_pending:>16}")
    used = sum(size for size, _ in stats.streams.values())
    limit = settings.jetstream_store_bytes
    share = f"{used / limit:.1%} of {limit}" if limit else "store size unknown"
    print(f"\nstore: {used} bytes used ({share})")
    return 0


def cmd_signing(args: argparse.Namespace) -> int:
    """``agentrun signing VERB``: print what was made or changed. A key Secret that cannot be
    read as keys is a ``RuntimeError`` naming it (one line, exit 1)."""
    import time

    from kubernetes_asyncio import client

    from agentrun import kube
    from agentrun.natsauth.bootstrap import SecretStore
    from agentrun.trust import KeyFileError, secrets

    async def run() -> int:
        api = await kube.api_client()
        try:
            store = SecretStore(client.CoreV1Api(api), args.namespace)
            names = secrets.SecretNames(args.prefix)
            if args.verb == "rotate":
                key = await secrets.rotate(
                    store, names, now=time.time(), activate_after=args.activate_after
                )
                print(f"new key {key.id}: trusted now, signs from {key.active_from:.0f}")
            elif args.verb == "retire":
                admitted = await secrets.admitted_times(api)
                await secrets.retire(store, names, args.key_id, admitted=admitted, now=time.time())
                print(f"key {args.key_id} retired: seals naming it are refused")
            else:
                changed = await secrets.bootstrap(store, names, now=time.time())
                print(f"created or updated: {', '.join(changed) or 'nothing'}")
            return 0
        except KeyFileError as err:
            raise RuntimeError(f"a run-signing key Secret is malformed: {err}") from err
        finally:
            await api.close()

    return asyncio.run(run())


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2
