"""The user programs (``agentrun/cli/``) sit beside the runtime: the operator, the workers and
the shared package import nothing of them, so a user program can change without touching
what runs in the cluster."""

from __future__ import annotations

import ast
import pathlib

import agentrun

SHARED = pathlib.Path(agentrun.__file__).parent
REPO = SHARED.parent
RUNTIME = {"operator": "agentrun.operator", "worker": "agentrun.worker", "agentrun": "agentrun"}
"""Folder → the package it is installed as."""


def imported(path: pathlib.Path, package: str) -> set[str]:
    """Every module ``path`` (a module of ``package``) imports, relative imports resolved."""
    parts = package.split(".")
    if path.stem != "__init__":
        parts.append(path.stem)
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(parts[: len(parts) - node.level]) if node.level else ""
            module = ".".join(p for p in (base, node.module or "") if p)
            names.add(module)
            names.update(f"{module}.{alias.name}" for alias in node.names)
    return names


def users_of_cli() -> dict[str, set[str]]:
    """Runtime modules outside ``agentrun/cli/`` that import ``agentrun.cli``, with what."""
    users: dict[str, set[str]] = {}
    for folder, package in RUNTIME.items():
        root = REPO / folder
        for path in sorted(root.rglob("*.py")):
            if (SHARED / "cli") in path.parents:
                continue
            inner = path.parent.relative_to(root).parts
            names = imported(path, ".".join([package, *inner]))
            bad = {n for n in names if n == "agentrun.cli" or n.startswith("agentrun.cli.")}
            if bad:
                users[str(path.relative_to(REPO))] = bad
    return users


def test_no_runtime_module_imports_the_user_programs() -> None:
    assert users_of_cli() == {}


def test_the_check_resolves_relative_imports(tmp_path: pathlib.Path) -> None:
    module = tmp_path / "views.py"
    module.write_text("from ..cli import kubectl\nfrom . import status\nimport agentrun.cli.main\n")
    assert imported(module, "agentrun.operator") == {
        "agentrun.cli",
        "agentrun.cli.kubectl",
        "agentrun.operator",
        "agentrun.operator.status",
        "agentrun.cli.main",
    }
