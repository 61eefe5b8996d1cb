"""The explain table of a bug set: each bug's kernels through `diff --explain --json` on its cases, and the
verdict at its first divergent stage judged named (its cause, reproduced), located (a finding that pins where
the bug is, under an "unexplained:" headline: no cause), claim (true, less specific), false, unexplained,
failed, or (a refactor) clean.

    PYTHONPATH=. python tests/kernels_mutants/explain_table.py --backend host [--set explain|diagnosis|all]
        [--bug NAME] [--jobs N] [--out DIR] [--seed KERNEL_DIR --seed-case CASE ...]

prints one line per kernel (outcome, seconds, then the headline) and a tally; with --out, DIR/documents.json
holds every results document by kernel name and DIR/table.txt the lines. --seed runs a kernel directory as
it is on the --seed-case cases and prints the headline of each of its explanations.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from diagnosis_mutants import DIAGNOSED  # noqa: E402
from explain_mutants import EXPLAIN_BUGS, Bug  # noqa: E402

DOCUMENTS_BYTES = 15 << 20  # documents.json beyond this keeps no trials
EVIDENCE_NAMED = ("sub_step", "trial", "axis")  # evidence of diagnosis_mutants that pins a bug in the table

ROOT = Path(__file__).resolve().parents[2]
KERNELS = ROOT / "kernels"
CI_GOLDENS = ROOT / "goldens" / "ci.h5"
STRUCTURAL_CLAIMS = {"never-written", "guard-read", "stale", "layout", "row-aliasing", "permutation", "index-shift",
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
    if "trial" in named and evidence.get("trial") not in _trials(named):
        return False
    return True


def _trials(named: dict) -> tuple[str, ...]:
    """The trial keys that name the bug: one, or variants of one ingredient (glibc's or the device's function)."""
    trial = named.get("trial", ())
    return (trial,) if isinstance(trial, str) else tuple(trial)


def classify(bug: Bug, document: dict) -> tuple[str, str]:
    """(outcome, headline) of the bug's first isolated verdict at its first divergent stage."""
    if bug.stage is None:
        return ("clean", "conformant") if document.get("passed") else ("false", "a refactor diverged")
    explanations = [e for e in document.get("explain", {}).get("explanations", [])
                    if e["stage"] == bug.stage and e["verdict"] != "inherited"]
    if not explanations:
        return "unexplained", f"no isolated divergence at {bug.stage}"
    outcomes = [_judge(bug, explanation) for explanation in explanations]
    order = ("failed", "false", "unexplained", "claim", "located", "named")
    worst = min(outcomes, key=lambda outcome: order.index(outcome))
    return worst, explanations[[o for o in outcomes].index(worst)]["headline"]


def _judge(bug: Bug, explanation: dict) -> str:
    if explanation["verdict"] == "failed":
        return "failed"
    named, findings = bug.named, explanation["diagnosis"]
    cause = explanation.get("cause") or {}
    first = findings[0] if findings else None
    if explanation["verdict"] == "explained":
        if cause.get("key") in _trials(named):
            return "named"
        if first is not None and named.get("kind") and _finding_matches(first, named):
            return "named"
        return "false"
    if explanation["verdict"] == "ambiguous":
        keys = {rival["key"] for rival in explanation.get("rivals", [])}
        return "claim" if keys & set(_trials(named)) else "false"
    if first is None:
        return "unexplained"
    if named.get("kind") and _finding_matches(first, named):
        return "located" if _no_cause(explanation) else "named"
    label = first["kind"] + (":none" if first["kind"] == "sub-step" and first["evidence"].get("sub_step") is None
                             else "")
    if label in bug.claims or first["kind"] in bug.claims:
        return "claim"
    consistent = first["evidence"].get("consistent")
    if label == "sub-step:none" and consistent is not None:  # a fit listing sub-steps, none named: true when the
        return "claim" if _listed(named, consistent) else "false"
    if first["kind"] in STRUCTURAL_CLAIMS:
        return "false"
    return "unexplained"


def _listed(named: dict, consistent: list[str]) -> bool:
    """The bug's sub-step is among those a fit lists (a quantization bug's, where the expectation names none)."""
    if "sub_step" in named:
        return named["sub_step"] in consistent
    return named.get("kind") in ("scale-exponent", "permutation", "rounding-convention") and any(
        "quantization" in step or "round trip" in step for step in consistent)


def _no_cause(explanation: dict) -> bool:
    """An "unexplained:" headline: its finding says where the bug is, no re-run reproduced why."""
    return explanation["headline"].split(": ", 1)[-1].startswith("unexplained")


def diagnosed_bugs() -> tuple[Bug, ...]:
    """diagnosis_mutants' bugs in this table's terms: their kind and the evidence that pins them."""
    found = []
    for bug in DIAGNOSED:
        mutant = bug.mutant
        named = {"kind": bug.kind, **{key: value for key, value in bug.evidence.items() if key in EVIDENCE_NAMED}}
        if bug.kind == "restricted" and bug.evidence.get("axis") == "b" and "trial" not in bug.evidence:
            named = {"kind": "restricted", "predicate": "batch rows b >= 1"}
        found.append(Bug(mutant.name, mutant.file, ((mutant.old, mutant.new),), mutant.stage, mutant.cases, mutant.why,
                         named))
    return tuple(found)


def _diff(kernels: Path, cases: str, backend: str) -> tuple[dict | None, str, int, float]:
    command = [sys.executable, "-m", "csa_conform", "diff", str(CI_GOLDENS), "--kernels", str(kernels), "--case",
               cases, "--explain", "--json", "-q", "--backend", backend]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    seconds = time.perf_counter() - started
    try:
        document = json.loads(done.stdout)
    except json.JSONDecodeError:
        document = None
    return document, done.stderr, done.returncode, seconds


def run(bug: Bug, backend: str, work: Path) -> tuple[str, str, float, dict | None]:
    document, stderr, code, seconds = _diff(bug.apply(KERNELS, work / bug.name), bug.cases, backend)
    if document is None:
        return "failed", (stderr.strip().splitlines() or [f"exit {code}"])[-1], seconds, None
    if code == 70:
        return "failed", next((line for line in stderr.splitlines() if "internal error" in line), ""), seconds, document
    outcome, headline = classify(bug, document)
    return outcome, headline, seconds, document


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="host")
    parser.add_argument("--set", choices=("explain", "diagnosis", "all"), default="explain")
    parser.add_argument("--bug", action="append", default=[])
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--seed", type=Path, default=None)
    parser.add_argument("--seed-case", action="append", default=[])
    args = parser.parse_args(argv)
    chosen = {"explain": EXPLAIN_BUGS, "diagnosis": diagnosed_bugs(), "all": EXPLAIN_BUGS + diagnosed_bugs()}[args.set]
    bugs = [bug for bug in chosen if not args.bug or bug.name in args.bug]
    tally: dict[str, int] = {}
    documents: dict[str, dict | None] = {}

    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "table.txt").write_text("")

    def say(line: str) -> None:
        print(line, flush=True)
        if args.out is not None:  # line by line: a run stopped by its time limit keeps what it had
            with open(args.out / "table.txt", "a") as table:
                table.write(line + "\n")

    with tempfile.TemporaryDirectory(prefix="csa-explain-table-") as work, \
            ThreadPoolExecutor(max(1, args.jobs)) as pool:
        jobs = {bug.name: pool.submit(run, bug, args.backend, Path(work)) for bug in bugs}
        seed = None
        if args.seed is not None and args.seed.is_dir() and args.seed_case:
            seed = [(case, pool.submit(_diff, args.seed, case, args.backend)) for case in args.seed_case]
        for bug in bugs:
            outcome, headline, seconds, documents[bug.name] = jobs[bug.name].result()
            tally[outcome] = tally.get(outcome, 0) + 1
            say(f"{bug.name} [{bug.kind}, {bug.stage or '-'}] {outcome} ({seconds:.0f} s): {headline}")
        for case, job in seed or ():
            document, stderr, code, seconds = job.result()
            documents[f"seed:{case}"] = document
            if document is None:
                say(f"seed {case}: failed (exit {code}): {(stderr.strip().splitlines() or [''])[-1]}")
                continue
            for explanation in document.get("explain", {}).get("explanations", []):
                say(f"seed {case} ({seconds:.0f} s, exit {code}): {explanation['headline']}")
            if not document.get("explain", {}).get("explanations"):
                say(f"seed {case} ({seconds:.0f} s, exit {code}): no divergence")
    say("tally: " + ", ".join(f"{count} {outcome}" for outcome, count in sorted(tally.items()))
        + f" (named or located: {tally.get('named', 0) + tally.get('located', 0)})")
    if args.out is not None:
        text = json.dumps(documents)
        if len(text) > DOCUMENTS_BYTES:  # the trials are what makes them big
            for document in documents.values():
                for explanation in (document or {}).get("explain", {}).get("explanations", []):
                    explanation["trials"] = []
            text = json.dumps(documents)
        (args.out / "documents.json").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
