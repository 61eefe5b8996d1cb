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

__all__ = ["escaped", "one_line", "shell_join", "shell_word"]

def _shown(character: str) -> str:
    return character if character.isprintable() else repr(character)[1:-1]


def escaped(text: str) -> str:
    """``text`` with every character str.isprintable refuses (controls, format characters, line and
    paragraph separators, surrogates, unassigned code points) written as an escape."""
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
    inner = "".join(_ansi_c(character) for character in word)
    return f"$'{inner}'"


def _ansi_c(character: str) -> str:
    """One character inside bash's $'...': ASCII controls as \\xHH, other unprintables as \\u or \\U
    (which bash writes as UTF-8; \\xHH would be a raw byte)."""
    if character in "\\'":
        return "\\" + character
    if character.isprintable():
        return character
    code = ord(character)
    if code < 0x80:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def shell_join(words) -> str:
    """A command line a user can paste: every word quoted by ``shell_word``."""
    return " ".join(shell_word(str(word)) for word in words)
