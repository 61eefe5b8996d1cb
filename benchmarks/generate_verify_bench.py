"""`generate --suite prod` and `verify` of it, before vs after, side by side, as whole processes.

    python benchmarks/generate_verify_bench.py --before REF [--repeat N] [--jobs 1,2] [--suite prod]

(REF 952a4ed is main before issue 18's work on generate and verify.) "before" is a detached
worktree of REF under build/, "after" this checkout; each command runs in a fresh process with
that tree on PYTHONPATH, the two trees in turn (before-after, then after-before, ...) so both see
the same machine load. Printed per command: wall and CPU seconds (user + system of the process
and its workers) and peak resident memory as min / median / max, the median of the pairwise
after/before wall ratios, and the 1-minute load average the runs started under. One warm-up run
of each tree is not counted (it compiles the numba kernels). Each tree's files of every --jobs value
must be the same bytes, and the two trees' the same data (manifest_sha256: since the writer went
through h5py's file-object driver the layout differs from older trees'); the bench says so or stops.

Targets on the 2-core CI machine (issue 18): generate --suite prod <= 8 s, verify <= 5 s.
Run by hand (`make bench`), never in CI.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from before_tree import before_tree

ROOT = Path(__file__).resolve().parents[1]
WORK = ROOT / "build" / "io-bench"


def timed(tree: Path, arguments: list[str]) -> dict:
    """One whole-process run of ``python -m csa_conform ARGUMENTS`` on ``tree``: wall, CPU, peak, load."""
    environment = dict(os.environ, PYTHONPATH=str(tree))
    load = os.getloadavg()[0]
    started = time.perf_counter()
    process = subprocess.Popen([sys.executable, "-m", "csa_conform", *arguments], cwd=WORK, env=environment,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    output = process.stdout.read()
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - started
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise SystemExit(f"{tree.name}: {' '.join(arguments)} exited {process.returncode}:\n{output.decode()}")
    return {"wall": wall, "cpu": usage.ru_utime + usage.ru_stime, "peak_mib": usage.ru_maxrss / 1024, "load": load}


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def manifest(path: Path) -> str:
    """The file's manifest_sha256: every case's digest, so every dataset's, whatever the HDF5 layout."""
    import h5py

    with h5py.File(path, "r") as handle:
        return str(handle.attrs["manifest_sha256"])


def spread(values: list[float], unit: str) -> str:
    return f"{min(values):.2f} / {statistics.median(values):.2f} / {max(values):.2f} {unit}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", required=True, help="git ref of the 'before' tree, e.g. 952a4ed")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs per tree and command")
    parser.add_argument("--jobs", default="1,2", help="--jobs values to time, comma-separated")
    parser.add_argument("--suite", default="prod")
    options = parser.parse_args()
    jobs = [int(value) for value in options.jobs.split(",")]
    WORK.mkdir(parents=True, exist_ok=True)
    trees = {"before": before_tree(options.before, "io-bench-before"), "after": ROOT}
    print(f"{options.suite}: before = {options.before}, after = this checkout; {os.cpu_count()} cores; "
          f"{options.repeat} timed runs each, trees alternating")
    digests = {}
    for name, tree in trees.items():  # warm-up: kernels compiled, files to verify, bytes compared
        for job in jobs:
            path = WORK / f"{options.suite}-{name}-jobs{job}.h5"
            timed(tree, ["generate", "--suite", options.suite, "-o", str(path), "--force", "-q", "--jobs", str(job)])
            digests[path.name] = sha256(path)
        timed(tree, ["verify", str(WORK / f"{options.suite}-after-jobs1.h5"), "-q"] if name == "after" else
              ["verify", str(WORK / f"{options.suite}-before-jobs1.h5"), "-q"])
    for name in trees:
        ours = {digests[f"{options.suite}-{name}-jobs{job}.h5"] for job in jobs}
        if len(ours) != 1:
            raise SystemExit(f"{name}: the files of --jobs {options.jobs} differ: " + ", ".join(sorted(ours)))
    manifests = {name: manifest(WORK / f"{options.suite}-{name}-jobs{jobs[0]}.h5") for name in trees}
    if len(set(manifests.values())) != 1:
        raise SystemExit("the trees' files hold different data: manifest_sha256 "
                         + ", ".join(f"{name} {value}" for name, value in manifests.items()))
    print("generated files: every --jobs the same bytes in each tree (sha256 "
          + ", ".join(f"{name} {digests[f'{options.suite}-{name}-jobs{jobs[0]}.h5'][:16]}" for name in trees)
          + f"); both trees the same data (manifest_sha256 {manifests['after']})")
    target = WORK / f"{options.suite}-after-jobs1.h5"
    commands = {}
    for job in jobs:
        commands[f"generate --suite {options.suite} --jobs {job}"] = [
            "generate", "--suite", options.suite, "-o", str(WORK / f"timed-jobs{job}.h5"), "--force", "-q",
            "--jobs", str(job)]
        commands[f"verify {options.suite}.h5 --jobs {job}"] = ["verify", str(target), "-q", "--jobs", str(job)]
    runs: dict[tuple[str, str], list[dict]] = {}
    for repeat in range(options.repeat):
        order = list(trees) if repeat % 2 == 0 else list(reversed(trees))
        for label, arguments in commands.items():
            for name in order:
                runs.setdefault((label, name), []).append(timed(trees[name], arguments))
    for label in commands:
        before, after = runs[(label, "before")], runs[(label, "after")]
        ratios = [a["wall"] / b["wall"] for a, b in zip(after, before)]
        loads = [run["load"] for run in before + after]
        print(f"\n{label}  (load average at start: median {statistics.median(loads):.1f}, "
              f"{min(loads):.1f}-{max(loads):.1f})")
        for name, measured in (("before", before), ("after", after)):
            print(f"  {name:6} wall {spread([run['wall'] for run in measured], 's')}   "
                  f"cpu {spread([run['cpu'] for run in measured], 's')}   "
                  f"peak {spread([run['peak_mib'] for run in measured], 'MiB')}")
        print(f"  after/before wall: median {statistics.median(ratios):.2f} (pairs: "
              + ", ".join(f"{ratio:.2f}" for ratio in ratios) + ")")


if __name__ == "__main__":
    main()
