"""agentrun.devenv stays at the edge: it starts the stack, it imports none of the runtime.

The operator, workers and kernel must not depend on the dev tooling either.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DEVENV = REPO / "agentrun" / "devenv"
THIRD_PARTY = {"cryptography", "installer", "packaging", "platformdirs", "psutil", "yaml"}


def imported_modules(path: Path) -> set[str]:
    modules: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is not None and node.level == 0:
            modules.add(node.module)
    return modules


@pytest.mark.parametrize("path", sorted(DEVENV.glob("*.py")), ids=lambda p: p.name)
def test_devenv_imports_only_itself_the_stdlib_and_its_few_libraries(path: Path) -> None:
    allowed = sys.stdlib_module_names | THIRD_PARTY | {"__future__"}
    strays = {
        module
        for module in imported_modules(path)
        if module.split(".")[0] not in allowed
        and module != "agentrun"
        and not module.startswith("agentrun.devenv")
    }
    assert strays == set()


@pytest.mark.parametrize("folder", ["operator", "worker", "agentrun/kernel"])
def test_the_runtime_does_not_import_the_dev_tooling(folder: str) -> None:
    users = [
        path.relative_to(REPO)
        for path in sorted((REPO / folder).rglob("*.py"))
        if any(m.startswith("agentrun.devenv") for m in imported_modules(path))
    ]
    assert users == []
