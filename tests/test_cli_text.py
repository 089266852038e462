"""icecrypt.cli._text: what the command line does to text from storage before a terminal
sees it."""

from __future__ import annotations

import io
import unicodedata

import pytest

from icecrypt.cli._text import SafeStream, safe, safe_lines


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("\x1b]0;pwned\x07", "\\x1b]0;pwned\\x07"),  # OSC: set the window title
        ("\x1b[2J\x1b[H", "\\x1b[2J\\x1b[H"),  # CSI: clear the screen, home the cursor
        ("a\x9b31mb", "a\\x9b31mb"),  # C1 CSI, one code point
        ("\x00\x08\x7f", "\\x00\\x08\\x7f"),  # NUL, backspace, DEL
        ("line\nforged\rline\tx", "line\\nforged\\rline\\tx"),
        ("evil\u202etxt.exe", "evil\\u202etxt.exe"),  # right-to-left override
        ("\u2066\u2067\u2068\u2069\u200e\u200f\u061c", "\\u2066\\u2067\\u2068\\u2069\\u200e\\u200f\\u061c"),
        ("zero\u200bwidth\ufeff", "zero\\u200bwidth\\ufeff"),
        ("\u2028\u2029", "\\u2028\\u2029"),  # line and paragraph separators
        ("bad\udcffbyte", "bad\\udcffbyte"),  # a file name's undecodable byte (surrogateescape)
        ("\U000e0001tag", "\\U000e0001tag"),  # a tag character (format, outside the BMP)
    ],
)
def test_controls_are_escaped(text, shown):
    assert safe(text) == shown


@pytest.mark.parametrize("text", ["", "plain ascii 123 !~", "Müller ørsted Łódź", "東京 データ", "emoji 🔑✓", "\\x1b stays"])
def test_printable_text_is_kept(text):
    assert safe(text) == text


def test_every_code_point():
    """Each printable character stays itself; each other one becomes a printable escape."""
    for code in range(0x110000):
        ch = chr(code)
        out = safe(ch)
        if ch.isprintable():
            assert out == ch
        else:
            assert out.startswith("\\") and len(out) > 1 and out.isprintable(), hex(code)


def test_non_strings_and_exceptions():
    assert safe(OSError("no such file: a\x1bb")) == "no such file: a\\x1bb"
    assert safe(42) == "42"


def test_safe_lines_keeps_only_line_breaks():
    assert safe_lines("one\x1b[2J\ntwo\r\n") == "one\\x1b[2J\ntwo\\r\n"


def test_safe_stream():
    target = io.StringIO()
    stream = SafeStream(target)
    print("report:", "x\x1b]0;t\x07", file=stream)
    stream.writelines(["a\u202e\n", "b\n"])
    assert target.getvalue() == "report: x\\x1b]0;t\\x07\na\\u202e\nb\n"
    assert stream.unescaped is target and stream.getvalue() == target.getvalue()  # the rest is the stream's
    assert all(unicodedata.category(c) != "Cc" or c == "\n" for c in target.getvalue())
