"""Kernel directories written to the official numerics: a copy of kernels/ whose attention row is replaced.

``official``: bf16 q·k (binary32 sums ascending in d), online softmax over
blocks of 64 candidates, p_j rounded to bf16 before the value product, the
sink added to the denominator after the loop, Y rounded to bf16. Inside a
block it sums even and odd candidates in two accumulators and adds them, as
a split (MMA-like) reduction would: its own order, not the profile's, so it
matches neither profile bit for bit. ``sink_in_max`` starts the running max
and sum at the sink instead (algebraically the same softmax, other p_j before
their rounding). ``bf16_accumulation`` rounds the value sums to bf16 after
every addition: numerics worse than the official code's. Applied like the
mutants of tests/kernels_mutants: to a temporary copy, judged strict.
"""

from __future__ import annotations

import shutil
from pathlib import Path

PRELUDE = "block_quant.cuh"
START = "template <typename Locate>\n__device__ void csa_sink_attention("

ROW = """template <typename Locate>
__device__ void csa_sink_attention(const CsaAttention& a, const CsaAttentionRow& r, int slots, Locate locate)
{
    const float* q = a.query + (long long)r.row * a.dim;
    float* slot_scores = a.scores + (long long)r.row * a.scratch_stride;
    if (threadIdx.x == 0u) {
        for (int c = 0; c < a.scratch_stride; ++c) slot_scores[c] = CSA_NEG_INF;
        for (int c = 0; c < slots; ++c) {
            CsaCandidate where = {-1, -1};
            if (!locate(c, &where)) continue;
            float dot = 0.0f;
            for (int i = 0; i < a.dim; ++i)
                dot = dot + csa_mul(csa_round_bf16(q[i]), csa_round_bf16(csa_candidate_value(a, where, i)));
            float score = csa_mul(dot, a.scale);
            if (a.bias_present != 0) {
                const long long at = (((long long)(a.bias_b == 1 ? 0 : r.b) * a.bias_h + (a.bias_h == 1 ? 0 : r.head))
                    * a.bias_s + (a.bias_s == 1 ? 0 : r.s)) * a.bias_k + (a.bias_k == 1 ? 0 : c);
                score = score + a.bias[at];
            }
            slot_scores[c] = score;
        }
    }
    __syncthreads();  // thread 0 has written every slot's logit

    for (int d = (int)threadIdx.x; d < a.dim; d += (int)blockDim.x) {
        float maximum = @START_MAX@;
        float denominator = @START_SUM@;
        float accumulated = 0.0f;
        for (int begin = 0; begin < slots; begin += 64) {
            const int end = begin + 64 < slots ? begin + 64 : slots;
            float block_max = maximum;
            for (int c = begin; c < end; ++c)
                if (slot_scores[c] != CSA_NEG_INF) block_max = fmaxf(slot_scores[c], block_max);
            if (block_max == CSA_NEG_INF) continue;
            const float rescale = maximum == CSA_NEG_INF ? 0.0f : csa_expf(maximum - block_max);
            float p_even = 0.0f, p_odd = 0.0f, v_even = 0.0f, v_odd = 0.0f;
            for (int c = begin; c < end; ++c) {
                const float logit = slot_scores[c];
                CsaCandidate where = {-1, -1};
                if (logit == CSA_NEG_INF || !locate(c, &where)) continue;
                const float p = csa_expf(logit - block_max);
                const float term = csa_mul(csa_round_bf16(p), csa_round_bf16(csa_candidate_value(a, where, d)));
                if (((c - begin) & 1) == 0) {
                    p_even = p_even + p;
                    v_even = @ROUND@(v_even + term);
                } else {
                    p_odd = p_odd + p;
                    v_odd = @ROUND@(v_odd + term);
                }
            }
            denominator = csa_mul(denominator, rescale) + (p_even + p_odd);
            accumulated = @ROUND@(csa_mul(accumulated, rescale) + @ROUND@(v_even + v_odd));
            maximum = block_max;
        }
        float y = 0.0f;
        if (maximum != CSA_NEG_INF) {
@SINK@            y = csa_round_bf16(accumulated / denominator);
        }
        a.output[(long long)r.row * a.dim + d] = y;
    }
}
"""

SINK_AFTER = "            denominator = denominator + csa_expf(a.sink[r.head] - maximum);\n"
VARIANTS = {
    "official": {"@START_MAX@": "CSA_NEG_INF", "@START_SUM@": "0.0f", "@SINK@": SINK_AFTER, "@ROUND@": ""},
    "sink_in_max": {"@START_MAX@": "a.sink[r.head]", "@START_SUM@": "1.0f", "@SINK@": "", "@ROUND@": ""},
    "bf16_accumulation": {"@START_MAX@": "CSA_NEG_INF", "@START_SUM@": "0.0f", "@SINK@": SINK_AFTER,
                          "@ROUND@": "csa_round_bf16"},
}


def attention_row(variant: str) -> str:
    text = ROW
    for marker, value in VARIANTS[variant].items():
        text = text.replace(marker, value)
    return text


def apply(variant: str, source: Path, target: Path) -> Path:
    """Copy kernel directory ``source`` to ``target`` with the attention row of ``variant``, built strict."""
    shutil.copytree(source, target)
    (target / "csa-kernels.toml").write_text('build = "strict"\n', encoding="utf-8")
    prelude = target / PRELUDE
    text = prelude.read_text(encoding="utf-8")
    if text.count(START) != 1:
        raise AssertionError(f"the attention row's start occurs {text.count(START)} times in {PRELUDE}")
    begin = text.index(START)
    end = text.index("\n}\n", begin) + len("\n}\n")
    prelude.write_text(text[:begin] + attention_row(variant) + text[end:], encoding="utf-8")
    return target
