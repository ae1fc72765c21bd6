"""``agentrun dev …``: the local stack's subcommands, plugged into the ``agentrun`` command.

The runtime's ``agentrun`` finds `register_dev` through the ``agentrun.cli`` entry point group
(declared in ``devtools/pyproject.toml``), so the runtime wheel carries none of this. Each
subcommand is a ``cmd_dev_<name>(args) -> int`` handler returning the exit code; errors the
dev modules raise (``OSError``, ``RuntimeError``, ``subprocess.SubprocessError``, each saying
what to do next) are printed as one line by the ``agentrun`` command (``agentrun.cli.main``).

What belongs here: argument parsing and printing. The work is done by the library modules
(`stack`, `demo`, `binaries`, `state`), so tests and other tools can call it without the CLI.
Each handler imports the library modules it uses when it runs: ``agentrun`` builds its parser
with `register_dev` for every command (``agentrun cancel`` too), so registering imports only
`state` and `console`.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING, TypeAlias

from agentrun_dev import console, state

if TYPE_CHECKING:
    from agentrun_dev import stack

Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"  # no public name
_NODE_HELP = (
    "also run a real single node (containerd, kubelet, kube-proxy, CoreDNS, controller-manager, "
    "scheduler) so pods run; needs root and `make node-packages`"
)
_CHART_HELP = (
    "run a node (as --node) and `helm install` charts/agentrun on it: NATS, the mock model, "
    "the operator and the workers run as pods built from this checkout (`make image`)"
)


def register_dev(subparsers: Subparsers) -> None:
    """``agentrun dev up|down|status|env|binaries``: the local stack."""
    dev = subparsers.add_parser(
        "dev",
        help="run the local stack (cluster, nats, mock model, operator, workers)",
        description="Run agentrun locally. State and logs live in --dir "
        f"(default ${state.DIR_ENV}, else the nearest {state.DEFAULT_DIR} with a stack's "
        f"state here or in a parent directory, else ./{state.DEFAULT_DIR}).",
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
        default=None,
        metavar="FILE",
        help="mock model scenario files (default examples/scenarios.yaml)",
    )
    up.add_argument("--crds", type=Path, default=None, metavar="DIR", help="CRD directory")
    up.add_argument("--node", action="store_true", help=_NODE_HELP)
    up.add_argument("--chart", action="store_true", help=_CHART_HELP)
    up.add_argument(
        "--nats-servers",
        type=int,
        choices=(1, 3),
        default=1,
        metavar="N",
        help="NATS servers: 1 (default), or 3 for a JetStream cluster on loopback whose streams "
        "and buckets are kept at R3 (not with --chart, whose NATS is the chart's)",
    )
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
        default=None,
        metavar="FILE",
        help="AgentRun manifests to apply (default: the three in examples/)",
    )
    show.add_argument("--node", action="store_true", help=_NODE_HELP)
    show.add_argument("--chart", action="store_true", help=_CHART_HELP)
    show.add_argument(
        "--node-wait",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="wait this long for another node on this machine to stop (default: refuse)",
    )
    show.add_argument(
        "--down",
        action="store_true",
        help="stop everything (by pid; with a node, the host cleaned) once the results are "
        "printed, or when the demo fails",
    )
    show.set_defaults(handler=cmd_dev_demo)
    build = commands.add_parser(
        "binaries",
        help="build (once per machine) or locate kube-apiserver, etcd, kubectl and the nats CLI",
    )
    which = build.add_mutually_exclusive_group()
    which.add_argument(
        "--control-plane",
        action="store_true",
        help="only etcd, kube-apiserver and kubectl (what the control plane's tests wait for)",
    )
    which.add_argument(
        "--tools",
        action="store_true",
        help="only helm, prometheus and promtool, syft and the nats CLI (what the tests of the "
        "chart, the metrics, the release and the NATS image wait for)",
    )
    which.add_argument(
        "--node",
        action="store_true",
        help="also the node's binaries (kube-controller-manager, kube-scheduler, kubelet, "
        "kube-proxy, coredns, kube-router), the kubernetes ones in one build",
    )
    which.add_argument(
        "--all",
        action="store_true",
        help="everything the test suite builds from the Go module proxy, in the order its tiers "
        "need them (.ci/pytest-tiers): the control plane, then helm, prometheus and promtool, "
        "syft and the nats CLI (--tools), then the node's binaries",
    )
    build.set_defaults(handler=cmd_dev_binaries)


def cmd_dev_up(args: argparse.Namespace) -> int:
    """``agentrun dev up``: start the stack (or revive it), then print its status."""
    from agentrun_dev import demo, stack

    if args.workers < 0:
        print("agentrun: error: --workers must be ≥ 0", file=sys.stderr)
        return 2
    if args.chart and args.nats_servers != 1:
        print("agentrun: error: --nats-servers is for the local stack", file=sys.stderr)
        return 2
    options = stack.UpOptions(
        workers=args.workers,
        scenarios=tuple(args.scenarios or (stack.DEFAULT_SCENARIOS,)),
        crd_dir=args.crds,
        node=args.node,
        chart=args.chart,
        nats_servers=args.nats_servers,
    )
    current = stack.up(state.resolve_dir(args.dir), options=options, log=_progress)
    demo.apply_mock_model(current)
    _print_status(current)
    print(f"\nAgentModel {demo.MODEL_NAME!r} points at the mock model: use `spec.model: mock`")
    print(f'use it from a shell: eval "$({_executable()} dev env{_dir_option(args)})"')
    return 0


def cmd_dev_demo(args: argparse.Namespace) -> int:
    """``agentrun dev demo``: stack up, ``mock`` AgentModel, the examples, their end states;
    with ``--down`` the stack is stopped afterwards, whatever happened."""
    from agentrun_dev import stack

    directory = state.resolve_dir(args.dir)
    options = stack.UpOptions(
        workers=args.workers, node=args.node, chart=args.chart, node_wait=args.node_wait
    )
    current = stack.up(directory, options=options, log=_progress)  # stops itself if it fails
    try:
        return _demo(current, args)
    finally:
        if args.down:
            stack.down(directory, log=_progress)


def _demo(current: state.StackState, args: argparse.Namespace) -> int:
    from agentrun_dev import demo

    demo.apply_mock_model(current)
    kc = demo.kubectl_for(current)
    if current.release_namespace is not None:
        print(f"$ kubectl get pods -n {current.release_namespace}  # helm install, on the node")
        print(kc("get", "pods", "-n", current.release_namespace, "-o", "wide").stdout, end="")
    examples = args.examples or demo.DEFAULT_EXAMPLES
    before = demo.tenant_use(current)  # an earlier demo's use, on a stack still up
    items = demo.run_examples(current, examples=examples, log=_progress)
    names = [item["metadata"]["name"] for item in items]
    print("\n$ kubectl get agentruns")
    print(kc("get", "agentruns", "-n", "default", *names).stdout, end="")
    print("\nusage:")
    for line in demo.usage_summary(items):
        print(f"  {line}")
    demo.wait_tenant_settled(current, items=items, before=before)
    print("\n$ kubectl get agenttenants  # every run is charged to its namespace's tenant")
    print(kc("get", "agenttenants").stdout, end="")
    if args.down:
        return 0
    print(
        "\nThe stack is still up. Try:\n"
        f'  eval "$({_executable()} dev env{_dir_option(args)})"\n'
        "  kubectl get agentruns -o yaml\n"
        "  kubectl explain agentrun.spec.budget\n"
        "  kubectl get agenttenant default -o yaml   # used / reserved / remaining, resetTime\n"
        "Stop it with `make down` (agentrun dev down)."
    )
    return 0


def cmd_dev_down(args: argparse.Namespace) -> int:
    """``agentrun dev down``: stop everything recorded, in reverse order."""
    from agentrun_dev import stack

    stack.down(state.resolve_dir(args.dir), log=_progress)
    return 0


def cmd_dev_status(args: argparse.Namespace) -> int:
    """``agentrun dev status``: 0 if every component is alive, 1 if one is dead or none is up."""
    current = state.load_state(state.resolve_dir(args.dir))
    if current is None:
        print(not_up(state.resolve_dir(args.dir)))
        return 1
    rows = _print_status(current)
    return 0 if current.complete and all(r.alive for r in rows) else 1


def not_up(directory: Path) -> str:
    """What ``dev env`` and ``dev status`` say when ``directory`` holds no stack's state: where
    they looked, and the two ways on (the checkout whose ``make demo`` started the stack, where
    `state.resolve_dir` finds it from any directory below; or a stack started here)."""
    return (
        f"not up (no state in {directory}): run this from the checkout whose `make demo` "
        f"started the stack (or pass --dir or set ${state.DIR_ENV} to its "
        f"{state.DEFAULT_DIR}), or start one here with `make demo`"
    )


def cmd_dev_env(args: argparse.Namespace) -> int:
    """``agentrun dev env``: ``export NAME=value`` lines for the running stack."""
    directory = state.resolve_dir(args.dir)
    current = state.load_state(directory)
    if current is None:
        print(f"agentrun: error: {not_up(directory)}", file=sys.stderr)
        return 1
    for name, value in current.env().items():
        print(f"export {name}={shlex.quote(value)}")
    # the pinned kubectl first on PATH, and this agentrun (the README's `agentrun cancel RUN`)
    path = [str(current.kubectl.parent)] if current.kubectl is not None else []
    path.append(str(Path(sys.executable).parent))  # the venv holding this agentrun
    print(f'export PATH={shlex.quote(os.pathsep.join(dict.fromkeys(path)))}:"$PATH"')
    return 0


def cmd_dev_binaries(args: argparse.Namespace) -> int:
    """``agentrun dev binaries [--control-plane | --tools | --node | --all]``: build or locate
    the binaries, each once per machine under its own lock, in the order listed; print their
    paths. Without an option: the control plane and the ``nats`` CLI (of the NATS image)."""
    from agentrun_dev import binaries

    if args.control_plane:
        rows = _control_plane()
    elif args.tools:
        rows = _suite_tools()
    elif args.all:  # the order of .ci/pytest-tiers' tiers
        rows = [*_control_plane(), *_suite_tools(), *_node()]
    elif args.node:  # the node's kubernetes commands in the control plane's go build
        node = _node()
        rows = [*_control_plane(), ("nats", binaries.ensure_natscli(log=_progress)), *node]
    else:
        rows = [*_control_plane(), ("nats", binaries.ensure_natscli(log=_progress))]
    for name, path in rows:
        print(f"{name:<24} {path}")
    return 0


def _control_plane() -> list[tuple[str, Path]]:
    """etcd, kube-apiserver and kubectl: built (or found) first, the second tier waits for them."""
    from agentrun_dev import binaries

    found = binaries.ensure_binaries(log=_progress)
    return [
        ("etcd", found.etcd),
        ("kube-apiserver", found.kube_apiserver),
        ("kubectl", found.kubectl),
    ]


def _suite_tools() -> list[tuple[str, Path]]:
    """helm, prometheus and promtool, syft, then the ``nats`` CLI: what the tests marked
    ``toolbinaries`` use (their tier waits for these only; see .ci/pytest-tiers)."""
    from agentrun_dev import binaries, dist, helm, prometheus  # dist: the image builder

    helm_binary = helm.ensure_helm(log=_progress)
    found = prometheus.ensure_prometheus(log=_progress)
    syft = dist.syft_binary(log=_progress)
    nats = binaries.ensure_natscli(log=_progress)
    return [
        ("helm", helm_binary),
        ("prometheus", found.prometheus),
        ("promtool", found.promtool),
        ("syft", syft),
        ("nats", nats),
    ]


def _node() -> list[tuple[str, Path]]:
    """The node's kubernetes commands (with any missing control-plane one, in one go build),
    coredns and kube-router."""
    from agentrun_dev import binaries

    _, on_node = binaries.ensure_node_binaries(log=_progress)
    return [
        ("kube-controller-manager", on_node.kube_controller_manager),
        ("kube-scheduler", on_node.kube_scheduler),
        ("kubelet", on_node.kubelet),
        ("kube-proxy", on_node.kube_proxy),
        ("coredns", on_node.coredns),
        ("kube-router", on_node.kube_router),
    ]


def _print_status(current: state.StackState) -> list[stack.ComponentStatus]:
    from agentrun_dev import stack

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


def _executable(argv0: str | None = None) -> str:
    """How a shell here reaches the running ``agentrun`` (``argv0``: default ``sys.argv[0]``):
    the bare name when that is what ``PATH`` finds, else its path (relative to the working
    directory when below it, e.g. ``.venv/bin/agentrun``), shell-quoted."""
    path = Path(argv0 if argv0 is not None else sys.argv[0]).resolve()
    found = shutil.which(path.name)
    if found is not None and Path(found).resolve() == path:
        return path.name
    try:
        shown = str(path.relative_to(Path.cwd().resolve()))
    except ValueError:
        shown = str(path)
    return shlex.quote(shown)


def _dir_option(args: argparse.Namespace) -> str:
    return "" if args.dir is None else f" --dir {shlex.quote(str(args.dir))}"


def _progress(line: str) -> None:
    console.log_to_stderr(f"agentrun dev: {line}")
