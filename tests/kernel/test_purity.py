"""The kernel is purely computational: it imports no I/O library (layers point one way)."""

from __future__ import annotations

import ast
import pathlib

import agentrun.kernel

FORBIDDEN = {
    "asyncio",
    "nats",
    "httpx",
    "httpx2",
    "aiohttp",
    "kubernetes",
    "kubernetes_asyncio",
    "kopf",
    "openai",
    "socket",
    "subprocess",
    "requests",
    "time",
}
LAYERS = {
    # package → packages it must not import
    "agentrun": {"agentrun.operator", "agentrun.worker"},
    "agentrun.operator": {"agentrun.worker"},
    "agentrun.worker": {"agentrun.operator"},
}


def imported(path: pathlib.Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_the_kernel_imports_no_io() -> None:
    root = pathlib.Path(agentrun.kernel.__file__).parent
    for path in root.glob("*.py"):
        bad = {name for name in imported(path) if name.split(".")[0] in FORBIDDEN}
        assert not bad, f"{path.name} imports {bad}"


def test_worker_and_operator_do_not_import_each_other() -> None:
    repo = pathlib.Path(agentrun.kernel.__file__).parents[2]
    for folder, package in (
        ("operator", "agentrun.operator"),
        ("worker", "agentrun.worker"),
        ("agentrun", "agentrun"),
    ):
        for path in (repo / folder).rglob("*.py"):
            bad = {
                n
                for n in imported(path)
                if any(n == f or n.startswith(f + ".") for f in LAYERS[package])
            }
            assert not bad, f"{folder}/{path.relative_to(repo / folder)} imports {bad}"
