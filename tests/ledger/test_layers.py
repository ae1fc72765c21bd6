"""The ledger's modules import one way, and only ``state`` changes the entry's fields.

The entry's state comes first, the rules over it next, the named ``Book`` and the I/O last:
each module imports only the ledger modules before it in ``ORDER`` (a rule module that
imported ``Book`` back is how the ledger once had an import circle). The rule modules change
the entry only through ``BookState``'s methods: no assignment to ``book.<field>``, no ``del``
or in-place edit of its dicts.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

import agentrun.ledger

LEDGER = pathlib.Path(agentrun.ledger.__file__).parent
ORDER = [
    "entries",
    "state",
    "deliveries",
    "reserve",
    "book",
    "queue",
    "codec",
    "cas",
    "hold",
    "store",
]
"""Every module of the ledger but ``__init__``, each importing only modules before it."""
RULES = ["deliveries", "reserve"]
"""The modules whose functions take the entry (``book: BookState``) and change it."""
PURE = ORDER[: ORDER.index("codec") + 1]
IO_LIBRARIES = {"asyncio", "nats", "time", "socket", "httpx", "aiohttp", "kubernetes_asyncio"}
DICT_EDITS = {"pop", "popitem", "clear", "update", "setdefault", "__setitem__", "__delitem__"}


def ledger_imports(tree: ast.Module) -> set[str]:
    """The ledger modules ``tree`` imports (``agentrun.ledger.x``, ``from agentrun.ledger
    import x``)."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "agentrun.ledger":
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
            "agentrun.ledger."
        ):
            found.add((node.module or "").removeprefix("agentrun.ledger.").split(".")[0])
        elif isinstance(node, ast.Import):
            found.update(
                alias.name.removeprefix("agentrun.ledger.").split(".")[0]
                for alias in node.names
                if alias.name.startswith("agentrun.ledger.")
            )
    return found & set(ORDER)


def top_level_imports(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def edits_of_book(tree: ast.Module) -> list[str]:
    """Where ``tree`` changes ``book``'s fields itself: ``book.x = …``, ``book.x += …``,
    ``book.x[k] = …``, ``del book.x[k]``, ``book.x.pop(…)`` and the like."""

    def on_book(node: ast.expr) -> bool:
        while isinstance(node, ast.Attribute | ast.Subscript):
            node = node.value
            if isinstance(node, ast.Name) and node.id == "book":
                return True
        return False

    found: list[str] = []
    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        elif isinstance(node, ast.Delete):
            targets = node.targets
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in DICT_EDITS
            and on_book(node.func.value)
            and isinstance(node.func.value, ast.Attribute)
        ):
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
        for target in targets:
            elements = target.elts if isinstance(target, ast.Tuple) else [target]
            found.extend(
                f"line {node.lineno}: {ast.unparse(node)}"
                for element in elements
                if isinstance(element, ast.Attribute | ast.Subscript) and on_book(element)
            )
    return found


def parsed(name: str) -> ast.Module:
    return ast.parse((LEDGER / f"{name}.py").read_text())


def test_order_names_every_module_of_the_ledger() -> None:
    assert sorted(ORDER) == sorted(p.stem for p in LEDGER.glob("*.py") if p.stem != "__init__")


@pytest.mark.parametrize("name", ORDER)
def test_a_module_imports_only_the_ledger_modules_before_it(name: str) -> None:
    later = set(ORDER[ORDER.index(name) :])
    assert ledger_imports(parsed(name)) & later == set()


@pytest.mark.parametrize("name", PURE)
def test_the_entry_and_its_rules_do_no_io(name: str) -> None:
    assert top_level_imports(parsed(name)) & IO_LIBRARIES == set()


@pytest.mark.parametrize("name", RULES)
def test_the_rules_change_the_entry_only_through_its_methods(name: str) -> None:
    assert edits_of_book(parsed(name)) == []


def test_the_checks_see_a_circle_and_an_edit_of_the_entry() -> None:
    back = ast.parse("from agentrun.ledger.book import Book\nfrom agentrun.ledger import reserve\n")
    assert ledger_imports(back) == {"book", "reserve"}
    edits = ast.parse(
        "book.holds[key] = hold\n"
        "book.waiting.pop(key, None)\n"
        "del book.holds[key]\n"
        "book.used_tokens += 1\n"
        "book.window, x = 0, 1\n"
        "book.take_hold(key)\n"
        "hold.tokens = 1\n"
    )
    assert sorted(e.split(":")[0] for e in edits_of_book(edits)) == [
        "line 1",
        "line 2",
        "line 3",
        "line 4",
        "line 5",
    ]
