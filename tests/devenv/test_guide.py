"""`agentrun_dev.guide`: the marked blocks of a guide, in order, joined into a script that
stops at the first failure and names the block; malformed markers are refused."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from agentrun_dev import guide

REPO = Path(__file__).resolve().parents[2]
GUIDE = """# A guide

<!-- install-step -->
```bash
export GREETING=hello
```

Not run:

```bash
exit 7
```

<!-- uninstall-step -->
```bash
echo "$GREETING world"
```
"""


def test_marked_blocks_are_found_in_order_and_unmarked_ones_skipped() -> None:
    found = guide.steps(GUIDE)
    assert [(s.kind, s.line, s.code) for s in found] == [
        ("install-step", 3, "export GREETING=hello\n"),
        ("uninstall-step", 14, 'echo "$GREETING world"\n'),
    ]


def test_the_script_runs_the_blocks_in_one_shell_and_names_each() -> None:
    script = guide.script(guide.steps(GUIDE))
    result = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True)
    assert result.stdout.splitlines() == [
        "### guide line 3: export GREETING=hello",
        '### guide line 14: echo "$GREETING world"',
        "hello world",
    ]


def test_the_script_stops_at_the_first_failing_command() -> None:
    blocks = guide.steps("<!-- install-step -->\n```bash\nfalse\necho after\n```\n")
    result = subprocess.run(["bash", "-c", guide.script(blocks)], capture_output=True, text=True)
    assert result.returncode == 1
    assert "after" not in result.stdout


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("<!-- install-step -->\n\n```bash\ntrue\n```\n", "line 1: install-step is not followed"),
        ("<!-- install-step -->\n```sh\ntrue\n```\n", "line 1: install-step is not followed"),
        ("<!-- install-step -->", "line 1: install-step is not followed"),
        ("<!-- install-step -->\n```bash\ntrue\n", "line 2: the ```bash block is never closed"),
    ],
)
def test_a_malformed_marked_block_is_refused(text: str, message: str) -> None:
    with pytest.raises(guide.GuideError, match=message):
        guide.steps(text)


def test_the_install_guide_parses_and_sets_its_variables_first() -> None:
    found = guide.steps((REPO / "docs" / "install.md").read_text())
    kinds = [s.kind for s in found]
    assert kinds[0] == "install-step" and "uninstall-step" in kinds
    assert kinds == sorted(kinds)  # every install step before the uninstall steps
    assert found[0].code.startswith("export VERSION=")
    script = guide.script(found)
    result = subprocess.run(["bash", "-n", "-c", script], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
