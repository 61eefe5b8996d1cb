"""A third set of realistic bugs for `explain` (issue 28), written apart from mutants.py and
diagnosis_mutants.py: porting bugs over stages 3-7 and both ratios, numeric-only variants and bit-identical
refactors, each a patch of the built-in kernels (one or more old -> new replacements in one file).

``stage`` is the first stage a chained diff flags (None for a refactor: nothing diverges). ``named`` says
what a true, specific explanation of the isolated divergence there is: the first finding's ``kind`` and,
where they pin the bug, its evidence (``sub_step``, ``trial``, a ``predicate`` fragment...), or the verdict's
cause ``trial`` key. ``claims`` lists the kinds that are true of the bug but less specific (a restriction
of where it is): reported, they are no false claim, only not "named". Anything else a verdict claims
(another structural kind, another cause) is false.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Bug:
    name: str
    file: str
    patches: tuple[tuple[str, str], ...]
    stage: str | None
    cases: str
    why: str
    named: dict = field(default_factory=dict)
    claims: frozenset[str] = frozenset({"restricted"})
    kind: str = "porting"  # porting, numeric or refactor

    def apply(self, source: Path, target: Path) -> Path:
        """Copy kernel directory ``source`` to ``target`` with the patches applied (judged strict)."""
        shutil.copytree(source, target)
        (target / "csa-kernels.toml").write_text('build = "strict"\n', encoding="utf-8")
        path = target / self.file
        text = path.read_text(encoding="utf-8")
        for old, new in self.patches:
            if text.count(old) != 1:
                raise AssertionError(f"{self.name}: patch text occurs {text.count(old)} times in {self.file}")
            text = text.replace(old, new)
        path.write_text(text, encoding="utf-8")
        return target


EXPLAIN_BUGS = (
    Bug("index_query_reads_batch_zero", "csa_ratio4_index_select.cu",
        (("const float* source = index_query + ((long long)row * index_heads + h) * index_dim;",
          "const float* source = index_query + ((long long)s * index_heads + h) * index_dim;"),),
        "index_query_finalize", "random.r4-b2n2-*",
        "the index query is read without its batch offset: every batch row finalizes batch 0's query",
        {"kind": "row-aliasing", "axis": "b"}),
    Bug("index_query_read_head_major", "csa_ratio4_index_select.cu",
        (("const float* source = index_query + ((long long)row * index_heads + h) * index_dim;",
          "const float* source = index_query + (((long long)b * index_heads + h) * sequence + s) * index_dim;"),),
        "index_query_finalize", "boundaries.r4-prefill-8",
        "index_query is indexed [B,I,S,D] where the contract lays it out [B,S,I,D]",
        {"kind": "layout", "trial": "layout:index_query:12"}),
    Bug("attention_output_written_head_major", "block_quant.cuh",
        (("            a.output[(long long)r.row * a.dim + d] = accumulated;",
          "            a.output[(((long long)r.b * a.heads + r.head) * a.sequence + r.s) * a.dim + d] = accumulated;"),),
        "sparse_sink_softmax_attention", "random.r*-b2n2*",
        "Y is written [B,N,S,D] where the contract lays it out [B,S,N,D] (both ratios)",
        {"kind": "layout", "tensor": "Y"}),
    Bug("dense_rows_without_batch_offset", "block_quant.cuh",
        (("where->dense_row = (long long)r.b * a.current_kv_len + (absolute - r.kv_base);",
          "where->dense_row = absolute - r.kv_base;"),),
        "sparse_sink_softmax_attention", "random.r*-b2n2-*",
        "the dense window is read without the batch row's offset: batch b >= 1 attends batch 0's keys",
        {"kind": "row-aliasing", "trial": "offset:current_kv:0"}),
    Bug("dense_window_one_longer_on_a_first_step", "block_quant.cuh",
        (("    r.dense = first_position == 0 ? min(a.current_kv_len, 128) : 128;",
          "    r.dense = min(a.current_kv_len + 1, 128);"),),
        "candidate_assembly", "boundaries.r4-prefill-*",
        "the dense window takes one slot more than current_kv holds on a stream's first step: every record "
        "slot moves one place up (the candidates read back name a position past current_kv: explain's re-run "
        "once crashed on it with an IndexError)",
        {"trial": "dense:one-longer"}, claims=frozenset({"restricted", "index-shift"})),
    Bug("index_query_scale_from_frexpf", "csa_ratio4_index_select.cu",
        (("            quantize_fp4_e2m1_block(values, &scale, packed);\n"
          "            const float block_scale = e8m0_scale(scale);\n",
          "            float amax = 6.0f * 0x1p-126f;\n"
          "            for (int i = 0; i < 32; ++i) amax = fmaxf(amax, fabsf(values[i]));\n"
          "            int power;\n"
          "            frexpf(amax / 6.0f, &power);\n"
          "            const float block_scale = csa_power_of_two(power);\n"
          "            scale = (unsigned char)(power + 127);\n"
          "            for (int i = 0; i < 16; ++i) {\n"
          "                const unsigned char low = csa_encode_e2m1(fminf(fmaxf(values[2 * i] / block_scale, -6.0f), "
          "6.0f));\n"
          "                const unsigned char high = csa_encode_e2m1(fminf(fmaxf(values[2 * i + 1] / block_scale, "
          "-6.0f), 6.0f));\n"
          "                packed[i] = (unsigned char)(low | (high << 4));\n"
          "            }\n"),),
        "index_query_finalize", "quant-edge.r4-*",
        "the query's FP4 round trip takes its E8M0 exponent from frexpf, one too large where amax/6 is an exact "
        "power of two (frexpf's mantissa is in [0.5, 1))",
        {"kind": "scale-exponent", "tensor": "transformed"}),
    Bug("selection_pads_with_record_zero", "csa_ratio4_index_select.cu",
        (("rank < topk_width; rank += (int)blockDim.x) row_selected[rank] = -1;",
          "rank < topk_width; rank += (int)blockDim.x) row_selected[rank] = 0;"),),
        "selection", "boundaries.r4-prefill-8",
        "the slots past the causal records are padded with record 0 instead of -1",
        {"trial": "selection:pad-0"}),
    Bug("overlap_pool_reads_the_wrong_half", "block_quant.cuh",
        (("const long long at = c * slot_stride + (overlap && c >= ratio ? dim + i : i);",
          "const long long at = c * slot_stride + (overlap && c > ratio ? dim + i : i);"),),
        "compression_update", "boundaries.r4-prefill-8",
        "the overlapping ratio-4 pool reads slot 4 (the current block's first) from the previous block's half",
        {"kind": "sub-step", "sub_step": "pool", "trial": "pool:boundary+1"},
        claims=frozenset({"restricted", "sub-step:none"})),
    Bug("index_scale_one_rounding", "csa_ratio4_index_select.cu",
        (("1.0f / sqrtf((float)index_dim) / sqrtf((float)index_heads);",
          "1.0f / (sqrtf((float)index_dim) * sqrtf((float)index_heads));"),),
        "index_scoring", "boundaries.r4-prefill-8",
        "the head weight scale is computed as 1/(sqrt(d)·sqrt(I)), one rounding fewer than 1/sqrt(d)/sqrt(I)",
        {"trial": "scale:product"}, claims=frozenset({"restricted", "constant-factor"}), kind="numeric"),
    Bug("softmax_reciprocal_multiply", "block_quant.cuh",
        (("const float probability = csa_expf(logit - maximum) / denominator;",
          "const float probability = csa_expf(logit - maximum) * (1.0f / denominator);"),),
        "sparse_sink_softmax_attention", "random.r*-b2n2*",
        "softmax multiplies by a rounded reciprocal of the denominator instead of dividing",
        {"trial": "softmax:reciprocal"}, kind="numeric"),
    Bug("fast_math_exp", "block_quant.cuh",
        (("const float probability = csa_expf(logit - maximum) / denominator;",
          "const float probability = exp2f((logit - maximum) * 1.44269504f) / denominator;"),),
        "sparse_sink_softmax_attention", "random.r*-b2n2*",
        "the weights of P·V use exp2f(x·log2 e), a fast-math exp",
        {"trial": ("weights-expf:exp2f", "weights-expf:exp2f-device")}, kind="numeric"),
    Bug("pv_fma_contracted", "block_quant.cuh",
        (("accumulated = accumulated + csa_mul(probability, csa_candidate_value(a, where, d));",
          "accumulated = fmaf(probability, csa_candidate_value(a, where, d), accumulated);"),),
        "sparse_sink_softmax_attention", "random.r*-b2n2*",
        "P·V accumulates with a contracted fma",
        {"trial": "fma:accumulate"}, kind="numeric"),
    Bug("pv_deferred_normalization", "block_quant.cuh",
        (("const float probability = csa_expf(logit - maximum) / denominator;\n"
          "                        tile_weight[j] = probability;",
          "const float probability = csa_expf(logit - maximum) / denominator;\n"
          "                        tile_weight[j] = csa_expf(logit - maximum);"),
         ("            const float accumulated = sums[k];",
          "            const float accumulated = maximum != CSA_NEG_INF ? sums[k] / denominator : 0.0f;")),
        "sparse_sink_softmax_attention", "random.r*-b2n2*",
        "P·V sums the weights exp(s - m) and divides each output element by Z once (flash-attention style)",
        {"trial": "values:deferred-normalization"}, kind="numeric"),
    Bug("pv_binary64_accumulator", "block_quant.cuh",
        (("                    float accumulated = sums[k];",
          "                    double accumulated = sums[k];"),
         ("accumulated = accumulated + csa_mul(probability, csa_candidate_value(a, where, d));",
          "accumulated = accumulated + (double)probability * (double)csa_candidate_value(a, where, d);"),
         ("                    sums[k] = accumulated;", "                    sums[k] = (float)accumulated;")),
        "sparse_sink_softmax_attention", "random.r*-b2n2*",
        "P·V accumulates in binary64 and rounds to binary32 once per tile of candidate slots",
        {"trial": ("values:binary64", "values:binary64-tile64", "values:binary64-tile128", "values:binary64-tile256")},
        kind="numeric"),
    Bug("logit_binary64_accumulator", "block_quant.cuh",
        (("        float dot = 0.0f;\n"
          "        for (int i = 0; i < a.dim; ++i) dot = dot + csa_mul(q[i], csa_candidate_value(a, where, i));\n"
          "        float score = csa_mul(dot, a.scale);",
          "        double dot = 0.0;\n"
          "        for (int i = 0; i < a.dim; ++i)\n"
          "            dot = dot + (double)q[i] * (double)csa_candidate_value(a, where, i);\n"
          "        float score = csa_mul((float)dot, a.scale);"),),
        "sparse_sink_softmax_attention", "random.r*-b2n2*",
        "the logit dots q·k accumulate in binary64 and round to binary32 once",
        {"trial": "logits:binary64"}, kind="numeric"),
    Bug("index_query_skips_the_hadamard", "csa_ratio4_index_select.cu",
        (("        csa_hadamard_bf16(q, index_dim);\n", ""),),
        "index_query_finalize", "boundaries.r4-prefill-8",
        "the query is quantized to FP4 without its Hadamard rotation (the keys keep theirs)",
        {"kind": "sub-step", "sub_step": "Hadamard", "trial": "hadamard:skipped"},
        claims=frozenset({"restricted", "sub-step:none"})),
    Bug("rms_norm_without_its_weight", "block_quant.cuh",
        (("record[i] = csa_round_bf16(record[i] * inverse_rms * norm[i]);",
          "record[i] = csa_round_bf16(record[i] * inverse_rms);"),),
        "compression_update", "boundaries.r4-prefill-8",
        "the compressors' RMSNorm leaves its weight out (both ratios, main and index records)",
        {"kind": "sub-step", "sub_step": "RMSNorm", "trial": "rms:unweighted"}),
    Bug("sink_of_head_zero_for_every_head", "block_quant.cuh",
        (("            denominator = denominator + csa_expf(a.sink[r.head] - maximum);",
          "            denominator = denominator + csa_expf(a.sink[0] - maximum);"),),
        "sparse_sink_softmax_attention", "random.r*-b2n2*",
        "every head's softmax takes head 0's sink logit",
        {"kind": "row-aliasing", "trial": "offset:head_sink:0"}),
    Bug("index_weights_without_batch_offset", "csa_ratio4_index_select.cu",
        (("    const float* weights = index_weight + (long long)row * index_heads;",
          "    const float* weights = index_weight + (long long)s * index_heads;"),),
        "index_scoring", "random.r4-b2n2-*",
        "the head weights are read without the batch row's offset: batch b >= 1 scores with batch 0's weights",
        {"kind": "row-aliasing", "trial": "offset:index_weight:0"}),
    Bug("index_scores_fma_contracted", "csa_ratio4_index_select.cu",
        (("                dot = dot + csa_mul(q[d], decode_e2m1(code) * e8m0_scale(block[0]));",
          "                dot = fmaf(q[d], decode_e2m1(code) * e8m0_scale(block[0]), dot);"),
         ("            weighted = weighted + csa_mul(relu * weights[h], weight_scale);",
          "            weighted = fmaf(relu * weights[h], weight_scale, weighted);")),
        "index_scoring", "random.r4-[5n]*",
        "the index score's dot and head sum accumulate with fmaf, as a contracting compiler would",
        {"trial": "fma:accumulate"}, kind="numeric"),
    Bug("refactor_fp8_scaled_by_reciprocal", "block_quant.cuh",
        (("packed[i] = csa_encode_e4m3fn(fminf(fmaxf(in[i] / block_scale, -448.0f), 448.0f));",
          "packed[i] = csa_encode_e4m3fn(fminf(fmaxf(in[i] * (1.0f / block_scale), -448.0f), 448.0f));"),),
        None, "boundaries.r128-resumed-119-*",
        "FP8 values times the reciprocal of their power-of-two scale: exact, so the same codes",
        kind="refactor"),
    Bug("refactor_scores_cleared_backwards", "block_quant.cuh",
        (("for (int c = 0; c < a.scratch_stride; ++c) slot_scores[c] = CSA_NEG_INF;",
          "for (int c = a.scratch_stride - 1; c >= 0; --c) slot_scores[c] = CSA_NEG_INF;"),),
        None, "random.r*-b2n2*", "the score scratch is cleared from its end: the same values",
        kind="refactor"),
    Bug("refactor_causal_count_shift", "csa_ratio4_index_select.cu",
        (("const long long causal = (position + 1) / 4;", "const long long causal = (position + 1) >> 2;"),),
        None, "boundaries.r4-prefill-[48]", "the causal count as a shift: positions are never negative",
        kind="refactor"),
)
