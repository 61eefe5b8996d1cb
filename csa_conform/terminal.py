"""Text meant for a terminal or a log line, with every control character shown escaped.

Case ids, messages and file names come from files anyone can write. An
ANSI escape or a C1 control (``\\x9b`` is CSI on its own) printed raw
recolours or rewrites the terminal, and a newline splits one failure line
into two so neither carries both the case and its reproduce command. Text
output therefore escapes them as Python does (``\\x1b``, ``\\n``,
``\\u2028``); JSON output keeps the exact characters, which JSON escapes
itself.
"""

from __future__ import annotations

import shlex
import unicodedata

__all__ = ["escaped", "one_line", "shell_join", "shell_word"]

# Unicode line and paragraph separators end a line in some terminals and log viewers.
_BREAKING = {"\u2028", "\u2029", "\x85"}


def _shown(character: str) -> str:
    if unicodedata.category(character) in ("Cc", "Cf", "Zl", "Zp") or character in _BREAKING:
        return repr(character)[1:-1] if character not in "'\"" else character
    return character


def escaped(text: str) -> str:
    """``text`` with control, format and line-breaking characters written as escapes."""
    if text.isprintable():
        return text
    return "".join(_shown(character) for character in text)


def one_line(text: str) -> str:
    """A message as one line: its own line breaks become spaces, every other control an escape."""
    return escaped(" ".join(str(text).splitlines()))


def shell_word(word: str) -> str:
    """``word`` quoted for a POSIX shell; with control characters, bash's $'...' so the line stays printable."""
    if word.isprintable():
        return shlex.quote(word)
    inner = "".join(
        f"\\x{ord(character):02x}" if ord(character) < 0x100 and not character.isprintable()
        else (f"\\u{ord(character):04x}" if ord(character) < 0x10000 else f"\\U{ord(character):08x}")
        if not character.isprintable() else ("\\" + character if character in "\\'" else character)
        for character in word
    )
    return f"$'{inner}'"


def shell_join(words) -> str:
    """A command line a user can paste: every word quoted by ``shell_word``."""
    return " ".join(shell_word(str(word)) for word in words)
