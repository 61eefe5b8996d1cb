"""The numba kernels' machine code and threading cannot change a bit.

A fused multiply-add rounds once where the reference rounds twice, so no
kernel may contain one; and the oracle's thread pool splits work only
between independent query rows, so worker count and chunking must not show.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from engine_pairs import assert_engines_agree, needs_numba, outcome

# x86 vfmadd/vfmsub/vfnmadd/vfnmsub (and their addsub forms); aarch64 fmla/fmls/fmadd/fmsub/fnmadd/fnmsub.
FUSED = re.compile(r"^\s*(vfn?m(?:add|sub)\w*|fml[as]|fn?m(?:add|sub))\b", re.MULTILINE)
MULTIPLY = re.compile(r"^\s*(v?mul[sp][sd]|fmul)\b", re.MULTILINE)
# Ratio-4 and ratio-128 cases with several queries, batches, heads and a bias, and single-query
# steps (whose attention splits candidates and heads over the workers) with 3 heads and 2 batches.
THREADED_CASES = ("random.r4-b2n2-i2-k512", "random.r4-bias-BNSC", "random.r128-bias-BNSC", "random.r128-f32-b2n2",
                  "edges.r4-n3-i3-k1-past128", "edges.r128-fp8-n2-b2-past128")

pytestmark = needs_numba


def _steps(golden, case_id):
    info = golden.case_info(case_id)
    return info, [golden.read_step(case_id, index) for index in range(info.step_count)]


def _compiled_modules():
    from csa_conform.oracle.compiled import dots as compiled_kernels
    from csa_conform.oracle.compiled import libm_kernels as compiled_libm
    from csa_conform.oracle.compiled import record_kernels as compiled_records
    from csa_conform.oracle.compiled import softmax_kernels as compiled_softmax

    return (compiled_kernels, compiled_libm, compiled_records, compiled_softmax)


def _every_kernel():
    return [kernel for module in _compiled_modules() for kernel in module.KERNELS]


def _compile_every_kernel(golden):
    from compiled_libm_arrays import FUNCTIONS, evaluate

    for case_id in THREADED_CASES:
        info, steps = _steps(golden, case_id)
        for step in steps:
            outcome(info.attrs, step.inputs, list(info.output_names), "numba")
    sample = np.linspace(-200, 200, 1001, dtype=np.float32)
    for name in FUNCTIONS:
        evaluate(name, sample)


def test_every_compiled_function_is_a_listed_kernel():
    """KERNELS is what the scans below read, so no numba function may be missing from it."""
    from numba.core.registry import CPUDispatcher

    for module in _compiled_modules():
        dispatchers = {
            name for name, value in vars(module).items()
            if isinstance(value, CPUDispatcher) and value.__module__ == module.__name__
        }
        assert dispatchers == {kernel.__name__ for kernel in module.KERNELS}, module.__name__


def test_no_kernel_contains_a_fused_multiply_add(ci_golden):
    """Every kernel's assembly per signature, as LLVM emits it from the optimised module numba links
    (kept for a cached kernel too, whose own listing numba cannot show), with the package's options."""
    _compile_every_kernel(ci_golden)
    every_listing = _listings()
    assembly = "".join(text for listings in every_listing.values() for text in listings.values())
    assert MULTIPLY.search(assembly), "no multiply in any kernel: the scan cannot read this assembly"
    for kernel, listings in every_listing.items():
        for signature, assembly in listings.items():
            fused = FUSED.search(assembly)
            assert fused is None, f"{kernel.__name__}{signature} contains {fused.group(1)}"


def _listings() -> dict:
    """Each kernel's assembly per signature. A kernel inlined into cached callers has no signature of
    its own until a caller is typed afresh (typing compiles, or loads, its callees), so callers go first;
    typing alone is a tenth of a fresh compile."""
    listings, pending = {}, _every_kernel()
    while pending:
        ready = [kernel for kernel in pending if kernel.signatures]
        assert ready, f"never compiled: {', '.join(kernel.__name__ for kernel in pending)}"
        for kernel in ready:
            _type_afresh(kernel)
            listings[kernel] = {signature: _assembly(compiled.library)
                                for signature, compiled in kernel.overloads.items()}
        pending = [kernel for kernel in pending if kernel not in listings]
    return listings


def _assembly(library) -> str:
    """What LLVM emits for the optimised module numba links into callers: the compiled one, or the cached
    one, whose object code was emitted from it."""
    return str(library._codegen._tm.emit_assembly(library._get_module_for_linking()))


def _type_afresh(kernel) -> None:
    """numba's untyped and typing passes over the kernel's source for each of its signatures."""
    from numba.core import compiler, registry, typed_passes
    from numba.core.compiler_machinery import AnalysisPass, register_pass

    @register_pass(mutates_CFG=False, analysis_only=True)
    class TypedOnly(AnalysisPass):
        _name = "csa_typed_only"

        def __init__(self):
            AnalysisPass.__init__(self)

        def run_pass(self, state):
            state.cr = state.typemap
            return False

    class TypingOnly(compiler.CompilerBase):
        def define_pipelines(self):
            pipeline = compiler.DefaultPassBuilder.define_untyped_pipeline(self.state)
            pipeline.add_pass(typed_passes.NopythonTypeInference, "typing")
            pipeline.add_pass(TypedOnly, "stop after typing")
            pipeline.finalize()
            return [pipeline]

    flags = compiler.Flags()
    kernel.targetdescr.options.parse_as_flags(flags, kernel.targetoptions)
    target = registry.cpu_target
    for signature in kernel.signatures:
        compiler.compile_extra(target.typing_context, target.target_context, kernel.py_func, signature, None,
                               flags, {}, pipeline_class=TypingOnly)


def test_the_fused_multiply_add_detector_sees_a_contracted_kernel():
    numba = pytest.importorskip("numba")
    import llvmlite.binding as llvm

    features = llvm.get_host_cpu_features()
    if not (features.get("fma") or features.get("neon")):
        pytest.skip("host CPU has no fused multiply-add instruction")

    @numba.njit(fastmath=True)
    def multiply_add(a, b, c):
        for i in range(a.shape[0]):
            c[i] += a[i] * b[i]

    values = np.ones(64, dtype=np.float32)
    multiply_add(values, values, values.copy())
    assert any(FUSED.search(assembly) for assembly in multiply_add.inspect_asm().values())


def test_no_kernel_uses_numba_threads():
    """Kernels are serial (the oracle's pool runs them), so numba's thread count cannot matter."""
    kernels = _every_kernel()
    assert all(not kernel.targetoptions.get("parallel") for kernel in kernels)
    assert all(kernel.targetoptions.get("nogil") for kernel in kernels)


@pytest.mark.parametrize("case_id", THREADED_CASES)
def test_worker_count_and_chunking_do_not_change_a_bit(case_id, monkeypatch, ci_golden):
    import numba

    from csa_conform.oracle.compiled import parallel
    from csa_conform.oracle.compiled import record_kernels as compiled_records
    from csa_conform.oracle.compiled import stage_kernels as compiled_stages

    # FP8 decodes split over the workers from two records on (at long context: from 1,024).
    monkeypatch.setattr(compiled_records, "SPLIT_DECODE_RECORDS", 2)
    info, steps = _steps(ci_golden, case_id)
    names = list(info.output_names)
    baseline = [outcome(info.attrs, step.inputs, names, "numpy") for step in steps]
    settings = [(workers, working_set) for workers in (1, 2, 3) for working_set in (1, 1 << 16)]
    for workers, working_set in settings:
        monkeypatch.setattr(parallel, "worker_count", lambda workers=workers: workers)
        monkeypatch.setattr(compiled_stages, "worker_count", lambda workers=workers: workers)
        monkeypatch.setattr(compiled_records, "worker_count", lambda workers=workers: workers)
        monkeypatch.setattr(parallel, "WORKING_SET_ELEMENTS", working_set)
        monkeypatch.setattr(compiled_stages, "SOFTMAX_CHUNK_ELEMENTS", working_set)
        for threads in sorted({1, numba.config.NUMBA_NUM_THREADS}):
            numba.set_num_threads(threads)
            for step, expected in zip(steps, baseline):
                assert outcome(info.attrs, step.inputs, names, "numba") == expected, (workers, working_set, threads)
                assert outcome(info.attrs, step.inputs, names, "numpy") == expected, (workers, working_set)
    numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)
    assert any(expected[0] == "ran" for expected in baseline)

