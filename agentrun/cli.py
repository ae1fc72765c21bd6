"""The ``agentrun`` command line.

Each subcommand is one ``register_<name>(subparsers)`` function that adds its parser and sets
``handler`` to a ``cmd_<name>(args) -> int`` function returning the exit code. `COMMANDS`
lists the registrars; to add ``agentrun cancel RUN``, write ``register_cancel`` and
``cmd_cancel`` and append ``register_cancel`` to `COMMANDS`. `main` maps the errors our
modules raise (which say what to do next) to a one-line message and exit status 1.

What belongs here: argument parsing and printing. The work is done by library modules
(e.g. `agentrun.devenv.stack`), so tests and other tools can call it without the CLI.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeAlias

from agentrun.devenv import binaries, console, demo, kubectl, stack, state

Handler = Callable[[argparse.Namespace], int]
_NODE_HELP = (
    "also run a real single node (containerd, kubelet, kube-proxy, CoreDNS, controller-manager, "
    "scheduler) so pods run; needs root and `make node-packages`"
)
Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"  # no public name


def register_dev(subparsers: Subparsers) -> None:
    """``agentrun dev up|down|status|env|binaries``: the local stack."""
    dev = subparsers.add_parser(
        "dev",
        help="run the local stack (cluster, nats, mock model, operator, workers)",
        description="Run agentrun locally. State and logs live in --dir "
        f"(default ${state.DIR_ENV} or ./{state.DEFAULT_DIR}).",
    )
    dev.set_defaults(handler=lambda _: _usage(dev))
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--dir", type=Path, default=None, help="state directory")
    commands = dev.add_subparsers(title="commands", metavar="COMMAND")

    up = commands.add_parser(
        "up", parents=[common], help="start the stack, or restart its dead components"
    )
    up.add_argument("--workers", type=int, default=2, metavar="N", help="workers (default 2)")
    up.add_argument(
        "--scenarios",
        type=Path,
        nargs="+",
        default=[stack.DEFAULT_SCENARIOS],
        metavar="FILE",
        help=f"mock model scenario files (default {stack.DEFAULT_SCENARIOS})",
    )
    up.add_argument("--crds", type=Path, default=None, metavar="DIR", help="CRD directory")
    up.add_argument("--node", action="store_true", help=_NODE_HELP)
    up.set_defaults(handler=cmd_dev_up)

    down = commands.add_parser(
        "down", parents=[common], help="stop everything by pid and remove the state"
    )
    down.set_defaults(handler=cmd_dev_down)
    status = commands.add_parser(
        "status", parents=[common], help="components, pids, ports, logs (exit 1: not all ok)"
    )
    status.set_defaults(handler=cmd_dev_status)
    env = commands.add_parser(
        "env", parents=[common], help="print `export` lines: eval $(agentrun dev env)"
    )
    env.set_defaults(handler=cmd_dev_env)
    show = commands.add_parser(
        "demo",
        parents=[common],
        help="bring the stack up, run the examples, print their phases, reasons and usage",
    )
    show.add_argument("--workers", type=int, default=2, metavar="N", help="workers (default 2)")
    show.add_argument(
        "--examples",
        type=Path,
        nargs="+",
        default=list(demo.DEFAULT_EXAMPLES),
        metavar="FILE",
        help="AgentRun manifests to apply (default: the three in examples/)",
    )
    show.add_argument("--node", action="store_true", help=_NODE_HELP)
    show.set_defaults(handler=cmd_dev_demo)
    build = commands.add_parser(
        "binaries", help="build (once per machine) or locate kube-apiserver, etcd and kubectl"
    )
    build.add_argument(
        "--node",
        action="store_true",
        help="also the node's binaries (kube-controller-manager, kube-scheduler, kubelet, "
        "kube-proxy, coredns), in one build",
    )
    build.set_defaults(handler=cmd_dev_binaries)


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
    cancel.set_defaults(handler=cmd_cancel)


def register_review(subparsers: Subparsers) -> None:
    """``agentrun approve|deny RUN``: decide the run's pending held tool call."""
    for verb, text in (("approve", "run"), ("deny", "refuse")):
        review = subparsers.add_parser(
            verb,
            help=f"{verb} the tool call a run is waiting on (phase AwaitingApproval)",
            description=f"Reads .status.pendingApproval of RUN, shows the call, and sets the "
            f"agentrun.dev/{verb} annotation to its digest: the operator will {text} exactly "
            "that call (same tool, same arguments) and nothing else. Uses KUBECONFIG.",
        )
        review.add_argument("run", metavar="RUN", help="AgentRun name")
        review.add_argument("-n", "--namespace", default="default", help="namespace")
        review.set_defaults(handler=cmd_review, verb=verb)


COMMANDS: list[Callable[[Subparsers], None]] = [register_dev, register_cancel, register_review]
"""Registrars of the top-level subcommands, in help order."""


def build_parser() -> argparse.ArgumentParser:
    """The ``agentrun`` parser with every subcommand of `COMMANDS`."""
    parser = argparse.ArgumentParser(
        prog="agentrun", description="A Kubernetes-native runtime for LLM agent loops."
    )
    parser.set_defaults(handler=lambda _: _usage(parser))
    subparsers = parser.add_subparsers(title="commands", metavar="COMMAND")
    for register in COMMANDS:
        register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``agentrun`` with `argv` (default ``sys.argv[1:]``); return the exit status.

    0 is success, 1 an error (printed as one line on stderr), 2 a usage error, 130 Ctrl-C.
    """
    args = build_parser().parse_args(argv)
    handler: Handler = args.handler
    try:
        return handler(args)
    except KeyboardInterrupt:
        return 130
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        print(f"agentrun: error: {exc}", file=sys.stderr)
        return 1


def cmd_dev_up(args: argparse.Namespace) -> int:
    """``agentrun dev up``: start the stack (or revive it), then print its status."""
    if args.workers < 0:
        print("agentrun: error: --workers must be ≥ 0", file=sys.stderr)
        return 2
    options = stack.UpOptions(
        workers=args.workers, scenarios=tuple(args.scenarios), crd_dir=args.crds, node=args.node
    )
    current = stack.up(state.resolve_dir(args.dir), options=options, log=_progress)
    demo.apply_mock_model(current)
    _print_status(current)
    print(f"\nAgentModel {demo.MODEL_NAME!r} points at the mock model: use `spec.model: mock`")
    print(f'use it from a shell: eval "$(agentrun dev env{_dir_option(args)})"')
    return 0


def cmd_dev_demo(args: argparse.Namespace) -> int:
    """``agentrun dev demo``: stack up, ``mock`` AgentModel, the examples, their end states."""
    options = stack.UpOptions(workers=args.workers, node=args.node)
    current = stack.up(state.resolve_dir(args.dir), options=options, log=_progress)
    demo.apply_mock_model(current)
    items = demo.run_examples(current, examples=args.examples, log=_progress)
    names = [item["metadata"]["name"] for item in items]
    kc = demo.kubectl_for(current)
    print("\n$ kubectl get agentruns")
    print(kc("get", "agentruns", "-n", "default", *names).stdout, end="")
    print("\nusage:")
    for line in demo.usage_summary(items):
        print(f"  {line}")
    demo.wait_tenant_settled(current)
    print("\n$ kubectl get agenttenants  # every run is charged to its namespace's tenant")
    print(kc("get", "agenttenants").stdout, end="")
    print(
        "\nThe stack is still up. Try:\n"
        f'  eval "$(.venv/bin/agentrun dev env{_dir_option(args)})"\n'
        "  kubectl get agentruns -o yaml\n"
        "  kubectl explain agentrun.spec.budget\n"
        "  kubectl get agenttenant default -o yaml   # used / reserved / remaining, resetTime\n"
        "Stop it with `make down` (agentrun dev down)."
    )
    return 0


def _run_status(kc: kubectl.Kubectl, args: argparse.Namespace) -> dict[str, Any] | None:
    """The run's ``.status`` ({} before the operator wrote one); ``None`` after printing why
    it could not be read (no such run, no cluster)."""
    try:
        out = kc("get", "agentrun", args.run, "-n", args.namespace, "-o", "json").stdout
    except kubectl.KubectlError as err:
        print(f"agentrun: error: {(err.stderr or '').strip() or err}", file=sys.stderr)
        return None
    status: dict[str, Any] = json.loads(out).get("status") or {}
    return status


def cmd_cancel(args: argparse.Namespace) -> int:
    """``agentrun cancel RUN``: ``kubectl annotate agentrun RUN agentrun.dev/cancel=true``."""
    kc = kubectl.Kubectl(binaries.find_kubectl(log=_progress), kubeconfig=_kubeconfig())
    status = _run_status(kc, args)
    if status is None:
        return 1
    if status.get("terminalReason"):
        print(f"{args.run} already ended: {status.get('phase')} / {status['terminalReason']}")
        return 0
    out = kc(
        "annotate",
        "agentrun",
        args.run,
        "-n",
        args.namespace,
        "agentrun.dev/cancel=true",
        "--overwrite",
    )
    print(out.stdout, end="")
    return 0


def cmd_review(args: argparse.Namespace) -> int:
    """``agentrun approve|deny RUN``: annotate the run with the pending call's digest."""
    kc = kubectl.Kubectl(binaries.find_kubectl(log=_progress), kubeconfig=_kubeconfig())
    status = _run_status(kc, args)
    if status is None:
        return 1
    pending = status.get("pendingApproval")
    if not pending:
        print(f"agentrun: error: {args.run} is not waiting for an approval", file=sys.stderr)
        return 1
    arguments = json.dumps(pending.get("arguments"), sort_keys=True)
    print(f"{args.verb}: {pending.get('tool')}({arguments}) call {pending.get('toolCallID')}")
    kc(
        "annotate",
        "agentrun",
        args.run,
        "-n",
        args.namespace,
        f"agentrun.dev/{args.verb}={pending['digest']}",
        "--overwrite",
    )
    return 0


def _kubeconfig() -> str:
    return os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")


def cmd_dev_down(args: argparse.Namespace) -> int:
    """``agentrun dev down``: stop everything recorded, in reverse order."""
    stack.down(state.resolve_dir(args.dir), log=_progress)
    return 0


def cmd_dev_status(args: argparse.Namespace) -> int:
    """``agentrun dev status``: 0 if every component is alive, 1 if one is dead or none is up."""
    current = state.load_state(state.resolve_dir(args.dir))
    if current is None:
        print(f"not up (no state in {state.resolve_dir(args.dir)})")
        return 1
    rows = _print_status(current)
    return 0 if current.complete and all(r.alive for r in rows) else 1


def cmd_dev_env(args: argparse.Namespace) -> int:
    """``agentrun dev env``: ``export NAME=value`` lines for the running stack."""
    directory = state.resolve_dir(args.dir)
    current = state.load_state(directory)
    if current is None:
        print(f"agentrun: error: not up (no state in {directory})", file=sys.stderr)
        return 1
    for name, value in current.env().items():
        print(f"export {name}={shlex.quote(value)}")
    # the pinned kubectl first on PATH, and this agentrun (the README's `agentrun cancel RUN`)
    path = [str(current.kubectl.parent)] if current.kubectl is not None else []
    path.append(str(Path(sys.executable).parent))  # the venv holding this agentrun
    print(f'export PATH={shlex.quote(os.pathsep.join(dict.fromkeys(path)))}:"$PATH"')
    return 0


def cmd_dev_binaries(args: argparse.Namespace) -> int:
    """``agentrun dev binaries [--node]``: build or locate the binaries; print their paths."""
    rows: list[tuple[str, Path]] = []
    if args.node:
        found, on_node = binaries.ensure_node_binaries(log=_progress)
        rows += [
            ("kube-controller-manager", on_node.kube_controller_manager),
            ("kube-scheduler", on_node.kube_scheduler),
            ("kubelet", on_node.kubelet),
            ("kube-proxy", on_node.kube_proxy),
            ("coredns", on_node.coredns),
        ]
    else:
        found = binaries.ensure_binaries(log=_progress)
    rows = [
        ("etcd", found.etcd),
        ("kube-apiserver", found.kube_apiserver),
        ("kubectl", found.kubectl),
        *rows,
    ]
    for name, path in rows:
        print(f"{name:<24} {path}")
    return 0


def _print_status(current: state.StackState) -> list[stack.ComponentStatus]:
    rows = stack.status(current)
    table = [("COMPONENT", "PID", "STATE", "PORTS", "LOG")]
    for row in rows:
        ports = ",".join(f"{k}={v}" for k, v in row.ports.items()) or "-"
        alive = "alive" if row.alive else "DEAD"
        table.append((row.name, str(row.pid), alive, ports, str(row.log_path)))
    widths = [max(len(line[i]) for line in table) for i in range(4)]
    for *cells, log_path in table:
        print(
            "  ".join(cell.ljust(width) for cell, width in zip(cells, widths, strict=True)), end=""
        )
        print(f"  {log_path}")
    if current.existing_cluster:
        print(f"cluster: existing, KUBECONFIG={current.kubeconfig}")
    if not current.complete:
        print("incomplete: `up` did not finish; run `agentrun dev up` or `agentrun dev down`")
    return rows


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2


def _dir_option(args: argparse.Namespace) -> str:
    return "" if args.dir is None else f" --dir {shlex.quote(str(args.dir))}"


def _progress(line: str) -> None:
    console.log_to_stderr(f"agentrun dev: {line}")
