"""The wait before a test of real processes near 00:00 UTC (``clock_support``): a tenant's
default budget window is the UTC day, and such a test charges runs and reads the window's
usage with the real clock, so it starts only with ``DAY_END_MARGIN`` seconds of the day left."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from clock_support import (
    DAY,
    DAY_END_MARGIN,
    MODULE_MARGIN,
    REAL_CLOCK_FIXTURES,
    pause_before_day_ends,
    pause_before_test,
)

MIDNIGHT = 20_795 * DAY  # 2026-12-08T00:00:00Z


@pytest.mark.parametrize(
    ("now", "pause"),
    [
        pytest.param(MIDNIGHT - DAY_END_MARGIN, 0.0, id="exactly-the-margin-left"),
        pytest.param(MIDNIGHT - DAY_END_MARGIN + 0.5, DAY_END_MARGIN + 0.5, id="just-inside"),
        pytest.param(MIDNIGHT - 10.0, 11.0, id="ten-seconds-left"),
        pytest.param(MIDNIGHT, 0.0, id="at-midnight"),
        pytest.param(MIDNIGHT + 1.0, 0.0, id="just-after"),
        pytest.param(MIDNIGHT - DAY / 2, 0.0, id="noon"),
    ],
)
def test_a_test_starts_with_the_margin_left_or_just_after_midnight(
    now: float, pause: float
) -> None:
    assert pause_before_day_ends(now) == pytest.approx(pause)
    after = now + pause
    assert DAY - after % DAY >= DAY_END_MARGIN  # the margin is left once the pause is over


def test_only_tests_of_real_processes_wait() -> None:
    late = MIDNIGHT - 60.0
    real, unreal = ["tmp_path", "devenv_launch"], ["tmp_path", "monkeypatch"]
    kw = {"whole_module": False, "first_in_module": False}
    assert pause_before_test(real, late, **kw) == pytest.approx(61.0)
    assert pause_before_test(unreal, late, **kw) == 0.0
    assert pause_before_test(real, MIDNIGHT - DAY / 2, **kw) == 0.0


def test_a_module_sharing_one_stack_waits_before_its_first_test_only() -> None:
    """A node module's tests read the charges of runs its first test's set-up made: it needs
    its whole length (``MODULE_MARGIN``) before its first test, and a later test waiting into
    the next day would split the charges it reads."""
    real = ["devenv_launch"]
    tight = MIDNIGHT - MODULE_MARGIN + 5.0  # more than one test's margin, less than a module's
    assert pause_before_test(real, tight, whole_module=True, first_in_module=True) == (
        pytest.approx(MODULE_MARGIN - 4.0)
    )
    late = MIDNIGHT - 30.0
    assert pause_before_test(real, late, whole_module=True, first_in_module=False) == 0.0
    assert pause_before_test(real, tight, whole_module=False, first_in_module=True) == 0.0
    assert DAY_END_MARGIN < MODULE_MARGIN


def test_the_fixtures_waited_for_are_the_suites_fixtures_of_real_processes() -> None:
    """The names are fixtures of the suite's conftest files (a renamed fixture would silently
    end the wait), and every fixture that starts nats-server, the control plane or a node
    takes one of them."""
    tests = Path(__file__).resolve().parents[1]
    sources = [path.read_text() for path in tests.glob("**/conftest.py")]
    defined = {name for text in sources for name in re.findall(r"^def (\w+)\(", text, re.M)}
    assert defined >= REAL_CLOCK_FIXTURES, REAL_CLOCK_FIXTURES - defined
