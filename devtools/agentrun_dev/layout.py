"""The repository's layout checks that ``make lint`` runs: the import contracts and module sizes.

- Import contracts: the ``[tool.importlinter]`` contracts of ``pyproject.toml``, checked by
  ``lint-imports`` (import-linter) on an installed copy of both distributions. An installed copy,
  because ``operator/`` and ``worker/`` become ``agentrun.operator`` and ``agentrun.worker``
  only through ``[tool.setuptools.package-dir]``: the editable install maps them with an import
  hook, which import-linter's graph builder (grimp) cannot follow, as it reads a package's files
  from its folder. In the copy they sit inside ``agentrun/``, relative imports and all.
- Module sizes: a module over ``MODULE_LINES_WARNING`` lines is reported as a warning, never an
  error (size follows the concept: split by concept, not by count). Functions over
  ``MAX_FUNCTION_LINES`` lines or ``MAX_PARAMETERS`` parameters are errors; the suite checks them
  (``tests/layout/test_code_size.py``) with ``oversized_functions``.

``python -m agentrun_dev.layout [REPO]`` runs both from the repository root (default: the
working directory); exit status 1 when a contract is broken.
"""

from __future__ import annotations

import ast
import dataclasses
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

CHECKED = ("operator", "worker", "agentrun/kernel", "agentrun/ledger", "agentrun/bus.py")
"""Where module sizes are reported and the function-length and parameter limits hold."""
MODULE_LINES_WARNING = 400
MAX_FUNCTION_LINES = 50
MAX_PARAMETERS = 6


@dataclasses.dataclass(frozen=True, slots=True)
class LintResult:
    """What ``lint-imports`` said about a tree."""

    ok: bool
    """Every contract kept."""
    output: str
    """Its report: each broken contract names the importing and the imported module."""


def python_files(repo: Path, names: tuple[str, ...]) -> list[Path]:
    """The ``*.py`` files under each of ``names`` (a folder, or a file) in ``repo``; a name that
    does not exist adds none."""
    files: list[Path] = []
    for name in names:
        path = repo / name
        files.extend(sorted(path.rglob("*.py")) if path.is_dir() else [path] * path.is_file())
    return files


def long_modules(repo: Path, *, limit: int = MODULE_LINES_WARNING) -> dict[str, int]:
    """Modules (path relative to ``repo``) with more than ``limit`` lines → their lines."""
    found: dict[str, int] = {}
    for path in python_files(repo, CHECKED):
        lines = len(path.read_text().splitlines())
        if lines > limit:
            found[path.relative_to(repo).as_posix()] = lines
    return found


def is_kopf_handler(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """Decorated with ``@kopf.on.…``: kopf passes its arguments by keyword, and the handler
    names the ones it uses, so its parameter count is kopf's, not a design choice."""
    return any(
        isinstance(d, ast.Call) and ast.unparse(d.func).startswith("kopf.on.")
        for d in node.decorator_list
    )


def parameters(node: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    """The parameter names of a function, without ``self`` and ``cls``."""
    args = node.args
    every = [*args.posonlyargs, *args.args, *args.kwonlyargs]
    return [a.arg for a in every if a.arg not in ("self", "cls")]


def oversized_functions(repo: Path) -> dict[str, str]:
    """``path:function`` → what exceeds ``MAX_FUNCTION_LINES`` or ``MAX_PARAMETERS`` (kopf
    handlers aside: their parameters are kopf's)."""
    found: dict[str, str] = {}
    for path in python_files(repo, CHECKED):
        where = path.relative_to(repo).as_posix()
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            count = len(parameters(node))
            if length > MAX_FUNCTION_LINES:
                found[f"{where}:{node.name}"] = f"{length} lines"
            elif count > MAX_PARAMETERS and not is_kopf_handler(node):
                found[f"{where}:{node.name}"] = f"{count} parameters"
    return found


def install_copy(repo: Path, target: Path) -> Path:
    """Install both distributions of ``repo`` (no dependencies) into ``target``, the way a
    wheel lays them out; ``target``. Raises ``subprocess.CalledProcessError``."""
    with tempfile.TemporaryDirectory(prefix="agentrun-build-") as build:
        env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "TMPDIR": build}
        pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps"]
        subprocess.run(
            [*pip, "--target", str(target), str(repo), str(repo / "devtools")],
            check=True,
            env=env,
            cwd=build,
            stdout=subprocess.DEVNULL,
        )
    for stale in (repo / "build", repo / "devtools" / "build"):
        shutil.rmtree(stale, ignore_errors=True)
    return target


def lint_imports(copy: Path, *, config: Path) -> LintResult:
    """Run ``lint-imports`` with ``config`` (a ``pyproject.toml``) on the installed ``copy``
    (``install_copy``), from inside it, so that ``agentrun`` is the copy's."""
    command = Path(sys.executable).with_name("lint-imports")
    result = subprocess.run(
        [str(command), str(config), "--no-cache"],
        cwd=copy,
        env={**os.environ, "PYTHONPATH": str(copy)},
        capture_output=True,
        text=True,
    )
    return LintResult(result.returncode == 0, result.stdout + result.stderr)


def main(argv: list[str] | None = None) -> int:
    """``make lint``'s layout step (see the module); 0 when every contract is kept."""
    args = sys.argv[1:] if argv is None else argv
    repo = Path(args[0] if args else ".").resolve()
    with tempfile.TemporaryDirectory(prefix="agentrun-layout-") as tmp:
        copy = install_copy(repo, Path(tmp) / "copy")
        result = lint_imports(copy, config=repo / "pyproject.toml")
    summary = result.output.find("Contracts:")
    print((result.output if not result.ok or summary < 0 else result.output[summary:]).rstrip())
    for path, lines in sorted(long_modules(repo).items()):
        print(
            f"warning: {path} has {lines} lines (over {MODULE_LINES_WARNING}): does it still "
            "hold one concept?"
        )
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
