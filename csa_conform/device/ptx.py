"""What a module's PTX does to binary32 arithmetic: flush-to-zero, approximations, fused multiply-adds.

These are the instructions that can make a kernel round differently from the
CPU reference. CUDA's own expf/log2f/exp2f bodies contain ex2.approx,
lg2.approx.ftz and fma.rn.f32 by design, and they are inlined at the calling
line (they carry no line info of their own), so an instruction counts as the
math library's when its ``.loc`` names a header NVRTC supplied or a line of
the module that calls a CUDA math function; everything else is the module's
own source and is named file:line. The report informs; only --strict-ptx
refuses a module for it.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

CATEGORIES = ("ftz", "approx", "fma.f32")
LIBRARY = "library"
OWN = "own"

MATH_FUNCTIONS = (
    "exp", "expf", "exp2", "exp2f", "exp10f", "expm1f", "log", "logf", "log2", "log2f", "log10f", "log1pf",
    "pow", "powf", "sin", "sinf", "cos", "cosf", "sincos", "sincosf", "tan", "tanf", "sinpif", "cospif",
    "tanh", "tanhf", "erf", "erff", "rsqrtf", "cbrtf", "__expf", "__logf", "__powf", "__sinf", "__cosf",
)

_FILE = re.compile(r'^\s*\.file\s+(\d+)\s+"([^"]*)"')
_LOC = re.compile(r"^\s*\.loc\s+(\d+)\s+(\d+)\s+\d+")
_FUSED = re.compile(r"^(?:fma|mad)(?:\.r[nzmp])?(?:\.ftz)?(?:\.sat)?\.f32$")
_ALIAS = re.compile(r"^\s*#\s*define\s+(\w+)\s+(\w+)\s*$")


def categories(opcode: str) -> list[str]:
    """The report categories of one PTX opcode (e.g. 'ex2.approx.ftz.f32' is approx and ftz)."""
    found = []
    parts = opcode.split(".")
    if "ftz" in parts:
        found.append("ftz")
    if "approx" in parts:
        found.append("approx")
    if _FUSED.match(opcode):
        found.append("fma.f32")
    return found


def math_call_lines(source: str) -> set[int]:
    """1-based lines of `source` that call a CUDA math function (directly or through a #define alias)."""
    names = set(MATH_FUNCTIONS)
    for line in source.splitlines():
        alias = _ALIAS.match(line)
        if alias and alias.group(2) in names:
            names.add(alias.group(1))
    call = re.compile(r"(?<![\w.])(?:" + "|".join(sorted(map(re.escape, names), key=len, reverse=True)) + r")\s*\(")
    return {number for number, line in enumerate(source.splitlines(), 1) if call.search(line)}


@dataclass
class PtxReport:
    """Counts per category split into math-library and own-source instructions, and the own lines."""

    module: str
    counts: dict[str, dict[str, int]] = field(default_factory=lambda: {c: {LIBRARY: 0, OWN: 0} for c in CATEGORIES})
    own_lines: dict[str, Counter] = field(default_factory=lambda: {c: Counter() for c in CATEGORIES})

    def total(self, category: str) -> int:
        return sum(self.counts[category].values())

    @property
    def flagged(self) -> list[str]:
        return [category for category in CATEGORIES if self.total(category)]

    def summary(self) -> str:
        """One line: 'ftz 3 (library 3, own 0); ... own: fma.f32 at x.cu:12 (4), ...'."""
        parts = [f"{category} {self.counts[category][LIBRARY]} library + {self.counts[category][OWN]} own"
                 for category in CATEGORIES]
        own = [f"{category} at " + ", ".join(f"{where} ({count})" for where, count in lines.most_common(4))
               + (f", +{len(lines) - 4} lines" if len(lines) > 4 else "")
               for category, lines in self.own_lines.items() if lines]
        return "; ".join(parts) + (" — own: " + "; ".join(own) if own else "")

    def to_dict(self) -> dict:
        return {
            "counts": {category: dict(split) for category, split in self.counts.items()},
            "own_lines": {category: dict(lines) for category, lines in self.own_lines.items()},
        }


def analyse(module: str, ptx: str, source: str, locate: Callable[[int], str], source_name: str) -> PtxReport:
    """Parse PTX compiled with line info from `source` (NVRTC names it `source_name` in .file)."""
    library_lines = math_call_lines(source)
    files: dict[str, str] = {}
    for line in ptx.splitlines():
        match = _FILE.match(line)
        if match:
            files[match.group(1)] = match.group(2)
    report = PtxReport(module)
    where: tuple[str, int] | None = None
    for line in ptx.splitlines():
        loc = _LOC.match(line)
        if loc:
            where = (loc.group(1), int(loc.group(2)))
            continue
        text = line.strip()
        if not text or text.startswith(("//", ".", "$", "{", "}", ")")):
            continue
        opcode = text.split()[0]
        if opcode.startswith("@"):
            opcode = text.split()[1]
        found = categories(opcode)
        if not found:
            continue
        own_line = None
        if where is not None and _is_source(files.get(where[0], ""), source_name) and where[1] not in library_lines:
            own_line = locate(where[1])
        for category in found:
            report.counts[category][OWN if own_line else LIBRARY] += 1
            if own_line:
                report.own_lines[category][own_line] += 1
    return report


def _is_source(file: str, source_name: str) -> bool:
    return file == source_name or file.endswith("/" + source_name)
