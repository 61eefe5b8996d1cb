"""CUDA C source as tokens with their offsets: what a mutation operator may touch and what it may not.

A mutant changes one token or one statement of code, never a comment, a string
or character literal, a preprocessor line (a ``#define`` is every use of it at
once) or an entry's signature (the ABI the runner launches). The tokenizer
knows just enough C for that: comments, literals, preprocessor lines (with
their continuations), identifiers, numbers and the punctuators, the longest
first, so ``<=``, ``>>`` and ``->`` are one token each.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

CODE, COMMENT, STRING, PREPROCESSOR = "code", "comment", "string", "preprocessor"
IDENTIFIER, NUMBER, PUNCTUATOR = "identifier", "number", "punctuator"

_PUNCTUATORS = sorted("""<<= >>= ... -> ++ -- << >> <= >= == != && || += -= *= /= %= &= |= ^= ::
    { } [ ] ( ) ; : , . ? ~ ! + - * / % < > = & | ^ #""".split(), key=len, reverse=True)

_TOKEN = re.compile("|".join([
    r"(?P<comment>//[^\n]*|/\*.*?\*/)",
    r"(?P<string>\"(?:\\.|[^\"\\\n])*\"|'(?:\\.|[^'\\\n])*')",
    r"(?P<preprocessor>^[ \t]*\#(?:\\\n|[^\n])*)",
    r"(?P<number>(?:0[xX][0-9a-fA-F']+(?:\.[0-9a-fA-F]*)?(?:[pP][+-]?\d+)?|\.?\d[0-9']*(?:\.\d*)?(?:[eE][+-]?\d+)?)"
    r"[uUlLfF]*)",
    r"(?P<identifier>[A-Za-z_]\w*)",
    r"(?P<punctuator>" + "|".join(re.escape(p) for p in _PUNCTUATORS) + ")",
    r"(?P<space>[ \t\r\f\v]*\n|[ \t\r\f\v]+)",
    r"(?P<other>.)",
]), re.S | re.M)


@dataclass(frozen=True)
class Token:
    kind: str
    text: str
    start: int  # offset in the file
    line: int  # 1-based
    column: int  # 1-based

    @property
    def end(self) -> int:
        return self.start + len(self.text)


def tokenize(text: str) -> list[Token]:
    """The code tokens of a source, in order; comments, literals and preprocessor lines are left out
    (``all_tokens`` keeps them)."""
    return [token for token in all_tokens(text) if token.kind in (IDENTIFIER, NUMBER, PUNCTUATOR, STRING)]


def all_tokens(text: str) -> list[Token]:
    tokens: list[Token] = []
    line, line_start = 1, 0
    for found in _TOKEN.finditer(text):
        kind = found.lastgroup
        if kind not in ("space", "other"):
            tokens.append(Token(kind, found.group(), found.start(), line, found.start() - line_start + 1))
        newlines = found.group().count("\n")
        if newlines:
            line += newlines
            line_start = found.start() + found.group().rfind("\n") + 1
    return tokens


def integer_value(text: str) -> tuple[int, str, str] | None:
    """(value, base prefix, suffix) of an integer literal, None for a floating one."""
    found = re.fullmatch(r"(0[xX])([0-9a-fA-F']+)([uUlL]*)|([0-9][0-9']*)([uUlL]*)", text)
    if found is None:
        return None
    if found[1]:
        return int(found[2].replace("'", ""), 16), found[1], found[3]
    digits = found[4].replace("'", "")
    if len(digits) > 1 and digits.startswith("0"):
        return None  # octal: left alone
    return int(digits), "", found[5]


def signature_spans(tokens: list[Token]) -> list[tuple[int, int]]:
    """The offsets of every entry's parameter list (``extern "C" __global__ void name(...)``), which no
    mutant touches: the runner launches the ABI as specs/kernel-abi.md fixes it."""
    spans = []
    for index, token in enumerate(tokens):
        if token.text != "__global__":
            continue
        for at in range(index + 1, min(index + 6, len(tokens))):
            if tokens[at].text == "(":
                close = matching(tokens, at)
                spans.append((tokens[index].start, tokens[close].end))
                break
    return spans


def matching(tokens: list[Token], index: int) -> int:
    """The index of the bracket that closes the one at ``index`` (the last token when none does)."""
    opening = tokens[index].text
    closing = {"(": ")", "[": "]", "{": "}"}[opening]
    depth = 0
    for at in range(index, len(tokens)):
        if tokens[at].text == opening:
            depth += 1
        elif tokens[at].text == closing:
            depth -= 1
            if depth == 0:
                return at
    return len(tokens) - 1


_CONDITIONAL = re.compile(r"[ \t]*#\s*(ifdef|ifndef|if|elif|else|endif|define)\b\s*(\w*)")
_IF_DEFINED = re.compile(r"[ \t]*#\s*if\s+(!?)\s*defined\s*\(?\s*(\w+)\s*\)?\s*$")


def inactive_spans(text: str, defined: frozenset[str]) -> list[tuple[int, int]]:
    """Offsets the preprocessor drops for these macros: the branches of ``#ifdef``/``#ifndef`` (and
    ``#if defined(X)``) that are not taken. A mutant there changes no compiled code; an ``#if`` or
    ``#elif`` on anything else is taken as active (its code mutated)."""
    macros = set(defined)
    spans: list[tuple[int, int]] = []
    # per open conditional: whether its enclosing code is active, whether a branch was taken, where the
    # current branch's dropped span began (None: the branch is active, or the enclosing code is dropped)
    stack: list[list] = []
    active = True
    for token in all_tokens(text):
        found = _CONDITIONAL.match(token.text) if token.kind == PREPROCESSOR else None
        if found is None:
            continue
        word, name = found[1], found[2]
        if word in ("ifdef", "ifndef", "if"):
            named = _IF_DEFINED.match(token.text) if word == "if" else None
            if word == "if":
                taken = True if named is None else ((named[2] in macros) != bool(named[1]))
            else:
                taken = (name in macros) == (word == "ifdef")
            stack.append([active, taken, token.end if active and not taken else None])
            active = active and taken
        elif word in ("else", "elif") and stack:
            outer, taken_before, dropped = stack[-1]
            if dropped is not None:
                spans.append((dropped, token.start))
            now = outer and not taken_before
            stack[-1] = [outer, taken_before or now, token.end if outer and not now else None]
            active = now
        elif word == "endif" and stack:
            outer, _, dropped = stack.pop()
            if dropped is not None:
                spans.append((dropped, token.start))
            active = outer
        elif word == "define" and active and name:
            macros.add(name)
    spans += [(dropped, len(text)) for _, _, dropped in stack if dropped is not None]
    return sorted(spans)
