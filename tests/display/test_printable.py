"""Model and tool text cannot steer a reviewer's terminal: every control is shown, not obeyed."""

from __future__ import annotations

import json
import unicodedata

import pytest

from agentrun import display

HOSTILE = {
    "CSI colour (SGR) hiding text": "ok\x1b[8mhidden\x1b[0m",
    "CSI cursor up over the previous line": "line\x1b[1A\x1b[2Kapproved",
    "OSC window title / hyperlink, BEL-terminated": "\x1b]0;title\x07\x1b]8;;http://x\x07a\x1b]8;;\x07",
    "OSC ended by ST": "\x1b]2;title\x1b\\",
    "DCS string": "\x1bP1$r0m\x1b\\",
    "8-bit CSI (C1)": "\u009b31mred",
    "C1 NEL and OSC": "a\u0085b\u009d0;t\u009c",
    "carriage return over a line": 'rm -rf /\r{"safe": true}',
    "backspaces": "delete\x08\x08\x08\x08\x08\x08read",
    "DEL": "a\x7fb",
    "bidi override": "invoice_\u202egpj.exe",
    "bidi isolate": "\u2066abc\u2069",
    "NUL and bell": "a\x00b\x07",
    "tag characters (invisible ASCII)": "ok" + "".join(chr(0xE0000 + ord(c)) for c in "rm -rf /"),
    "zero-width space and joiner": "prod\u200buction\u200d",
    "word joiner, invisible operators, BOM": "a\u2060b\u2062c\ufeffd",
    "soft hyphen": "ad\u00admin",
    "line and paragraph separators": "safe\u2028rm -rf /\u2029",
    "variation selectors (invisible bytes)": "ok\ufe0f\U000e0100\U000e01ef",
}

INVISIBLE = ("Cc", "Cf", "Zl", "Zp")


def _invisible(c: str) -> bool:
    """A character a terminal shows as nothing, or obeys: controls, format characters, line
    and paragraph separators, variation selectors."""
    code = ord(c)
    return (
        unicodedata.category(c) in INVISIBLE
        or 0xFE00 <= code <= 0xFE0F
        or (0xE0100 <= code <= 0xE01EF)
    )


@pytest.mark.parametrize("text", HOSTILE.values(), ids=HOSTILE.keys())
def test_no_control_character_or_bidi_mark_survives(text: str) -> None:
    for newlines in (True, False):
        shown = display.printable(text, newlines=newlines)
        assert not [c for c in shown if ord(c) in display.NEUTRALISED and c not in "\n\t"]
        assert not [c for c in shown if _invisible(c) and c not in "\n\t"]


def test_each_control_is_shown_as_a_visible_escape() -> None:
    assert display.printable("a\x1b[31mb") == "a\\x1b[31mb"
    assert display.printable("x\ry") == "x\\x0dy"
    assert display.printable("\u009b1m") == "\\x9b1m"
    assert display.printable("a\u202eb") == "a\\u202eb"
    assert display.printable("a\u200bb") == "a\\u200bb"
    assert display.printable("ok\U000e0072") == "ok\\U000e0072"


def test_newlines_and_tabs_are_kept_or_escaped_for_one_line_fields() -> None:
    assert display.printable("a\nb\tc") == "a\nb\tc"
    assert display.printable("a\nb\tc", newlines=False) == "a\\nb\\tc"


def test_plain_text_and_non_latin_scripts_pass_unchanged() -> None:
    text = "Größe 12 m² — 面积 ١٢ 🙂 e\u0301"
    assert display.printable(text) == text


def test_the_neutralised_set_is_every_invisible_character() -> None:
    """Every control (Cc), format character (Cf: the bidirectional controls, zero-width
    characters, tag characters), line and paragraph separator and variation selector."""
    invisible = {c for c in range(0x110000) if _invisible(chr(c))}
    bidi = {0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A)}
    assert bidi <= invisible == display.NEUTRALISED


def test_arguments_are_shown_in_full_indented_with_controls_neutralised() -> None:
    arguments = {"name": "prod\x1b[8m-and-staging\u0085", "note": "x" * 500, "n": [1]}
    block = display.arguments_block(arguments)
    assert "x" * 500 in block
    assert "\x1b" not in block and "\u0085" not in block
    assert block.splitlines()[0] == "{"
    assert '  "n": [' in block.splitlines()
    # the escapes read back to the original text: nothing was dropped
    assert json.loads(block.replace("\\x85", "\\u0085")) == arguments
