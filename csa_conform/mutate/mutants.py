"""The mutants of a kernel directory: every change an operator makes to one of its sources, each with a stable id.

A mutant's id is ``file:line:column:operator:digest``, the digest a hash of
the operator, the replaced text, its replacement and the source line, so the
same mutant has the same id in every run, on every machine and in every shard,
and an edit elsewhere in the file does not rename it. ``sample`` draws a fixed
number stratified by operator (each operator its equal share, what one cannot
fill going to the others), so a sample is not all integer constants; the draw
depends only on the seed and the mutants.
"""

from __future__ import annotations

import hashlib
import random
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from csa_conform.device.kernels import MODULES, KernelDirectory
from csa_conform.errors import UsageError
from csa_conform.mutate.operators import OPERATORS, Source
from csa_conform.mutate.tokens import inactive_spans, signature_spans, tokenize


@dataclass(frozen=True)
class Mutant:
    """One change to one file of a kernel directory."""

    file: str
    line: int
    column: int
    operator: str
    start: int
    end: int
    original: str
    replacement: str
    digest: str

    @property
    def id(self) -> str:
        return f"{self.file}:{self.line}:{self.column}:{self.operator}:{self.digest}"

    def apply(self, text: str) -> str:
        return text[:self.start] + self.replacement + text[self.end:]

    def lines(self, text: str) -> tuple[str, str]:
        """The source lines the change touches, before and after it (each stripped of its indentation)."""
        first = text.rfind("\n", 0, self.start) + 1
        last = text.find("\n", self.end)
        last = len(text) if last < 0 else last
        before = text[first:last]
        after = before[:self.start - first] + self.replacement + before[self.end - first:]
        return " ".join(before.split()), " ".join(after.split())

    def change(self) -> str:
        """What changed, in a few words: `<` -> `<=`."""
        original = " ".join(self.original.split())
        replacement = " ".join(self.replacement.split()) or "(deleted)"
        return f"`{original}` -> `{replacement}`" if len(original) <= 60 else f"`{original[:57]}...` -> `{replacement[:60]}`"


def directory_files(kernels: KernelDirectory) -> list[str]:
    """The files a mutant may change: the prelude, then each module's file, in the registry's order."""
    return [kernels.prelude, *(kernels.file_name(module) for module in MODULES)]


def build_macros(options: Sequence[str]) -> frozenset[str]:
    """The macros a build defines (-DNAME, -DNAME=V, --define-macro=NAME)."""
    names = set()
    for option in options:
        value = option[2:] if option.startswith("-D") else option.split("=", 1)[1] if option.startswith(
            "--define-macro=") else None
        if value:
            names.add(value.split("=", 1)[0])
    return frozenset(names)


def contracts(options: Sequence[str]) -> bool:
    """Whether NVRTC may fuse a*b+c under these options: --fmad=true is its default, the last one wins."""
    fmad = [option for option in options if option.startswith("--fmad=")]
    return not fmad or fmad[-1] == "--fmad=true"


def mutants_of_text(name: str, text: str, operators: Iterable[str] = tuple(OPERATORS),
                    options: Sequence[str] = ()) -> list[Mutant]:
    """Every mutant the operators make of one source, in source order (operators in OPERATORS' order)."""
    tokens = tokenize(text)
    excluded = signature_spans(tokens) + inactive_spans(text, build_macros(options))
    tokens = [token for token in tokens if not any(start <= token.start < end for start, end in excluded)]
    source = Source(text, tokens, contracts(options))
    found: dict[tuple[int, int, str], Mutant] = {}
    for operator in operators:
        for change in OPERATORS[operator](source):
            original = text[change.start:change.end]
            if original == change.replacement or (change.start, change.end, change.replacement) in found:
                continue
            line = text.count("\n", 0, change.start) + 1
            column = change.start - (text.rfind("\n", 0, change.start) + 1) + 1
            line_start = text.rfind("\n", 0, change.start) + 1
            line_end = text.find("\n", change.end)
            context = text[line_start:len(text) if line_end < 0 else line_end]
            digest = hashlib.sha256("\0".join((operator, original, change.replacement, context)).encode()).hexdigest()
            found[(change.start, change.end, change.replacement)] = Mutant(
                name, line, column, operator, change.start, change.end, original, change.replacement, digest[:8])
    made = {mutant.id: position for position, mutant in enumerate(found.values())}
    return sorted(found.values(), key=lambda mutant: (mutant.start, list(OPERATORS).index(mutant.operator),
                                                      mutant.end, made[mutant.id]))


def mutants_of(kernels: KernelDirectory, files: Sequence[str] | None = None,
               operators: Sequence[str] | None = None) -> tuple[list[Mutant], dict[str, str]]:
    """The mutants of a kernel directory's sources (of ``files`` only, when given) and the texts they apply to."""
    names = directory_files(kernels)
    if files:
        unknown = [name for name in files if name not in names]
        if unknown:
            raise UsageError(f"--files: {unknown[0]!r} is not a source of {kernels.path} (its sources: "
                             f"{', '.join(names)})")
        names = [name for name in names if name in files]
    unknown = [name for name in operators or () if name not in OPERATORS]
    if unknown:
        raise UsageError(f"--operators: {unknown[0]!r} is not an operator (choose from {', '.join(OPERATORS)})")
    texts = {name: kernels.read(name) for name in names}
    mutants = [mutant for name in names
               for mutant in mutants_of_text(name, texts[name], operators or tuple(OPERATORS), kernels.build.options)]
    return mutants, texts


def sample(mutants: Sequence[Mutant], count: int, seed: int) -> list[Mutant]:
    """``count`` mutants stratified by operator, in id order: each operator its equal share of what is left,
    drawn with a generator seeded by the seed and the operator's name."""
    by_operator: dict[str, list[Mutant]] = {}
    for mutant in sorted(mutants, key=lambda mutant: mutant.id):
        by_operator.setdefault(mutant.operator, []).append(mutant)
    for operator, members in by_operator.items():
        random.Random(f"{seed}:{operator}").shuffle(members)
    chosen: list[Mutant] = []
    left = min(count, len(mutants))
    open_operators = sorted(by_operator)
    taken = dict.fromkeys(open_operators, 0)
    while left > 0 and open_operators:
        share = max(1, left // len(open_operators))
        for operator in list(open_operators):
            if left == 0:
                break
            members = by_operator[operator]
            take = min(share, len(members) - taken[operator], left)
            chosen.extend(members[taken[operator]:taken[operator] + take])
            taken[operator] += take
            left -= take
            if taken[operator] == len(members):
                open_operators.remove(operator)
    return sorted(chosen, key=lambda mutant: mutant.id)


def changed_since(directory: Path, reference: str) -> set[str]:
    """The names of the directory's files that differ from git revision ``reference`` (committed or not)."""
    try:
        top = subprocess.run(["git", "-C", str(directory), "rev-parse", "--show-toplevel"], capture_output=True,
                             text=True, check=True).stdout.strip()
        listed = subprocess.run(["git", "-C", str(directory), "diff", "--name-only", "--relative", reference, "--", "."],
                                capture_output=True, text=True)
    except (OSError, subprocess.CalledProcessError):
        raise UsageError(f"--since: {directory} is not inside a git work tree") from None
    if listed.returncode != 0:
        reason = (listed.stderr.strip().splitlines() or ["git diff failed"])[0]
        raise UsageError(f"--since {reference}: {reason} (in {top})")
    return {Path(line).name for line in listed.stdout.splitlines() if line.strip()}
