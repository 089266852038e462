"""Text from storage on the operator's terminal.

A table's metadata, its file names, exception messages that quote them, key ids and
property values are written by whoever can write the storage.  Printed as they are, an
escape sequence in a path (``ESC ] 0 ; ... BEL`` sets the window title, ``ESC [ 2 J``
clears the screen, others rewrite lines or answer back through the terminal) or a bidi
override (U+202E) would act on the terminal instead of being read.  :func:`safe` shows
every character that is not printable as an escape (``\\x1b``, ``\\u202e``) and keeps all
printable text, non-ASCII letters included.

The command line applies it twice: to each message that embeds such text (errors, report
lines), and through :class:`SafeStream` to everything its handlers print on stdout and
stderr, where only the line breaks of the CLI's own multi-line output pass.
"""

from __future__ import annotations

from typing import Any, TextIO

__all__ = ["SafeStream", "safe", "safe_lines"]


_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(ch: str) -> str:
    if ch in _NAMED:
        return _NAMED[ch]
    code = ord(ch)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def safe(text: Any) -> str:
    """``str(text)`` with every non-printable character escaped, line breaks and tabs
    included: the result is one line that puts nothing but visible characters on a
    terminal."""
    text = text if isinstance(text, str) else str(text)
    if text.isprintable():
        return text
    # str.isprintable is False for C0 and C1 controls, DEL, format characters (bidi
    # embeddings, overrides, isolates and marks, zero-width characters, BOM), line and
    # paragraph separators, lone surrogates (undecodable bytes of a file name), private
    # use and unassigned code points, and spaces other than U+0020
    return "".join(ch if ch.isprintable() else _escape(ch) for ch in text)


def safe_lines(text: Any) -> str:
    """As :func:`safe`, but ``\\n`` stays a line break (for output the CLI composes
    of several lines; text embedded in one line should go through :func:`safe` first)."""
    text = text if isinstance(text, str) else str(text)
    return "\n".join(map(safe, text.split("\n")))


class SafeStream:
    """A text stream that writes :func:`safe_lines` of everything to ``stream``.

    The rest of the stream's interface (``buffer`` for binary output, ``isatty``,
    ``flush``, ``encoding``...) is the wrapped stream's.  ``unescaped`` is the wrapped
    stream, for output the CLI itself composes with controls (a progress bar's ``\\r``).
    """

    def __init__(self, stream: TextIO):
        self.unescaped = stream

    def write(self, text: str) -> int:
        self.unescaped.write(safe_lines(text))
        return len(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.unescaped, name)
