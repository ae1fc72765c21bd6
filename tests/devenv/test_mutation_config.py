"""`make mutate` stays runnable without running it (it takes most of an hour): mutmut reads the
configuration in ``pyproject.toml``, every path it names exists, what it mutates is the pure
core (no I/O library imported, every module of the kernel), the tests it runs exist, each
explained survivor has a reason and names a mutated module; and the score report reads
mutmut's verdicts as mutmut prints them."""

from __future__ import annotations

import ast
import fnmatch
import os
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
from mutmut import configuration

from agentrun_dev import mutation

REPO = Path(__file__).resolve().parents[2]
CONFIG = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["mutmut"]
IO_LIBRARIES = {
    "asyncio",
    "nats",
    "aiohttp",
    "httpx",
    "httpx2",
    "kubernetes",
    "kubernetes_asyncio",
    "kopf",
    "openai",
    "socket",
    "subprocess",
    "time",
}


def mutated() -> list[Path]:
    """The modules the configuration mutates, relative to the repository."""
    files = [
        path.relative_to(REPO)
        for source in CONFIG["source_paths"]
        for path in sorted((REPO / source).rglob("*.py"))
    ]
    return [f for f in files if any(fnmatch.fnmatch(str(f), g) for g in CONFIG["only_mutate"])]


def top_level_imports(path: Path) -> Iterator[str]:
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module.split(".")[0]


def test_every_path_the_configuration_names_exists() -> None:
    for path in [*CONFIG["source_paths"], *CONFIG["also_copy"]]:
        assert (REPO / path).exists(), path
    for path in CONFIG["pytest_add_cli_args_test_selection"]:
        assert (REPO / path).exists(), path
    ignored = [a.removeprefix("--ignore=") for a in CONFIG["pytest_add_cli_args"] if "=" in a]
    assert all((REPO / path).exists() for path in ignored), ignored
    for glob in CONFIG["only_mutate"]:
        assert any(fnmatch.fnmatch(str(f), glob) for f in mutated()), f"{glob} matches nothing"


def test_what_is_mutated_is_the_pure_core_and_all_of_the_kernel() -> None:
    files = mutated()
    kernel = {p.relative_to(REPO) for p in (REPO / "agentrun" / "kernel").glob("*.py")}
    assert kernel <= set(files)
    assert {f.parts[1] for f in files} == {"kernel", "ledger"}
    for path in files:
        io = set(top_level_imports(REPO / path)) & IO_LIBRARIES
        assert not io, f"{path} imports {io}: not pure, its mutants would need services"


def test_every_ledger_module_the_import_contracts_call_pure_is_mutated() -> None:
    """The ledger's pure part is named once, by its import contract; mutation testing follows
    it (a module cut out of another joins the contract, and so the mutated set)."""
    contracts = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    (pure,) = [
        c["source_modules"]
        for c in contracts["contracts"]
        if c["type"] == "forbidden" and "agentrun.ledger.store" in c["forbidden_modules"]
    ]
    modules = {".".join(p.with_suffix("").parts) for p in mutated()}
    assert pure and set(pure) <= modules, set(pure) - modules


def test_mutmut_reads_the_configuration_as_written() -> None:
    cwd = Path.cwd()
    os.chdir(REPO)  # mutmut reads pyproject.toml from the working directory
    try:
        configuration.reset_config()
        loaded = configuration.config()
        assert [str(p) for p in loaded.source_paths] == ["agentrun"]
        for path in mutated():
            assert loaded.should_mutate(str(path)), path
        for io_module in ("agentrun/ledger/store.py", "agentrun/ledger/hold.py", "agentrun/bus.py"):
            assert not loaded.should_mutate(io_module), io_module
    finally:
        os.chdir(cwd)
        configuration.reset_config()


def test_every_explained_survivor_has_a_reason_and_names_a_mutated_module() -> None:
    explained = mutation.read_equivalent((REPO / mutation.EQUIVALENT_FILE).read_text())
    modules = {".".join(p.with_suffix("").parts) for p in mutated()}
    for name, reason in explained.items():
        assert name.rsplit(".", 1)[0] in modules, name
        assert len(reason) > 20, f"{name}: say why it is equivalent"


RESULTS = """\
⠋ Generating mutants
    agentrun.kernel.gates.x_admit_model_call__mutmut_1: killed
    agentrun.kernel.gates.x_admit_model_call__mutmut_2: survived
    agentrun.kernel.gates.x_admit_model_call__mutmut_3: timeout
    agentrun.kernel.gates.x_admit_model_call__mutmut_4: not checked
    agentrun.ledger.book.xǁBookǁsettle__mutmut_1: survived
    agentrun.ledger.book.xǁBookǁsettle__mutmut_2: no tests
"""


def test_the_report_scores_each_package_and_lists_the_unexplained_survivors() -> None:
    verdicts = mutation.parse_results(RESULTS)
    assert len(verdicts) == 6
    scores = mutation.scores(verdicts)
    assert scores["agentrun.kernel"] == mutation.Score(detected=2, counted=3)
    assert scores["agentrun.ledger"] == mutation.Score(detected=0, counted=2)
    assert scores["total"].percent == 40.0
    explained = {"agentrun.ledger.book.xǁBookǁsettle__mutmut_1": "used never goes down"}
    text, clean = mutation.report(verdicts, explained)
    assert not clean
    assert text.splitlines()[-3:] == [
        "unexplained survivors (2; `mutmut show NAME` prints one):",
        "  agentrun.kernel.gates.x_admit_model_call__mutmut_2: survived",
        "  agentrun.ledger.book.xǁBookǁsettle__mutmut_2: no tests",
    ]
    with pytest.raises(ValueError, match=r"mutants-equivalent\.txt:2: x__mutmut_1 has no reason"):
        mutation.read_equivalent("# comment\nx__mutmut_1\n")
