"""Text from files made safe to print: no terminal escape sequences, no forged lines.

Anything nkibuild renders that came from a file (HLO names, NEFF fields, compiler
logs, paths named inside a module, messages of user code) goes through `printable`
(one line) or `printable_lines` (a multi-line log), so a hostile file can neither
drive the terminal (ESC sequences, bidi overrides) nor add lines that look like
nkibuild's own output.
"""

from __future__ import annotations

import unicodedata

# Not printable on a terminal: control characters (C0, DEL, C1), format characters
# (bidi overrides and isolates, zero-width joiners), line and paragraph separators,
# surrogates and unassigned/private code points.
_UNSAFE = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})


def printable(text: str) -> str:
    """`text` on one line, every unsafe character escaped Python-style (`\\x1b`, `\\n`)."""
    if text.isprintable():  # the common case: nothing to do
        return text
    return "".join(
        char.encode("unicode_escape").decode() if unicodedata.category(char) in _UNSAFE else char
        for char in text
    )


def printable_lines(text: str) -> str:
    """A multi-line text (a log) with its line breaks kept and everything else escaped;
    tabs are kept too, since logs indent with them."""
    return "\n".join(
        "\t".join(printable(part) for part in line.split("\t")) for line in text.split("\n")
    )
