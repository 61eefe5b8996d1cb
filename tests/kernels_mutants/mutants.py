"""Planted bugs: each a one-place textual patch (old -> new) of a file in kernels/.

A mutant is applied to a temporary copy of the kernel directory; ``diff``
must then fail, first at ``stage`` in chained mode, and in isolated mode at
exactly ``isolated`` (a fused launch can carry a bug into the later stages
it computes itself, and a bug in the prelude's shared compressor walk or
attention row reaches every module built on it, which is why some sets have
more than one stage).
``cases`` picks golden cases that exercise the patched code.

A mutant whose ``caught_by`` is not ``diff`` is a bug a plain eager diff
cannot see as a divergence; only that mode of ``diff`` (specs/device-depth.md) may catch it,
at the stages in ``isolated``, and of compute-sanitizer's tools only ``sanitizer``
(initcheck is made to see reads of memory never written). ``guard`` is the plain run's
guard bands: an ``out-of-bounds`` finding at every stage of the launch, no divergence. A bug that changes the ABI has a host half too:
``host`` names a patch of the runner's launch (``HOST_PATCHES``), applied with
pytest's monkeypatch for the duration of the test.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class Mutant:
    name: str
    file: str
    old: str
    new: str
    stage: str
    isolated: frozenset[str]
    cases: str
    why: str
    caught_by: str = "diff"
    host: str = ""
    sanitizer: str = ""  # the compute-sanitizer tool that reports it, if any

    def apply(self, source: Path, target: Path) -> Path:
        """Copy kernel directory ``source`` to ``target`` with this patch applied, judged strict as the
        built-in kernels are (its manifest says so)."""
        shutil.copytree(source, target)
        (target / "csa-kernels.toml").write_text('build = "strict"\n', encoding="utf-8")
        path = target / self.file
        text = path.read_text(encoding="utf-8")
        if text.count(self.old) != 1:
            raise AssertionError(f"{self.name}: patch text occurs {text.count(self.old)} times in {self.file}")
        path.write_text(text.replace(self.old, self.new), encoding="utf-8")
        return target


MUTANTS = (
    Mutant(
        "overlap_carry_rotation_off_by_one",
        "block_quant.cuh",
        "for (long long i = 0; i < block_floats; ++i) state[i] = state[block_floats + i];",
        "for (long long i = 0; i < block_floats; ++i) state[i] = state[block_floats - slot_stride + i];",
        "compression_update",
        frozenset({"compression_update", "index_key_update"}),
        "boundaries.r4-*",
        "slots 3..6 instead of 4..7 become the previous block, in both overlap compressors",
    ),
    Mutant(
        "r128_carry_not_cleared",
        "block_quant.cuh",
        "        csa_clear_slots(current, block_floats, width);",
        "        if (overlap) csa_clear_slots(current, block_floats, width);",
        "compression_update",
        frozenset({"compression_update"}),
        "boundaries.r128-*",
        "the carry keeps the finished block instead of resetting to kv 0 / score -inf",
    ),
    Mutant(
        "carry_not_cleared_at_position_0",
        "block_quant.cuh",
        "    if (first_position == 0) csa_clear_slots(state, carry_floats, width);\n",
        "",
        "compression_update",
        frozenset({"compression_update", "index_key_update"}),
        "boundaries.r4-*",
        "a step from position 0 keeps the stale carry it was sent instead of clearing it (every compressor): "
        "only the ci cases sent stale carries there show it",
    ),
    Mutant(
        "pool_maximum_starts_at_zero",
        "block_quant.cuh",
        "    float maximum = CSA_NEG_INF;\n    for (int c = 0; c < candidates; ++c) maximum",
        "    float maximum = 0.0f;\n    for (int c = 0; c < candidates; ++c) maximum",
        "compression_update",
        frozenset({"compression_update", "index_key_update"}),
        "edges.*-far-gates",
        "the pooling softmax's maximum starts at 0, so a dimension whose candidate scores are all negative "
        "exponentiates them unshifted: only the far-gate cases' -112 gates underflow every weight to 0",
    ),
    Mutant(
        "sincosf_polynomial_unreduced_above_pio4",
        "block_quant.cuh",
        "    if (top < 0x3f4u) {",
        "    if (top <= 0x3f4u) {",
        "index_query_finalize",
        frozenset({"index_query_finalize", "index_scoring", "selection"}),
        "edges.r4-near-tie-*",
        "sinf/cosf take |x| in [0.75, 0.8125) for small (mutate's 308:13 `<` -> `<=`) and skip the reduction "
        "above pi/4, one ulp off there: only the near-tie cases' index query (pair 10 at position 34) carries "
        "the ulp through bf16 and FP4",
    ),
    Mutant(
        "fp8_scale_rounded_down",
        "block_quant.cuh",
        "const int power = csa_block_power(in, 64, 1.0e-4f, 448.0f);",
        "const int power = csa_block_power(in, 64, 1.0e-4f, 448.0f) - 1;",
        "compression_update",
        frozenset({"compression_update"}),
        "boundaries.r4-*",
        "the E8M0 exponent is one below ceil(log2(amax/448)), so large values saturate at 448",
    ),
    Mutant(
        "r128_rope_at_block_end",
        "csa_ratio128_compression.cu",
        "csa_compressed_rope(pooled + dim - rope_dim, rope_dim, block_start);",
        "csa_compressed_rope(pooled + dim - rope_dim, rope_dim, block_start + 127);",
        "compression_update",
        frozenset({"compression_update"}),
        "boundaries.r128-*",
        "records are rotated at the block's last position instead of its first",
    ),
    Mutant(
        "r4_main_rope_at_block_end",
        "csa_ratio4_main_compression.cu",
        "csa_compressed_rope(pooled + dim - rope_dim, rope_dim, block_start);",
        "csa_compressed_rope(pooled + dim - rope_dim, rope_dim, block_start + 3);",
        "compression_update",
        frozenset({"compression_update"}),
        "boundaries.r4-*",
        "main records are rotated at the block's last position instead of its first",
    ),
    Mutant(
        "index_key_rope_at_block_end",
        "csa_ratio4_index_compression.cu",
        "csa_compressed_rope(pooled + dim - rope_dim, rope_dim, block_start);",
        "csa_compressed_rope(pooled + dim - rope_dim, rope_dim, block_start + 3);",
        "index_key_update",
        frozenset({"index_key_update"}),
        "boundaries.r4-*",
        "index records are rotated at the block's last position instead of its first",
    ),
    Mutant(
        "index_query_rope_one_position_late",
        "csa_ratio4_index_select.cu",
        "csa_compressed_rope(q + index_dim - rope_dim, rope_dim, position);",
        "csa_compressed_rope(q + index_dim - rope_dim, rope_dim, position + 1);",
        "index_query_finalize",
        frozenset({"index_query_finalize", "index_scoring", "selection"}),
        "boundaries.r4-*",
        "queries are rotated for the next position; the fused kernel scores and selects with them",
    ),
    Mutant(
        "index_score_without_head_normalization",
        "csa_ratio4_index_select.cu",
        "1.0f / sqrtf((float)index_dim) / sqrtf((float)index_heads);",
        "1.0f / sqrtf((float)index_dim);",
        "index_scoring",
        frozenset({"index_scoring"}),
        "boundaries.r4-*",
        "scores miss the 1/sqrt(index_heads) factor (a positive scale: the selection order survives)",
    ),
    Mutant(
        "index_score_without_relu",
        "csa_ratio4_index_select.cu",
        "const float relu = fmaxf(dot, 0.0f);",
        "const float relu = dot;",
        "index_scoring",
        frozenset({"index_scoring"}),
        "random.r4-*-signed",
        "a negative index dot counts as itself instead of 0 (relu(dot) * w -> dot * w): only the -signed cases "
        "have negative dots (the others' index rows are offset)",
    ),
    Mutant(
        "radix_select_stops_a_digit_early",
        "csa_ratio4_index_select.cu",
        "for (int shift = 24; shift >= 0; shift -= 8) {",
        "for (int shift = 24; shift > 0; shift -= 8) {",
        "selection",
        frozenset({"selection"}),
        "edges.r4-near-tie-*",
        "the radix select skips its last digit (mutate's 51:35 `0` -> `0 + 1`), so the k-th key keeps only its "
        "top 24 bits: a row whose k-th and (k+1)-th scores share them gathers both, past its k slots; only the "
        "near-tie cases have such a row",
    ),
    Mutant(
        "selection_ignores_causal_limit",
        "csa_ratio4_index_select.cu",
        "const int candidates = limit;",
        "const int candidates = record_capacity;",
        "selection",
        frozenset({"selection"}),
        "boundaries.r4-*",
        "rows with fewer causal records than topk_width fill their -1 slots with future records",
    ),
    Mutant(
        "replicate_reverses_slots",
        "csa_ratio4_index_replicate.cu",
        "selected[element] = shared[(b * sequence + s) * topk_width + slot];",
        "selected[element] = shared[(b * sequence + s) * topk_width + (topk_width - 1 - slot)];",
        "selection",
        frozenset({"selection"}),
        "boundaries.r4-*",
        "selected_indices repeats each row's selection in reverse order",
    ),
    Mutant(
        "dense_window_includes_next_position",
        "block_quant.cuh",
        "if (absolute > r.position || absolute - r.kv_base >= a.current_kv_len) return false;",
        "if (absolute > r.position + 1 || absolute - r.kv_base >= a.current_kv_len) return false;",
        "candidate_assembly",
        frozenset({"candidate_assembly", "sparse_sink_softmax_attention"}),
        "boundaries.r4-*",
        "each query also attends to the token after it (the fused kernel scores what it assembled)",
    ),
    Mutant(
        "missing_sink",
        "block_quant.cuh",
        "denominator = denominator + csa_expf(a.sink[r.head] - maximum);",
        "denominator = denominator + 0.0f;",
        "sparse_sink_softmax_attention",
        frozenset({"sparse_sink_softmax_attention"}),
        "boundaries.r128-*",
        "the logit-only sink mass is left out of the softmax denominator",
    ),
    Mutant(
        "r128_attends_next_record",
        "csa_ratio128_attention.cu",
        "const long long causal_records = (r.position + 1) / 128;",
        "const long long causal_records = (r.position + 1) / 128 + 1;",
        "candidate_assembly",
        frozenset({"candidate_assembly", "sparse_sink_softmax_attention"}),
        "boundaries.r128-*",
        "queries before a block end in the same step also attend the record that block completes",
    ),
    Mutant(
        "r128_batch_rows_strided_by_causal_records",
        "csa_ratio128_attention.cu",
        "where->record_row = (long long)r.b * compressed_capacity + (c - r.dense);",
        "where->record_row = (long long)r.b * records + (c - r.dense);",
        "sparse_sink_softmax_attention",
        frozenset({"sparse_sink_softmax_attention"}),
        "edges.r128-*-block-end-in-step*",
        "the cache's batch rows are strided by the query's causal record count instead of the capacity: right "
        "wherever a query that reads records sees all of them, so only a B > 1 step with a block end inside it "
        "shows it (its first query reads batch row 1's record 0 from batch row 0's record 1)",
    ),
    Mutant(
        "r4_attention_drops_record_zero",
        "csa_ratio4_attention.cu",
        "return record >= 0 && record < compressed_capacity;",
        "return record > 0 && record < compressed_capacity;",
        "candidate_assembly",
        frozenset({"candidate_assembly", "sparse_sink_softmax_attention"}),
        "boundaries.r4-*",
        "a selected record 0 is treated like a -1 padding slot",
    ),
    Mutant(
        "output_blends_unwritten_contents",
        "block_quant.cuh",
        "            a.output[(long long)r.row * a.dim + d] = accumulated;",
        "            a.output[(long long)r.row * a.dim + d] = accumulated + 0.0f * a.output[(long long)r.row * a.dim + d];",
        "candidate_assembly",
        frozenset({"candidate_assembly", "sparse_sink_softmax_attention"}),
        "boundaries.r4-*",
        "Y reads its own never-written buffer at weight zero: exact while the garbage is finite, NaN once it is not",
        caught_by="repeat",
        sanitizer="initcheck",
    ),
    Mutant(
        "r128_decode_length_by_value",
        "csa_ratio128_compression.cu",
        "    int past_row_records, int cache_row_records, int cache_fp8, const long long* total_ptr)\n{\n",
        "    int past_row_records, int cache_row_records, int cache_fp8, long long total_value)\n{\n"
        "    const long long* total_ptr = &total_value;\n",
        "compression_update",
        frozenset({"compression_update"}),
        "boundaries.r128-resumed-247-*",
        "the decode compressor takes the sequence length by value: right eagerly, frozen in a replayed graph "
        "(the new token lands in the captured step's carry slot)",
        caught_by="replay",
        host="r128_compression_total_by_value",
    ),
    Mutant(
        "index_scores_written_past_the_scratch",
        "csa_ratio4_index_select.cu",
        "        record_scores[record_id] = weighted;\n    }\n",
        "        record_scores[record_id] = weighted;\n    }\n"
        "    if (row == batch * sequence - 1) record_scores[record_capacity] = 0.0f;\n",
        "index_query_finalize",
        frozenset({"index_query_finalize", "index_scoring", "selection"}),
        "boundaries.r4-*",
        "the last row writes one score past the end of the score scratch, which nothing reads back: it lands "
        "in the guard band after the scratch (the finding names the launch, not one of its stages)",
        caught_by="guard",
        sanitizer="memcheck",
    ),
    Mutant(
        "index_scores_written_before_the_scratch",
        "csa_ratio4_index_select.cu",
        "        record_scores[record_id] = weighted;\n    }\n",
        "        record_scores[record_id] = weighted;\n    }\n"
        "    if (row == 0) record_scores[-1] = 0.0f;\n",
        "index_query_finalize",
        frozenset({"index_query_finalize", "index_scoring", "selection"}),
        "boundaries.r4-*",
        "the first row writes a score at index -1 of the score scratch: it lands in the guard band before it "
        "(memcheck, whose buffers have no bands, may find another allocation there: not asserted)",
        caught_by="guard",
    ),
    Mutant(
        "selection_replicated_one_past_the_end",
        "csa_ratio4_index_replicate.cu",
        "    if (element >= count) return;\n",
        "    if (element > count) return;\n",
        "selection",
        frozenset({"selection"}),
        "boundaries.r4-prefill-[4-9]",
        "one thread too many copies the element one past the shared selection's end into the one past "
        "selected_indices' end: a read and a write in two guard bands, visible only because the two buffers' "
        "bands hold different bytes (the cases all select: with no selection slot the extra thread divides by "
        "zero, a fault that would end a test running the emulation in its own process)",
        caught_by="guard",
    ),
)

DIFF_MUTANTS = tuple(mutant for mutant in MUTANTS if mutant.caught_by == "diff")


def _r128_compression_total_by_value(monkeypatch) -> None:
    """The ratio-128 compressor launch passes total_sequence_length by value, read on the host."""
    from csa_conform.device import launches
    from csa_conform.spec import ReadBack

    compress = launches.READ_BACKS[ReadBack.COMPRESS]

    def by_value(run, launch):
        if run.g.ratio == 128:
            run.total = lambda: np.int64(int(run.t.host("total_sequence_length")))
        try:
            compress(run, launch)
        finally:
            run.__dict__.pop("total", None)

    monkeypatch.setitem(launches.READ_BACKS, ReadBack.COMPRESS, by_value)


HOST_PATCHES = {"r128_compression_total_by_value": _r128_compression_total_by_value}
