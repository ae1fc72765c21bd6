"""``kubectl agentrun``: the kubectl plugin (console script ``kubectl-agentrun``).

kubectl runs any ``kubectl-<name>`` executable on ``PATH`` as ``kubectl <name>``, so installing
the package makes ``kubectl agentrun get|logs|describe|eval|approve|deny|cancel|rerun`` work.
The Kubernetes calls and the approve/deny/cancel commands are those the ``agentrun`` command
uses too (``control``); this module adds the views: a table of runs, a run described, its
trajectory read from the run's event stream (``logs``; ``-f`` follows it live), an AgentEval's
verdict and case table (``eval``) and a rerun.

``logs`` reads the run's events (the source of truth) through the trajectory API with the
kubeconfig alone (``trajectoryapi``: RBAC ``get`` on ``agentruntrajectories`` decides). Only
where the cluster does not serve that API does it say so on stderr and read NATS JetStream
itself: the server is ``--nats-url``, else ``AGENTRUN_NATS_URL``, else
``nats://127.0.0.1:4222`` (from outside the cluster: ``kubectl port-forward svc/<release>-nats
4222``), with the credentials of ``--nats-creds`` (else ``AGENTRUN_NATS_CREDS_FILE``) and the
CA of ``--nats-ca`` (else ``AGENTRUN_NATS_CA_FILE``) on a closed bus. Every other command
needs only the kubeconfig, like kubectl; the namespace defaults to the current context's.

kubectl's global flags work on every command, before or after it (``kubeflags``):
``-n/--namespace``, ``--kubeconfig``, ``--context``, ``--as`` and ``--as-group``
(impersonation: the API server decides with the impersonated user's RBAC).

Exit status: 0 success, 1 an error (one line on stderr), 2 a usage error, 130 Ctrl-C.

Each command imports what only it uses when it runs: the Kubernetes client (through
``control``), NATS and the event model (``logs``), the kernel's views (``describe``). ``--help``
and a usage error import none of them, ``get`` only the Kubernetes client;
``tests/plugin/test_startup.py`` keeps it so.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import sys
from collections.abc import Sequence
from decimal import Decimal, InvalidOperation
from typing import Any

from agentrun import display
from agentrun.cli import control, kubeflags

PROG = "kubectl agentrun"
DEFAULT_NATS_URL = "nats://127.0.0.1:4222"
RERUN_LABEL = "agentrun.dev/rerun-of"
"""Set by ``rerun`` on the new run: the name of the run it repeats."""


def build_parser() -> argparse.ArgumentParser:
    """The plugin's parser: one subcommand per verb, each with (most) ``-o``; kubectl's global
    flags (``-n``, ``--kubeconfig``, ``--context``, ``--as``, ``--as-group``) on the plugin and
    on every subcommand."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Inspect and steer agentrun AgentRuns: a table, a description, the "
        "trajectory (live with -f), approvals, cancellation and reruns.",
    )
    parser.set_defaults(handler=None, prog=PROG)
    kubeflags.add_options(parser, top=True)
    parser.add_argument(
        "-n", "--namespace", default=None, help="namespace (default: the current context's)"
    )
    commands = parser.add_subparsers(title="commands", metavar="COMMAND")

    def add(name: str, help_text: str, *, output: bool = True) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help_text, description=help_text)
        sub.add_argument(
            "-n",
            "--namespace",
            default=argparse.SUPPRESS,
            help="namespace (default: the current context's)",
        )
        kubeflags.add_options(sub, top=False)
        if output:
            sub.add_argument(
                "-o",
                "--output",
                choices=["table", "json"],
                default="table",
                help="json: the objects as the API server returns them",
            )
        return sub

    get = add("get", "list AgentRuns: tenant, phase, reason, queue position, usage, cost, age")
    get.add_argument("run", metavar="RUN", nargs="?", help="one AgentRun (default: all)")
    get.add_argument("-A", "--all-namespaces", action="store_true", help="every namespace")
    get.set_defaults(handler=cmd_get)

    logs = add(
        "logs",
        "print a run's trajectory from its event stream: model turns, tool calls "
        "and results (truncated), corrections, usage, the end",
    )
    logs.add_argument("run", metavar="RUN")
    logs.add_argument(
        "-f",
        "--follow",
        action="store_true",
        help="keep printing each turn as it commits, until the run ends",
    )
    logs.add_argument(
        "--nats-url",
        default=None,
        help="NATS server holding the run events, read only where the cluster does not serve "
        f"the trajectory API (default: $AGENTRUN_NATS_URL, else {DEFAULT_NATS_URL})",
    )
    logs.add_argument(
        "--nats-creds",
        default=None,
        help="NATS .creds file to read with (default: $AGENTRUN_NATS_CREDS_FILE)",
    )
    logs.add_argument(
        "--nats-ca",
        default=None,
        help="CA file the NATS server's certificate must chain to, for TLS "
        "(default: $AGENTRUN_NATS_CA_FILE)",
    )
    logs.set_defaults(handler=cmd_logs)

    describe = add(
        "describe",
        "describe a run: spec, Agent, tenant, usage, approval, "
        "conditions, answer and its Kubernetes Events",
    )
    describe.add_argument("run", metavar="RUN")
    describe.set_defaults(handler=cmd_describe)

    for verb in ("approve", "deny"):
        review = add(verb, f"{verb} the tool call a run is waiting on", output=False)
        review.add_argument("run", metavar="RUN")
        control.add_digest_option(review, verb=verb)
        review.set_defaults(handler=control.cmd_review, verb=verb)

    cancel = add("cancel", "cancel a run (running, awaiting approval or queued)", output=False)
    cancel.add_argument("run", metavar="RUN")
    cancel.set_defaults(handler=control.cmd_cancel)

    suite = add(
        "eval",
        "show an AgentEval's verdict and its cases: phase, run, terminal reason, steps, "
        "tokens, cost, and every expectation a failed case missed",
    )
    suite.add_argument("eval", metavar="EVAL")
    suite.set_defaults(handler=cmd_eval)

    rerun = add(
        "rerun",
        "create a new run with the same spec (a run of an Agent resolves the Agent as it is now)",
    )
    rerun.add_argument("run", metavar="RUN")
    rerun.add_argument("--name", default=None, help="the new run's name (default: RUN-<random>)")
    rerun.set_defaults(handler=cmd_rerun)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Console script ``kubectl-agentrun``; returns the exit status."""
    control.quiet_library_noise()
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.handler is None:
        parser.print_help(sys.stderr)
        return 2
    options = kubeflags.KubeOptions.from_args(args)
    try:
        options.headers()
    except ValueError as err:
        parser.error(str(err))  # exits 2, like any usage error
    if args.namespace is None:
        args.namespace = kubeflags.current_namespace(options)
    try:
        code: int = args.handler(args)
        return code
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        if not isinstance(exc, reported_errors()):
            raise
        print(display.printable(f"{PROG}: error: {exc}"), file=sys.stderr)
        return 1


def reported_errors() -> tuple[type[Exception], ...]:
    """The errors `main` prints as one line (exit 1): ours (``OSError``, ``RuntimeError``) and
    those of the Kubernetes, NATS and HTTP clients. Called after a command failed, so their
    import is paid on that path only."""
    import aiohttp
    import nats.errors
    from kubernetes_asyncio.config.config_exception import ConfigException

    return (OSError, RuntimeError, ConfigException, nats.errors.Error, aiohttp.ClientError)


# --- get ----------------------------------------------------------------------------------------


def age(timestamp: str | None, *, now: float) -> str:
    """kubectl's age: ``45s``, ``3m``, ``2h``, ``4d``; ``<unknown>`` without a timestamp."""
    if not timestamp:
        return "<unknown>"
    then = datetime.datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()
    seconds = max(0, int(now - then))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size * (2 if unit != "m" else 1):
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def money(cost: object) -> str:
    """A COST cell: four decimal places, or the exact decimal where those would show a cost
    that is not zero as ``$0.0000`` (a cheap model's run); ``-`` when there is none."""
    if not cost:
        return "-"
    try:
        exact = Decimal(str(cost))
    except InvalidOperation:
        return str(cost)
    shown = f"{float(exact):.4f}"
    if exact != 0 and float(shown) == 0:
        return f"${exact.normalize():f}"
    return f"${shown}"


def run_row(obj: dict[str, Any], *, now: float) -> dict[str, str]:
    """One table row: the columns ``get`` shows, as text."""
    status = obj.get("status") or {}
    usage = status.get("usage") or {}
    meta = obj.get("metadata") or {}
    return {
        "NAMESPACE": str(meta.get("namespace", "")),
        "NAME": str(meta.get("name", "")),
        "TENANT": str(status.get("tenant") or "-"),
        "PHASE": str(status.get("phase") or "Pending"),
        "REASON": str(status.get("terminalReason") or "-"),
        "QUEUE": str(status.get("queuePosition") or "-"),
        "STEPS": str(usage.get("steps", "-")),
        "TOKENS": str(usage.get("totalTokens", "-")),
        "COST": money(usage.get("costUSD")),
        "AGE": age(meta.get("creationTimestamp"), now=now),
    }


def table(rows: list[dict[str, str]], columns: Sequence[str]) -> str:
    """Left-aligned columns separated by three spaces, as kubectl prints them."""
    widths = {c: max([len(c), *(len(r[c]) for r in rows)]) for c in columns}
    lines = ["   ".join(c.ljust(widths[c]) for c in columns).rstrip()]
    lines += ["   ".join(r[c].ljust(widths[c]) for c in columns).rstrip() for r in rows]
    return "\n".join(lines)


def cmd_get(args: argparse.Namespace) -> int:
    """``get [RUN] [-A]``: the table (or ``-o json``)."""

    async def get() -> list[dict[str, Any]]:
        async with control.RunClient(args.namespace, kubeflags.KubeOptions.from_args(args)) as runs:
            if args.run:
                return [await runs.get(args.run)]
            return await runs.list_runs(all_namespaces=args.all_namespaces)

    items = asyncio.run(get())
    if args.output == "json":
        body: Any = items[0] if args.run else {"apiVersion": "v1", "kind": "List", "items": items}
        print(json.dumps(body, indent=2))
        return 0
    if not items:
        where = "any namespace" if args.all_namespaces else f"{args.namespace} namespace"
        print(f"No AgentRuns found in {where}.", file=sys.stderr)
        return 0
    now = datetime.datetime.now(datetime.UTC).timestamp()
    columns = ["NAME", "TENANT", "PHASE", "REASON", "QUEUE", "STEPS", "TOKENS", "COST", "AGE"]
    if args.all_namespaces:
        columns.insert(0, "NAMESPACE")
    print(display.printable(table([run_row(obj, now=now) for obj in items], columns)))
    return 0


# --- logs, describe: modules of their own, imported when the command runs ------------------------


def cmd_logs(args: argparse.Namespace) -> int:
    """``logs RUN [-f]``: the trajectory; ``-f`` follows until the run ends (``logs``)."""
    from agentrun.cli import logs

    url = args.nats_url or os.environ.get("AGENTRUN_NATS_URL") or DEFAULT_NATS_URL
    return logs.cmd_logs(args, nats_url=url)


def cmd_describe(args: argparse.Namespace) -> int:
    """``describe RUN``: the run and its Events (``describe``)."""
    from agentrun.cli import describe

    return describe.cmd_describe(args)


# --- eval ---------------------------------------------------------------------------------------


def eval_lines(obj: dict[str, Any]) -> list[str]:
    """An AgentEval as a person reads it: the verdict, the case table, then each failed case
    with the expectations it missed."""
    meta = obj.get("metadata") or {}
    status = obj.get("status") or {}
    summary = status.get("summary") or {}
    agent = status.get("agent") or {}
    conditions = {c.get("type"): c for c in status.get("conditions") or []}
    lines = [
        f"{meta.get('name', '')}: {status.get('phase') or 'Pending'}, "
        f"{summary.get('passed', 0)} passed, {summary.get('failed', 0)} failed of "
        f"{summary.get('total', 0)}",
    ]
    if agent:
        lines.append(
            f"Agent {agent.get('name', '')} generation {agent.get('generation', 0)}, "
            f"round {status.get('round', '')}"
        )
    passed = conditions.get("Passed")
    if passed is not None and passed.get("reason") == "InvalidSpec":
        lines.append(f"invalid: {passed.get('message', '')}")
    cases = status.get("cases") or []
    if cases:
        rows = [
            {
                "CASE": str(row.get("name", "")),
                "PHASE": str(row.get("phase", "")),
                "RUN": str(row.get("run", "")),
                "REASON": str(row.get("reason") or "-"),
                "STEPS": str(row.get("steps", "-")) if "passed" in row else "-",
                "TOKENS": str(row.get("tokens", "-")) if "passed" in row else "-",
                "COST": money(row.get("costUSD")),
            }
            for row in cases
        ]
        columns = ["CASE", "PHASE", "RUN", "REASON", "STEPS", "TOKENS", "COST"]
        lines += ["", *table(rows, columns).splitlines()]
    failed = [row for row in cases if row.get("phase") == "Failed"]
    if failed:
        lines += ["", "Failed:"]
        lines += [f"  {row.get('name', '')}: {row.get('message', '')}" for row in failed]
    return lines


def cmd_eval(args: argparse.Namespace) -> int:
    """``eval EVAL``: the verdict and the case table (``-o json``: the object); exit status 1
    when the suite failed."""

    async def get() -> dict[str, Any]:
        async with control.RunClient(args.namespace, kubeflags.KubeOptions.from_args(args)) as runs:
            return await runs.get_eval(args.eval)

    obj = asyncio.run(get())
    if args.output == "json":
        print(json.dumps(obj, indent=2))
    else:
        print(display.printable("\n".join(eval_lines(obj))))
    return 1 if (obj.get("status") or {}).get("phase") == "Failed" else 0


# --- rerun --------------------------------------------------------------------------------------


def rerun_manifest(obj: dict[str, Any], *, name: str | None) -> dict[str, Any]:
    """A new AgentRun with ``obj``'s spec and labels, named ``name`` or ``<name>-<random>``,
    labelled ``agentrun.dev/rerun-of``."""
    meta = obj.get("metadata") or {}
    labels = {**(meta.get("labels") or {}), RERUN_LABEL: meta.get("name", "")}
    new_meta: dict[str, Any] = {"labels": labels}
    if name:
        new_meta["name"] = name
    else:
        new_meta["generateName"] = f"{str(meta.get('name', 'run'))[:56]}-"
    return {
        "apiVersion": obj.get("apiVersion", "agentrun.dev/v1alpha1"),
        "kind": "AgentRun",
        "metadata": new_meta,
        "spec": obj.get("spec") or {},
    }


def cmd_rerun(args: argparse.Namespace) -> int:
    """``rerun RUN [--name NEW]``: create the new run and print its name."""

    async def rerun() -> dict[str, Any]:
        async with control.RunClient(args.namespace, kubeflags.KubeOptions.from_args(args)) as runs:
            return await runs.create(rerun_manifest(await runs.get(args.run), name=args.name))

    created = asyncio.run(rerun())
    if args.output == "json":
        print(json.dumps(created, indent=2))
    else:
        print(f"agentrun.agentrun.dev/{created['metadata']['name']} created")
    return 0
