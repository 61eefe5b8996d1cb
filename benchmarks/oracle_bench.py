"""Both oracle engines side by side: `run_step` at production shapes, then the
`prod` suite's generate and verify, each with its peak resident memory.

Run by hand (`make bench`), never asserted in tests. Shapes: (a) ratio-128
FP8 prefill B1 S1024 N16 Kc1024, (b) ratio-4 prefill S256 N16 I16 top-k 512,
(c) one ratio-4 decode at T=2048 N64 I64. Steps are timed best of --repeat,
the engines interleaved so both see the same machine load; each step's peak
memory is measured in a fresh process. Targets on the 2-core CI machine: the
numba engine at <= 0.25x the Rust reference's time on (a)-(c), and prod
generate and verify under 20 s each.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
from csa_conform.contract import validate_step
from csa_conform.oracle import run_step
from csa_conform.oracle.compression_update import compression_update
from csa_conform.oracle.engine import numba_available
from csa_conform.oracle.index_key_update import index_key_update

RATIO128_FP8 = {
    "head_dim": 512, "qk_rope_head_dim": 64, "compression_ratio": 128, "causal": 1,
    "cache_layout_version": 1, "index_layout_version": 1, "cache_format": "fp8_e4m3_block64",
}
RATIO4 = dict(RATIO128_FP8, compression_ratio=4)
INDEX_OFFSET = 1.0
MAIN_SOURCES = (
    "compressor_kv", "compressor_gate", "compressor_ape", "compressor_norm",
    "past_compressed_kv", "past_compression_carry",
)
INDEX_SOURCES = tuple("index_" + name for name in MAIN_SOURCES[:4]) + ("past_index_key", "past_index_carry")


def step_inputs(rng, attrs, batch, sequence, total, current_kv_len):
    """Random inputs for a fresh prefill (past state empty, carry reset).

    Index queries and keys carry a positive offset on their first 64 dims, so
    scores are positive sums over heads; exact ties then stay rare at S=256.
    """
    ratio, heads = attrs["compression_ratio"], attrs["num_heads"]
    width = 512 if ratio == 128 else 1024
    f32 = np.float32
    inputs = {
        "query": rng.standard_normal((batch, sequence, heads, 512), dtype=f32),
        "current_kv": rng.standard_normal((batch, current_kv_len, 512), dtype=f32),
        "compressor_kv": rng.standard_normal((batch, sequence, width), dtype=f32),
        "compressor_gate": rng.standard_normal((batch, sequence, width), dtype=f32),
        "compressor_ape": rng.standard_normal((ratio if ratio == 128 else 4, width), dtype=f32) * f32(0.1),
        "compressor_norm": f32(1) + rng.standard_normal(512, dtype=f32) * f32(0.1),
        "past_compressed_kv": np.zeros((batch, 0, 583), dtype=np.uint8),
        "past_compression_carry": np.zeros((batch, 128 if ratio == 128 else 8, 2, width), dtype=f32),
        "seqlens_k": np.full(batch, total - 1, dtype=np.int32),
        "total_sequence_length": np.array(total, dtype=np.int64),
        "head_sink": rng.standard_normal(heads, dtype=f32),
    }
    if ratio == 4:
        index_heads = attrs["index_num_heads"]
        index_query = rng.standard_normal((batch, sequence, index_heads, 128), dtype=f32)
        index_query[..., :64] += f32(INDEX_OFFSET)
        index_kv = rng.standard_normal((batch, sequence, 256), dtype=f32)
        index_kv[..., :64] += f32(INDEX_OFFSET)
        index_kv[..., 128:192] += f32(INDEX_OFFSET)
        inputs.update(
            index_query=index_query,
            index_weight=rng.uniform(0.5, 1.5, (batch, sequence, index_heads)).astype(f32),
            index_compressor_kv=index_kv,
            index_compressor_gate=rng.standard_normal((batch, sequence, 256), dtype=f32),
            index_compressor_ape=rng.standard_normal((4, 256), dtype=f32) * f32(0.1),
            index_compressor_norm=f32(1) + rng.standard_normal(128, dtype=f32) * f32(0.1),
            past_index_key=np.zeros((batch, 0, 68), dtype=np.uint8),
            past_index_carry=np.zeros((batch, 8, 2, 256), dtype=f32),
        )
    return inputs


def prefill_state(attrs, prefill, outputs) -> dict:
    """The present_* a prefill leaves behind, from the compression stages alone.

    A 2047-row prefill scores ~9e7 record pairs per step; binary32 sums that
    dense collide exactly somewhere, and the reference rejects such a step.
    The state does not depend on scoring, so the compressors build it.
    """
    geometry = validate_step(attrs, prefill, outputs)
    main = compression_update(geometry, *(prefill[name] for name in MAIN_SOURCES))
    index = index_key_update(geometry, *(prefill[name] for name in INDEX_SOURCES))
    return {
        "past_compressed_kv": main["present_compressed_kv"],
        "past_compression_carry": main["present_compression_carry"],
        "past_index_key": index["present_index_key"],
        "past_index_carry": index["present_index_carry"],
    }


def decode_inputs(rng, attrs, prefill, state, total):
    """One decode step continuing `prefill` from its state."""
    step = step_inputs(rng, attrs, 1, 1, total, 128)
    step["current_kv"] = np.concatenate([prefill["current_kv"], step["current_kv"][:, :1]], axis=1)[:, -128:]
    for name in ("compressor_ape", "compressor_norm", "head_sink", "index_compressor_ape", "index_compressor_norm"):
        step[name] = prefill[name]
    step.update(state)
    return step


THREE = ["Y", "present_compressed_kv", "present_compression_carry"]
SIX = THREE + ["present_index_key", "present_index_carry", "selected_indices"]


def case_a():
    attrs = dict(RATIO128_FP8, num_heads=16)
    return attrs, step_inputs(np.random.default_rng(1), attrs, 1, 1024, 1024, 1024), THREE


def case_b():
    attrs = dict(RATIO4, num_heads=16, index_num_heads=16, index_head_dim=128, index_topk=512)
    return attrs, step_inputs(np.random.default_rng(2), attrs, 1, 256, 256, 256), SIX


def case_c():
    rng = np.random.default_rng(3)
    attrs = dict(RATIO4, num_heads=64, index_num_heads=64, index_head_dim=128, index_topk=512)
    prefill = step_inputs(rng, attrs, 1, 2047, 2047, 2047)
    return attrs, decode_inputs(rng, attrs, prefill, prefill_state(attrs, prefill, SIX), 2048), SIX


CASES = {
    "a": ("ratio-128 fp8 prefill B=1 S=1024 N=16 Kc=1024", case_a),
    "b": ("ratio-4 prefill B=1 S=256 N=16 I=16 k=512", case_b),
    "c": ("ratio-4 decode T=2048 N=64 I=64 k=512", case_c),
}


def time_steps(engines: list[str], repeat: int) -> dict[tuple[str, str], float]:
    """Best wall clock of each (case, engine), engines interleaved within every repetition."""
    best: dict[tuple[str, str], float] = {}
    for name, (_, build) in CASES.items():
        attrs, inputs, outputs = build()
        for engine in engines:
            run_step(attrs, inputs, outputs, engine=engine)  # compile (or load the cache) and warm up
        for _ in range(repeat):
            for engine in engines:
                begin = time.perf_counter()
                run_step(attrs, inputs, outputs, engine=engine)
                elapsed = time.perf_counter() - begin
                best[name, engine] = min(best.get((name, engine), elapsed), elapsed)
    return best


# Runs a module as __main__ and, at exit, writes its VmHWM (kB) to the file named
# first: getrusage's ru_maxrss would count the parent's pages a child is forked from.
PEAK_REPORTER = """
import atexit, runpy, sys
peak_file = sys.argv.pop(1)
def report():
    status = open("/proc/self/status").read()
    open(peak_file, "w").write(status.split("VmHWM:")[1].split()[0])
atexit.register(report)
runpy.run_module(sys.argv.pop(1), run_name="__main__", alter_sys=True)
"""


def measured(module_and_arguments: list[str]) -> tuple[float, float]:
    """(wall seconds, peak resident MiB) of `python -m MODULE ARGS...` in a fresh process, which must succeed."""
    with tempfile.NamedTemporaryFile(prefix="csa-bench-peak-") as peak:
        environment = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
        begin = time.perf_counter()
        result = subprocess.run(
            [sys.executable, "-c", PEAK_REPORTER, peak.name, *module_and_arguments],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=environment,
        )
        elapsed = time.perf_counter() - begin
        if result.returncode != 0:
            raise SystemExit(f"benchmark command failed: python -m {' '.join(module_and_arguments)}\n{result.stderr}")
        return elapsed, int(Path(peak.name).read_text()) / 1024


def prod_suite(engines: list[str], repeat: int, folder: Path) -> dict[tuple[str, str], tuple[float, float]]:
    """Best (wall, peak MiB) of `generate --suite prod` and `verify` per engine, interleaved."""
    cli = ["csa_conform"]
    best: dict[tuple[str, str], tuple[float, float]] = {}
    for _ in range(repeat):
        for engine in engines:
            golden = folder / f"prod-{engine}.h5"
            runs = {
                "generate": cli + ["generate", "--suite", "prod", "-o", str(golden), "--force", "--engine", engine],
                "verify": cli + ["verify", str(golden), "--engine", engine],
            }
            for command, line in runs.items():
                result = measured(line)
                best[command, engine] = min(best.get((command, engine), result), result)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="take the best of this many runs")
    parser.add_argument("--prod-repeat", type=int, default=1, help="runs of the prod generate and verify")
    parser.add_argument("--skip-prod", action="store_true", help="time the steps only")
    parser.add_argument("--step", nargs=2, metavar=("CASE", "ENGINE"), help="run one step once (peak memory probe)")
    options = parser.parse_args()
    if options.step:
        name, engine = options.step
        run_step(*CASES[name][1](), engine=engine)
        return
    engines = ["numpy", "numba"] if numba_available() else ["numpy"]
    if len(engines) == 1:
        print("numba is not installed: timing the numpy engine only (pip install -e '.[fast]')")
    print(f"best of {options.repeat}, {os.cpu_count()} cores; seconds (peak resident MiB)")
    timings = time_steps(engines, options.repeat)
    for name, (title, _) in CASES.items():
        cells = [f"{engine} {timings[name, engine]:7.3f} s ({measured(['oracle_bench', '--step', name, engine])[1]:5.0f})" for engine in engines]
        ratio = f"  numba/numpy {timings[name, 'numba'] / timings[name, 'numpy']:.2f}" if len(engines) == 2 else ""
        print(f"({name}) {title:<46} " + "   ".join(cells) + ratio)
    if not options.skip_prod:
        with tempfile.TemporaryDirectory(prefix="csa-bench-") as folder:
            suite = prod_suite(engines, options.prod_repeat, Path(folder))
        for command in ("generate", "verify"):
            cells = [f"{engine} {suite[command, engine][0]:7.1f} s ({suite[command, engine][1]:5.0f})" for engine in engines]
            print(f"prod suite: {command:<37} " + "   ".join(cells) + "   (target 20 s)")
    print(f"this process's peak resident memory: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")


if __name__ == "__main__":
    main()
