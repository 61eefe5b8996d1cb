"""The ci suite's mutation score on the built-in kernels: a fixed stratified sample, its score and its time.

    python benchmarks/mutation_bench.py [--sample 300] [--seed 40] [--jobs N] [--backend host|cuda|both]
                                        [--repeat N] [--shard K/N] [--out DIR]

Run by hand, never asserted in tests. Each backend runs
`csa-conform mutate goldens/ci.h5 --sample N --seed S --jobs J --no-cache
--json` in a child process (a cold run: no verdict cache, every module built
once per run), timed from start to exit, and prints the score, the table per
operator, the survivors and the wall time with the machine it ran on; the
document goes to DIR/mutate-<backend>.json for `report --html`. `both` (the
default) runs the host backend and, when CuPy sees a GPU, the CUDA one. Each
mutant is judged by the gate it would meet, the README's release gate: on the
host backend `--repeat 2` (its second run reverses the thread schedule, where
a missing barrier shows), on CUDA `--repeat 3` (its second and third runs
stagger the warps' departures from barriers, last warp first and then first
warp first); each only for the plain gate's survivors. `--repeat N` sets both.
The default sample (300 mutants, seed 40) is the one benchmarks/README.md
reports; another seed is a hidden sample of the same draw.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def has_gpu() -> bool:
    probe = "import cupy; import sys; sys.exit(0 if cupy.cuda.runtime.getDeviceCount() > 0 else 1)"
    return subprocess.run([sys.executable, "-c", probe], capture_output=True).returncode == 0


def run(backend: str, args: argparse.Namespace, out: Path) -> None:
    command = [sys.executable, "-m", "csa_conform", "mutate", str(ROOT / "goldens" / "ci.h5"), "--backend", backend,
               "--sample", str(args.sample), "--seed", str(args.seed), "--jobs", str(args.jobs), "--no-cache",
               "--repeat", str(args.repeat or (2 if backend == "host" else 3)), "--json", "-q"]
    if args.shard:
        command += ["--shard", args.shard]
    environment = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=environment)
    wall = time.perf_counter() - started
    if done.returncode not in (0, 1):
        print(f"{backend}: exit {done.returncode}: {done.stderr.strip()[-2000:]}")
        return
    document = json.loads(done.stdout)
    path = out / f"mutate-{backend}{'-shard-' + args.shard.replace('/', 'of') if args.shard else ''}.json"
    path.write_text(json.dumps(document, indent=1))
    section = document["mutate"]
    summary = section["summary"]
    score = "n/a" if summary["score"] is None else f"{100 * summary['score']:.1f}%"
    print(f"== {backend}: {summary['mutants']} mutants (seed {args.seed}{', shard ' + args.shard if args.shard else ''}) "
          f"in {wall:.0f} s wall ({section['baseline_s']:.1f} s baseline), --jobs {args.jobs} on {os.cpu_count()} cores, "
          f"--repeat {args.repeat or (2 if backend == 'host' else 3)}")
    print(f"score {score}: {summary['killed']} diverged + {summary['faults']} faults + {summary['hangs']} hangs of "
          f"{summary['judged']} judged; {summary['survived']} survived; {summary['build_failures']} did not build")
    print(f"{'operator':<16}{'mutants':>8}{'killed':>8}{'faults':>8}{'hangs':>7}{'survived':>10}{'no-build':>10}  score")
    for name, counts in section["by_operator"].items():
        share = "n/a" if counts["score"] is None else f"{100 * counts['score']:.1f}%"
        print(f"{name:<16}{counts['mutants']:>8}{counts['killed']:>8}{counts['faults']:>8}{counts['hangs']:>7}"
              f"{counts['survived']:>10}{counts['build_failures']:>10}  {share}")
    print("survivors:")
    for mutant in section["mutants"]:
        if mutant["verdict"] == "survived":
            print(f"  {mutant['id']}  {mutant['change']}\n    - {mutant['before']}\n    + {mutant['after']}")
    times = sorted(mutant["time_s"] for mutant in section["mutants"])
    if times:
        print(f"per mutant: median {times[len(times) // 2]:.1f} s, max {times[-1]:.1f} s; written {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sample", type=int, default=300)
    parser.add_argument("--seed", type=int, default=40)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--backend", choices=("host", "cuda", "both"), default="both")
    parser.add_argument("--repeat", type=int, default=None, help="diff --repeat N (default: 2 on host, 3 on CUDA)")
    parser.add_argument("--shard", default=None)
    parser.add_argument("--out", type=Path, default=Path("build"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    backends = ["host", "cuda"] if args.backend == "both" else [args.backend]
    for backend in backends:
        if backend == "cuda" and not has_gpu():
            print("cuda: no GPU visible to CuPy; skipped")
            continue
        run(backend, args, args.out)


if __name__ == "__main__":
    main()
