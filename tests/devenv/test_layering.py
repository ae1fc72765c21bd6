"""The dev tooling stays at the edge, in its own distribution.

``agentrun_dev`` (``devtools/``) starts the stack and imports only the standard library and its
few libraries (an allow-list import-linter cannot state), and its wheel is not the runtime's.
That it imports nothing of the runtime but the package itself, and that the runtime imports
nothing of it nor of its libraries, are import contracts (``pyproject.toml``,
``tests/layout/test_import_contracts.py``).
"""

from __future__ import annotations

import ast
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DEVENV = REPO / "devtools" / "agentrun_dev"
THIRD_PARTY = {"cryptography", "installer", "packaging", "platformdirs", "psutil", "yaml"}
DEV_ONLY_LIBRARIES = {"installer", "platformdirs", "psutil"}
"""Libraries only the dev tooling uses. (``cryptography`` is a runtime dependency since the MCP
client needs it; the dev tooling's certificates use it too.)"""
RUNTIME_USED = {"agentrun.display", "agentrun.natsauth", "agentrun.natsclient", "agentrun.trust"}
"""Runtime modules the dev tooling uses: the NATS trust chain, credentials and client options,
so the suite's nats-server is closed exactly as the chart closes it, the run-signing keys, and
the rule that makes model text safe to print (the demo prints answers); the import contract
allows these and no other."""


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
        and module not in RUNTIME_USED
        and not module.startswith("agentrun_dev")
    }
    assert strays == set()


def test_the_runtime_wheel_declares_no_dev_tooling_package_or_library() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    packages = project["tool"]["setuptools"]["packages"]
    dependencies = {
        dep.split(">")[0].split("=")[0].strip() for dep in project["project"]["dependencies"]
    }
    assert not [p for p in packages if "devenv" in p or p.startswith("agentrun_dev")]
    assert dependencies.isdisjoint(DEV_ONLY_LIBRARIES)
