"""The command blocks of a Markdown guide that a test runs, so the guide cannot drift.

A block to run is a fenced ``bash`` block right after an HTML comment naming its kind::

    <!-- install-step -->
    ```bash
    helm install agentrun ...
    ```

`steps(text)` returns every marked block in document order; `script(blocks)` joins blocks
into one ``bash`` script that stops at the first failing command (``set -euo pipefail``) and
echoes each block's first line before running it, so a failure names its block.

What belongs here: reading guides. Running the script against a cluster is the test's job.
"""

from __future__ import annotations

import dataclasses
import re

_MARKER = re.compile(r"^<!--\s*([a-z][a-z0-9-]*-step)\s*-->\s*$")
_FENCE_OPEN = "```bash"
_FENCE_CLOSE = "```"


class GuideError(ValueError):
    """A marked block is malformed: the message names its line."""


@dataclasses.dataclass(frozen=True, slots=True)
class Step:
    """One marked block."""

    kind: str
    """The marker's name, e.g. ``install-step``."""
    line: int
    """1-based line of the marker in the guide."""
    code: str
    """The block's text, without its fences, ending with a newline."""


def steps(text: str) -> list[Step]:
    """Every block marked ``<!-- NAME-step -->`` in `text`, in order.

    Raises GuideError when a marker is not followed (on the next line) by a ```` ```bash ````
    fence, or the fence is never closed.
    """
    lines = text.splitlines()
    found: list[Step] = []
    for index, line in enumerate(lines):
        marker = _MARKER.match(line)
        if marker is None:
            continue
        if index + 1 >= len(lines) or lines[index + 1].strip() != _FENCE_OPEN:
            raise GuideError(f"line {index + 1}: {marker.group(1)} is not followed by ```bash")
        try:
            end = lines.index(_FENCE_CLOSE, index + 2)
        except ValueError:
            raise GuideError(f"line {index + 2}: the ```bash block is never closed") from None
        code = "\n".join(lines[index + 2 : end]) + "\n"
        found.append(Step(marker.group(1), index + 1, code))
    return found


def script(blocks: list[Step]) -> str:
    """A bash script running `blocks` in order in one shell, stopping at the first failure;
    before each block it prints ``### guide line N: <first line>`` (to stdout)."""
    parts = ["set -euo pipefail\n"]
    for block in blocks:
        first = block.code.splitlines()[0] if block.code.strip() else ""
        banner = f"### guide line {block.line}: {first}"
        parts.append(f"printf '%s\\n' {_quote(banner)}\n{block.code}")
    return "".join(parts)


def _quote(text: str) -> str:
    """`text` as one single-quoted shell word."""
    return "'" + text.replace("'", "'\\''") + "'"
