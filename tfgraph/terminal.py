"""Text from users or files made safe to print on one terminal line.

Paths, model names and messages read from files can hold control characters: an ANSI escape
(``"\\x1b[2J"``) would act on the user's terminal, a newline or U+2028 would forge extra output
lines, bidirectional overrides (U+202E) reorder what is shown, and the lone surrogates that stand
for undecodable bytes in file names cannot be encoded at all. :func:`printable` writes such
characters as Python escapes (``\\x1b``, ``\\n``, ``\\u2028``, ``\\udcff``) and leaves all other
text as is.
"""

from __future__ import annotations

import unicodedata

# Unicode's bidirectional formatting characters (Unicode Standard Annex #9, "Explicit
# Directional Formatting Characters" and "Implicit Directional Formatting Characters").
_BIDI = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
# Control characters (C0, DEL, C1), the line and paragraph separators, and lone surrogates:
# Python reads undecodable bytes of file names as U+DC80..U+DCFF ("surrogateescape"), which a
# UTF-8 stream refuses to encode (UnicodeEncodeError on stdout outside the C locale).
_UNSAFE_CATEGORIES = frozenset({"Cc", "Zl", "Zp", "Cs"})


def _unsafe(ch: str) -> bool:
    return ch in _BIDI or unicodedata.category(ch) in _UNSAFE_CATEGORIES


def _escape(ch: str) -> str:
    code = ord(ch)
    if ch in "\n\r\t":
        return {"\n": "\\n", "\r": "\\r", "\t": "\\t"}[ch]
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str) -> str:
    """``text`` with control, line-separator, bidi and surrogate characters escaped (one safe
    line that any UTF-8 stream can encode)."""
    if text.isprintable():  # the common case: nothing to do
        return text
    return "".join(_escape(ch) if _unsafe(ch) else ch for ch in text)


MAX_LINE = 300
"""Longest error line printed (issue 27): a hostile file's 5 MB tensor name or a deeply nested
path must not become a screenful. Messages that quote names shorten them themselves; this is
the safety net for every line the command line prints on stderr."""

_TAIL = 80
"""Characters kept from the end of a cut line: the end names what is at fault (the file at
the end of a path, the advice after it), the start says where."""


def one_line(text: str, limit: int = MAX_LINE) -> str:
    """``text`` as at most about ``limit`` characters: its start and its end, with the number
    of characters left out between them."""
    if len(text) <= limit:
        return text
    room = limit - _TAIL - len(f" ...({len(text):,} characters left out)... ")
    head = max(room, 0)
    return (f"{text[:head]} ...({len(text) - head - _TAIL:,} characters left out)... "
            f"{text[-_TAIL:]}")


def short_path(path: object, limit: int = 160) -> str:
    """A path for an error line: printable, and past ``limit`` characters its leading folders
    are left out (``.../models/victim/model.onnx``) so that the name at fault stays."""
    text = printable(str(path))
    if len(text) <= limit:
        return text
    tail = text[-(limit - 4):]
    cut = tail.find("/")
    return ".../" + (tail[cut + 1:] if 0 <= cut < len(tail) - 1 else tail)
