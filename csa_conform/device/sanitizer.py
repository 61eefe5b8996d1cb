"""``diff --sanitize memcheck|racecheck|initcheck|synccheck``: the same diff under NVIDIA compute-sanitizer.

An access past the end of a buffer, a shared-memory race, a read of global
memory never written or a barrier only some threads reach can leave every
payload bit-exact. compute-sanitizer sees them; it runs a child ``diff --json``
(with its report in a log file, so the child's stdout stays the results
document) and its report is parsed here into findings, one per reported
error: the kernel, the kind of error, the access size, address, thread and
block, and what the tool said about them. The child knows it runs under the
tool (SANITIZER_ENV): without CuPy's memory pool, so every buffer is an
allocation of its own and an access past one is out of bounds rather than
inside the pool's next block, and under initcheck without the 0xA5 fill of
uninitialised buffers, which would make every read of them look initialised.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

from csa_conform.errors import DeviceUnavailable

TOOLS = ("memcheck", "racecheck", "initcheck", "synccheck")
SANITIZER = "compute-sanitizer"
SANITIZER_ENV = "CSA_CONFORM_SANITIZER_TOOL"
INITCHECK = "initcheck"
MEMCHECK = "memcheck"
DEFAULT_TOOLKITS = ("/usr/local/cuda",)  # where a CUDA toolkit lives when $CUDA_HOME is unset
PRINT_LIMIT = 100  # errors printed in full; the summary still counts them all

_PREFIX = re.compile(r"^=+ ?(?P<indent>\s*)(?P<text>.*?)\s*$")
_KINDS = (
    (re.compile(r"Invalid __(?P<space>\w+)__ (?P<access>read|write|atomic) of size (?P<size>\d+)"), "invalid-{access}"),
    (re.compile(r"Uninitialized __(?P<space>\w+)__ memory read of size (?P<size>\d+)"), "uninitialized-read"),
    (re.compile(r"(?:Error|Warning): Race reported between (?P<access>\w+) access at (?P<at>.+)"), "race"),
    (re.compile(r"Barrier error detected\.?(?P<detail>.*)"), "barrier"),
    (re.compile(r"Misaligned (?:__(?P<space>\w+)__ )?(?P<access>\w+) of size (?P<size>\d+)"), "misaligned-{access}"),
    (re.compile(r"Program hit (?P<error>\w+) \(error \d+\) due to \"(?P<detail>[^\"]*)\""), "cuda-error"),
)
_AT = re.compile(r"^at (?P<at>.+)$")
_THREAD = re.compile(r"by thread \((?P<thread>[\d, ]+)\) in block \((?P<block>[\d, ]+)\)")
_ADDRESS = re.compile(r"^(?:Address|Access at) (?P<address>0x[0-9a-fA-F]+)\s*(?P<detail>.*)$")
# memcheck, initcheck and synccheck end with an ERROR SUMMARY; racecheck with its own line.
_SUMMARY = re.compile(r"ERROR SUMMARY: (?P<count>\d+) errors?"
                      r"|RACECHECK SUMMARY: \d+ hazards? displayed \((?P<errors>\d+) errors?")
_HAZARDS = re.compile(r"\[(?P<count>\d+) hazards?\]")


@dataclass
class SanitizerFinding:
    """One error compute-sanitizer reported."""

    tool: str
    kind: str
    message: str
    kernel: str = ""
    size: int | None = None
    address: str | None = None
    thread: str | None = None
    block: str | None = None
    detail: str = ""

    def summary(self) -> str:
        where = " ".join(filter(None, (
            self.kernel and f"in {self.kernel}",
            self.thread and f"thread ({self.thread})", self.block and f"block ({self.block})",
            self.address and f"address {self.address}",
        )))
        return f"{self.tool} {self.kind}: {self.message}" + (f" {where}" if where else "") + (
            f"; {self.detail}" if self.detail else "")

    def to_dict(self) -> dict:
        return {**{key: value for key, value in asdict(self).items() if value not in (None, "")},
                "summary": self.summary()}


def kernel_name(location: str) -> str:
    """The kernel of an ``at`` line, in any of the spellings compute-sanitizer and cuda-memcheck used:
    'kernel+0x50', 'kernel(int*)+0x50 in f.cu:14' or '0x3c8 in f.cu:17:void kernel(int*)'."""
    location = location.strip()
    if location.startswith("0x") and " in " in location:
        location = location.split(" in ", 1)[1].rsplit(":", 1)[-1]
    head = re.split(r"[(+]", location, maxsplit=1)[0].split()
    return head[-1] if head else ""


def parse_report(text: str, tool: str) -> tuple[list[SanitizerFinding], int | None]:
    """Findings in report order, and the summary's error count (None when the report has none)."""
    findings: list[SanitizerFinding] = []
    count = None
    current: SanitizerFinding | None = None
    for line in text.splitlines():
        matched = _PREFIX.match(line)
        if matched is None:
            continue
        content, indented = matched.group("text"), bool(matched.group("indent"))
        summary = _SUMMARY.search(content)
        if summary:
            count = int(summary.group("count") or summary.group("errors"))
            current = None
            continue
        if not content or content in ("COMPUTE-SANITIZER", "CUDA-MEMCHECK"):
            current = None
            continue
        if not indented:
            current = _finding(content, tool)
            if current is not None:
                findings.append(current)
            continue
        if current is not None:
            _continue(current, content)
    return findings, count


def _finding(text: str, tool: str) -> SanitizerFinding | None:
    for pattern, kind in _KINDS:
        matched = pattern.search(text)
        if matched:
            fields = {key: value for key, value in matched.groupdict().items() if value}
            finding = SanitizerFinding(tool, kind.format(**fields), text,
                                       size=int(fields["size"]) if "size" in fields else None)
            if "at" in fields:
                finding.kernel = kernel_name(_HAZARDS.sub("", fields["at"]))
            if "detail" in fields:
                finding.detail = fields["detail"].strip()
            return finding
    if text.startswith(("Saved host backtrace", "Host Frame", "Device Frame")) or "SUMMARY" in text:
        return None
    return SanitizerFinding(tool, "other", text)


def _continue(finding: SanitizerFinding, text: str) -> None:
    at, thread, address = _AT.match(text), _THREAD.search(text), _ADDRESS.match(text)
    if at and not finding.kernel:
        finding.kernel = kernel_name(at.group("at"))
    elif thread:
        finding.thread = thread.group("thread").replace(" ", "")
        finding.block = thread.group("block").replace(" ", "")
    elif address:
        finding.address = address.group("address")
        finding.detail = " ".join(filter(None, (finding.detail, address.group("detail"))))
    elif text.startswith("and is "):
        finding.detail = ", ".join(filter(None, (finding.detail, text[len("and is "):])))
    elif text.startswith("and "):
        finding.detail = " ".join(filter(None, (finding.detail, text)))


def find_sanitizer() -> str:
    """compute-sanitizer on PATH or in the CUDA toolkit; absent, an environment error (exit 4)."""
    candidates = [shutil.which(SANITIZER)] + [
        str(Path(root) / "bin" / SANITIZER) for root in (os.environ.get("CUDA_HOME"), *DEFAULT_TOOLKITS) if root
    ]
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK) and Path(candidate).is_file():
            return candidate
    raise DeviceUnavailable(f"{SANITIZER} is not installed (not on PATH, nor in $CUDA_HOME/bin or "
                            "/usr/local/cuda/bin); it ships with the CUDA toolkit")


@dataclass
class SanitizedRun:
    """What the child diff and the sanitizer said."""

    command: list[str]
    exit_code: int
    stdout: str
    stderr: str
    findings: list[SanitizerFinding]
    error_count: int | None


def run_sanitized(tool: str, diff_arguments: Sequence[str], sanitizer: str | None = None) -> SanitizedRun:
    """``csa-conform diff ARGUMENTS --json`` under ``compute-sanitizer --tool TOOL``."""
    sanitizer = sanitizer or find_sanitizer()
    with tempfile.TemporaryDirectory(prefix="csa-conform-sanitizer-") as scratch:
        log = Path(scratch) / "report.txt"
        # --target-processes all: the kernels launch in diff's worker process (csa_conform._base.pool.Worker)
        command = [sanitizer, "--tool", tool, "--target-processes", "all", "--print-limit", str(PRINT_LIMIT),
                   "--log-file", str(log),
                   sys.executable, "-m", "csa_conform", "diff", *diff_arguments, "--json", "-q"]
        done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, SANITIZER_ENV: tool})
        report = log.read_text(errors="replace") if log.exists() else ""
    findings, count = parse_report(report, tool)
    return SanitizedRun(command, done.returncode, done.stdout, done.stderr, findings, count)
