"""The benchmark harness's own tests: its pure arithmetic (``bench/figures.py``), its guards
that need no stack, and one small end-to-end run of ``bench_compare.py``. ``bench/`` is not a
package: its folder is put on ``sys.path`` here, as running a script from it does."""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))
