"""JSON read from someone else's file, with every dimension bounded before Python's parser sees it.

``json.loads`` recurses once per nesting level (100,000 levels is a
RecursionError), turns a 5,000-digit integer into an int that every later
``str()`` refuses, reads ``NaN`` and ``Infinity`` that standard JSON does
not have, and is happy to be handed all of /dev/zero. ``read_text`` takes
a regular file or stdin only, at most ``MAX_BYTES``, as UTF-8; ``loads``
refuses documents deeper than ``MAX_DEPTH``, numbers longer than
``MAX_NUMBER_CHARS`` characters, integers outside int64 and non-finite
numbers (``JSONRefused``); ``loads`` makes every refusal one ``UsageError``
line naming the source. The golden reader parses its JSON attributes with
``parse`` too.
"""

from __future__ import annotations

import json
import os
import stat
import sys

from csa_conform.errors import UsageError

__all__ = ["MAX_BYTES", "MAX_DEPTH", "MAX_NUMBER_CHARS", "JSONRefused", "loads", "parse", "read_text"]

MAX_BYTES = 256 << 20
MAX_DEPTH = 64
MAX_NUMBER_CHARS = 40
INT64 = (-(1 << 63), (1 << 63) - 1)


class JSONRefused(ValueError):
    """JSON outside the bounds (a ValueError, as json's own errors are)."""


def read_text(source: str, *, stdin_closed: bool = False) -> str:
    """The UTF-8 text of a regular file, or of stdin for '-', refused past MAX_BYTES."""
    if source == "-":
        if stdin_closed or sys.stdin is None:
            raise UsageError("-: stdin is closed; nothing to read")
        raw = _bounded(sys.stdin.buffer, source)
    else:
        try:
            mode = os.stat(source).st_mode
        except OSError as error:
            raise UsageError(f"{source}: cannot read ({error.strerror})") from None
        if not stat.S_ISREG(mode):
            raise UsageError(f"{source}: not a regular file (a FIFO, device or directory is not read)")
        try:
            with open(source, "rb") as handle:
                raw = _bounded(handle, source)
        except OSError as error:
            raise UsageError(f"{source}: cannot read ({error.strerror})") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise UsageError(f"{source}: not UTF-8 text (byte {error.start})") from None


def _bounded(handle, source: str) -> bytes:
    raw = handle.read(MAX_BYTES + 1)
    if len(raw) > MAX_BYTES:
        raise UsageError(f"{source}: larger than {MAX_BYTES >> 20} MiB; not a results document")
    return raw


def _integer(text: str) -> int:
    if len(text) > MAX_NUMBER_CHARS:
        raise JSONRefused(f"an integer of {len(text)} digits")
    value = int(text)
    if not INT64[0] <= value <= INT64[1]:
        raise JSONRefused(f"integer {text} is outside int64")
    return value


def _float(text: str) -> float:
    if len(text) > MAX_NUMBER_CHARS:
        raise JSONRefused(f"a number of {len(text)} characters")
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise JSONRefused(f"number {text} is not finite in binary64")
    return value


def _constant(name: str):
    raise JSONRefused(f"{name} is not JSON")


def _depth(document) -> int:
    """Nesting depth, counted without recursion."""
    deepest, pending = 0, [(document, 1)]
    while pending:
        value, depth = pending.pop()
        if isinstance(value, (dict, list)):
            deepest = max(deepest, depth)
            if depth <= MAX_DEPTH:
                children = value.values() if isinstance(value, dict) else value
                pending.extend((child, depth + 1) for child in children)
    return deepest


def parse(text: str, *, non_finite: bool = False):
    """The JSON value of ``text`` within the bounds above; JSONRefused or json's own error otherwise.

    ``non_finite`` admits NaN and ±Infinity (Python's spelling), as node attributes may hold them:
    the reference's own rejection of a NaN scale is a case the goldens keep.
    """
    hooks = {} if non_finite else {"parse_float": _float, "parse_constant": _constant}
    try:
        document = json.loads(text, parse_int=_integer, **hooks)
    except RecursionError:
        raise JSONRefused(f"nested deeper than {MAX_DEPTH} levels") from None
    if _depth(document) > MAX_DEPTH:
        raise JSONRefused(f"nested deeper than {MAX_DEPTH} levels")
    return document


def loads(text: str, source: str):
    """``parse`` for a document a user handed over: every refusal one UsageError naming ``source``."""
    try:
        return parse(text)
    except JSONRefused as refused:
        raise UsageError(f"{source}: not a results document ({refused})") from None
    except json.JSONDecodeError as error:
        raise UsageError(f"{source}: not JSON ({error})") from None
