"""Porting bugs for `explain`'s structural diagnosis (csa_conform.explain.patterns), kept apart from the
detection mutants of mutants.py: each is a one-place patch of the built-in kernels with the stage it
first diverges at, the diagnosis kind explain must name there, and cases that exercise it.

``stage`` is the first stage a chained diff flags, ``kind`` the diagnosis explain gives the isolated
divergence of that stage (csa_conform.explain.patterns.KINDS), ``evidence`` a few facts its evidence must
hold; ``trial``, where the bug's cause is reproduced, the key of the hypothesis that reproduces it bit for
bit.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mutants import MUTANTS, Mutant


@dataclass(frozen=True)
class DiagnosedMutant:
    mutant: Mutant
    kind: str
    evidence: dict = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.mutant.name


def _bug(name, file, old, new, stage, cases, why, kind, **evidence) -> DiagnosedMutant:
    return DiagnosedMutant(Mutant(name, file, old, new, stage, frozenset({stage}), cases, why), kind, evidence)


def _known(name, kind, **evidence) -> DiagnosedMutant:
    """A detection mutant of mutants.py, with the diagnosis it must get."""
    return DiagnosedMutant(next(mutant for mutant in MUTANTS if mutant.name == name), kind, evidence)


DIAGNOSED = (
    _bug(
        "window_starts_one_early",
        "block_quant.cuh",
        "const long long window = r.position + 1 - 128 > 0 ? r.position + 1 - 128 : 0;",
        "const long long window = r.position - 128 > 0 ? r.position - 128 : 0;",
        "candidate_assembly", "boundaries.r128-resumed-247-*",
        "the dense window ends one position before the query (off by one at its start)",
        "index-shift", shift=-1,
    ),
    _bug(
        "causal_records_one_short",
        "csa_ratio4_index_select.cu",
        "const long long causal = (position + 1) / 4;",
        "const long long causal = position / 4;",
        "index_scoring", "boundaries.r4-prefill-*",
        "a query on a block's last position does not score the record that block completes",
        "restricted", value="-inf", trial="causal:-1",
    ),
    _bug(
        "carry_not_copied",
        "block_quant.cuh",
        "    for (long long i = 0; i < carry_floats; ++i) state[i] = past_state[i];",
        "    if (first_position == 0) for (long long i = 0; i < carry_floats; ++i) state[i] = past_state[i];",
        "compression_update", "boundaries.r4-decode-1-to-5",
        "the past carry is copied only on a prefill: a decode step starts from uninitialised memory",
        "never-written",
    ),
    _bug(
        "rope_pairs_split_halves",
        "block_quant.cuh",
        "        const float real = tail[2 * pair];\n"
        "        const float imaginary = tail[2 * pair + 1];\n"
        "        tail[2 * pair] = csa_round_bf16(csa_mul(real, cosine) - csa_mul(imaginary, sine));\n"
        "        tail[2 * pair + 1] = csa_round_bf16(csa_mul(real, sine) + csa_mul(imaginary, cosine));\n",
        "        const float real = tail[pair];\n"
        "        const float imaginary = tail[pair + rope_dim / 2];\n"
        "        tail[pair] = csa_round_bf16(csa_mul(real, cosine) - csa_mul(imaginary, sine));\n"
        "        tail[pair + rope_dim / 2] = csa_round_bf16(csa_mul(real, sine) + csa_mul(imaginary, cosine));\n",
        "compression_update", "boundaries.r4-prefill-[89]",
        "RoPE rotates (d, d + rope_dim/2) pairs, the split-halves layout, instead of interleaved (2i, 2i+1)",
        "sub-step", sub_step="RoPE", trial="rope:split-halves",
    ),
    _bug(
        "bf16_ties_away_from_zero",
        "block_quant.cuh",
        "    const unsigned int lsb = (bits >> 16) & 1u;\n    return (unsigned short)((bits + 0x7fffu + lsb) >> 16);",
        "    return (unsigned short)((bits + 0x8000u) >> 16);",
        "index_query_finalize", "boundaries.r4-chunks-3-3-6-2",
        "bf16 rounds ties away from zero instead of to even",
        "rounding-convention", convention="bf16 rounding ties away from zero (not to even)",
    ),
    _bug(
        "e8m0_exponent_floor_plus_one",
        "block_quant.cuh",
        "    return (int)ceilf(csa_block_scale_log2f(amax / target));",
        "    return (int)floorf(csa_block_scale_log2f(amax / target)) + 1;",
        "compression_update", "quant-edge.r128-*",
        "the E8M0 exponent is floor(log2)+1, one too large where amax/max_code is a power of two",
        "scale-exponent", steps=1, power_of_two=True,
    ),
    _bug(
        "fp4_nibbles_high_first",
        "block_quant.cuh",
        "        packed[i] = (unsigned char)(low | (high << 4));",
        "        packed[i] = (unsigned char)(high | (low << 4));",
        "index_key_update", "boundaries.r4-prefill-8",
        "FP4 codes are packed high nibble first",
        "permutation", pattern="nibbles swapped",
    ),
    _bug(
        "index_scale_without_heads",
        "csa_ratio4_index_select.cu",
        "1.0f / sqrtf((float)index_dim) / sqrtf((float)index_heads);",
        "1.0f / sqrtf((float)index_dim) / (float)index_heads;",
        "index_scoring", "boundaries.r4-prefill-8",
        "the head normalisation divides by I instead of sqrt(I)",
        "constant-factor", trial="scale:heads-unrooted",
    ),
    _bug(
        "records_without_batch_offset",
        "csa_ratio4_attention.cu",
        "where->record_row = (long long)r.b * compressed_capacity + record;",
        "where->record_row = record;",
        "sparse_sink_softmax_attention", "random.r4-b2n2-*",
        "the selected record is read without the batch row's offset: batch b >= 1 attends batch 0's records",
        "restricted", axis="b", low=1, trial="offset:present_compressed_kv:0",
    ),
    _bug(
        "sink_inside_the_max",
        "block_quant.cuh",
        "        shared_maximum = maximum;\n",
        "        if (maximum != CSA_NEG_INF) maximum = fmaxf(maximum, a.sink[r.head]);\n"
        "        shared_maximum = maximum;\n",
        "sparse_sink_softmax_attention", "boundaries.r4-prefill-[58]",
        "the sink logit is taken into the running max (softmax shifted by the sink where it is larger)",
        "restricted", predicate="sink above the row max", trial="softmax:sink-in-max",
    ),
    _bug(
        "fp4_ties_away_from_zero",
        "block_quant.cuh",
        "    code += magnitude > 0.25f;\n    code += magnitude >= 0.75f;\n    code += magnitude > 1.25f;\n"
        "    code += magnitude >= 1.75f;\n    code += magnitude > 2.5f;\n    code += magnitude >= 3.5f;\n"
        "    code += magnitude > 5.0f;\n",
        "    code += magnitude >= 0.25f;\n    code += magnitude >= 0.75f;\n    code += magnitude >= 1.25f;\n"
        "    code += magnitude >= 1.75f;\n    code += magnitude >= 2.5f;\n    code += magnitude >= 3.5f;\n"
        "    code += magnitude >= 5.0f;\n",
        "index_key_update", "boundaries.r4-prefill-[58]",
        "E2M1 midpoints round away from zero instead of to the even code",
        "rounding-convention", trial="codes:ties-away",
    ),
    _bug(
        "pool_skips_the_first_candidate",
        "block_quant.cuh",
        "    for (int c = 0; c < candidates; ++c) {\n        const float score = scores[c * stride];",
        "    for (int c = 1; c < candidates; ++c) {\n        const float score = scores[c * stride];",
        "compression_update", "boundaries.r128-resumed-119-*",
        "the pooled sum starts at the second candidate: the first slot of every block is left out",
        "sub-step", sub_step="pool", trial="pool:first-left-out",
    ),
    _bug(
        "rms_norm_of_the_sum_not_the_mean",
        "block_quant.cuh",
        "    const float inverse_rms = 1.0f / sqrtf(squares / (float)dim + 1.0e-6f);",
        "    const float inverse_rms = 1.0f / sqrtf(squares + 1.0e-6f);",
        "compression_update", "boundaries.r128-resumed-119-*",
        "RMSNorm divides by the root of the square sum, not of its mean: every record is 1/sqrt(dim) too small",
        "sub-step", sub_step="RMSNorm", trial="rms:sum",
    ),
    _bug(
        "hadamard_difference_reversed",
        "block_quant.cuh",
        "                values[lane + span] = a - b;",
        "                values[lane + span] = b - a;",
        "index_key_update", "boundaries.r4-prefill-8",
        "the Hadamard butterfly writes b - a for a - b: another orthogonal transform",
        "sub-step", sub_step="Hadamard", trial="hadamard:difference-reversed",
    ),
    _bug(
        "fp8_codes_truncated",
        "block_quant.cuh",
        "        code = ((mbits + 0x7ffffu + ((mbits >> 20) & 1u)) >> 20) - (120u << 3);",
        "        code = (mbits >> 20) - (120u << 3);",
        "compression_update", "boundaries.r128-resumed-119-*",
        "E4M3 codes of normal values are truncated toward zero instead of rounded to nearest even",
        "sub-step", sub_step="FP8 block quantization", trial="codes:truncate",
    ),
    _known("index_query_rope_one_position_late", "sub-step", sub_step="RoPE", trial="rope:position+1"),
    _known("r4_main_rope_at_block_end", "sub-step", sub_step="RoPE", trial="rope:position+3"),
    _known("fp8_scale_rounded_down", "scale-exponent"),
    _known("replicate_reverses_slots", "permutation", pattern="row reversed"),
    _known("index_score_without_head_normalization", "constant-factor", trial="scale:without-heads"),
)
