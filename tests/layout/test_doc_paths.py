"""Every repository path the user documentation names exists: a new user greps for the file a
doc points at (``agentrun/cli/``, ``examples/agenttenant.yaml``), so a path left behind by a
move sends them nowhere. Read are ``README.md``, ``docs/**/*.md`` and ``examples/README.md``;
checked is every backticked word that starts with one of the repository's top folders and
names no placeholder (``<fullname>``, ``{name}``, ``*``, ``…``). A module named the Python
way (``agentrun/bus`` for ``agentrun/bus.py``, ``tests/kube_support.FakeKube``) counts when
its file exists; what a benchmark writes (``bench/results/``, git-ignored) is not in a clone."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TOPS = (
    "agentrun/",
    "operator/",
    "worker/",
    "devtools/",
    "tests/",
    "charts/",
    "crds/",
    "examples/",
    "bench/",
    "docs/",
)
GENERATED = ("bench/results/",)
PLACEHOLDER = re.compile(r"[<>{}*$…|:]")


def user_docs() -> list[Path]:
    """The user-facing Markdown files: the README, every page of ``docs/``, the examples'."""
    return [
        REPO / "README.md",
        *sorted((REPO / "docs").rglob("*.md")),
        REPO / "examples" / "README.md",
    ]


def named_paths(text: str) -> set[str]:
    """Backticked repository paths in ``text`` (trailing punctuation dropped), placeholders
    and generated outputs left out."""
    words = (w.rstrip(".,;") for w in re.findall(r"`([^`\s]+)`", text))
    return {
        w
        for w in words
        if w.startswith(TOPS) and not PLACEHOLDER.search(w) and not w.startswith(GENERATED)
    }


def exists(path: str) -> bool:
    """Whether ``path`` is in the repository as written, or as a module (``a/b`` → ``a/b.py``;
    ``a/b.Name`` → ``a/b.py``)."""
    module = path.split(".")[0] if "." in path.rsplit("/", 1)[-1] else path
    return any((REPO / p).exists() for p in (path, f"{path}.py", f"{module}.py"))


def test_every_path_the_docs_name_exists() -> None:
    missing = [
        f"{doc.relative_to(REPO)}: {path}"
        for doc in user_docs()
        for path in sorted(named_paths(doc.read_text()))
        if not exists(path)
    ]
    assert missing == []


def test_a_moved_path_is_found() -> None:
    """The check itself: a file that is not there is reported, a module name is not."""
    text = "see `agentrun/cli.py`, `agentrun/bus`, `tests/kube_support.FakeKube`, `charts/<x>/`"
    assert {p for p in named_paths(text) if not exists(p)} == {"agentrun/cli.py"}
