"""The explain table of a bug set: each bug's kernels through `diff --explain --json` on its cases, and the
verdict at its first divergent stage judged named, claim (true, less specific), false, unexplained,
failed, or (a refactor) clean.

    PYTHONPATH=. python tests/kernels_mutants/explain_table.py --backend host [--bug NAME] [--out DIR]

prints one line per bug (outcome, then the headline) and a tally; with --out, each bug's results document.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from explain_mutants import EXPLAIN_BUGS, Bug  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
KERNELS = ROOT / "kernels"
CI_GOLDENS = ROOT / "goldens" / "ci.h5"
STRUCTURAL_CLAIMS = {"never-written", "stale", "layout", "row-aliasing", "permutation", "index-shift",
                     "scale-exponent", "sub-step", "rounding-convention", "constant-factor"}


def _finding_matches(finding: dict, named: dict) -> bool:
    evidence = finding["evidence"]
    if named.get("kind") and finding["kind"] != named["kind"]:
        return False
    if "sub_step" in named and evidence.get("sub_step") != named["sub_step"]:
        return False
    if "axis" in named and evidence.get("axis") != named["axis"]:
        return False
    if "tensor" in named and finding["tensor"] != named["tensor"]:
        return False
    if "predicate" in named and not any(named["predicate"] in p for p in evidence.get("predicates", [])):
        return False
    if "trial" in named and evidence.get("trial") != named["trial"]:
        return False
    return True


def classify(bug: Bug, document: dict) -> tuple[str, str]:
    """(outcome, headline) of the bug's first isolated verdict at its first divergent stage."""
    if bug.stage is None:
        return ("clean", "conformant") if document.get("passed") else ("false", "a refactor diverged")
    explanations = [e for e in document.get("explain", {}).get("explanations", [])
                    if e["stage"] == bug.stage and e["verdict"] != "inherited"]
    if not explanations:
        return "unexplained", f"no isolated divergence at {bug.stage}"
    outcomes = [_judge(bug, explanation) for explanation in explanations]
    order = ("failed", "false", "unexplained", "claim", "named")
    worst = min(outcomes, key=lambda outcome: order.index(outcome))
    return worst, explanations[[o for o in outcomes].index(worst)]["headline"]


def _judge(bug: Bug, explanation: dict) -> str:
    if explanation["verdict"] == "failed":
        return "failed"
    named, findings = bug.named, explanation["diagnosis"]
    cause = explanation.get("cause") or {}
    first = findings[0] if findings else None
    if explanation["verdict"] == "explained":
        if "trial" in named and cause.get("key") == named["trial"]:
            return "named"
        if first is not None and named.get("kind") and _finding_matches(first, named):
            return "named"
        return "false"
    if explanation["verdict"] == "ambiguous":
        keys = {rival["key"] for rival in explanation.get("rivals", [])}
        return "claim" if named.get("trial") in keys else "false"
    if first is None:
        return "unexplained"
    if named.get("kind") and _finding_matches(first, named):
        return "named"
    label = first["kind"] + (":none" if first["kind"] == "sub-step" and first["evidence"].get("sub_step") is None
                             else "")
    if label in bug.claims or first["kind"] in bug.claims:
        return "claim"
    if first["kind"] in STRUCTURAL_CLAIMS:
        return "false"
    return "unexplained"


def run(bug: Bug, backend: str, work: Path, out: Path | None) -> tuple[str, str, float]:
    kernels = bug.apply(KERNELS, work / bug.name)
    command = [sys.executable, "-m", "csa_conform", "diff", str(CI_GOLDENS), "--kernels", str(kernels), "--case",
               bug.cases, "--explain", "--json", "-q", "--backend", backend]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    seconds = time.perf_counter() - started
    if out is not None:
        (out / f"{bug.name}.json").write_text(done.stdout)
    try:
        document = json.loads(done.stdout)
    except json.JSONDecodeError:
        return "failed", (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1], seconds
    if done.returncode == 70:
        return "failed", next((line for line in done.stderr.splitlines() if "internal error" in line), ""), seconds
    outcome, headline = classify(bug, document)
    return outcome, headline, seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="host")
    parser.add_argument("--bug", action="append", default=[])
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    bugs = [bug for bug in EXPLAIN_BUGS if not args.bug or bug.name in args.bug]
    tally: dict[str, int] = {}
    with tempfile.TemporaryDirectory(prefix="csa-explain-table-") as work:
        for bug in bugs:
            outcome, headline, seconds = run(bug, args.backend, Path(work), args.out)
            tally[outcome] = tally.get(outcome, 0) + 1
            print(f"{bug.name} [{bug.kind}, {bug.stage or '-'}] {outcome} ({seconds:.0f} s): {headline}", flush=True)
    print("tally: " + ", ".join(f"{count} {outcome}" for outcome, count in sorted(tally.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
