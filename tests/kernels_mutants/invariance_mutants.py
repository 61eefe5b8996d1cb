"""Planted bugs only `diff --invariance` is meant to catch (kept apart from mutants.MUTANTS, whose
tests expect a plain or mode-specific diff to catch each)."""

from __future__ import annotations

from mutants import Mutant

SPLIT_BY_BATCH = Mutant(
    "attention_dot_split_when_batched",
    "block_quant.cuh",
    '        for (int i = 0; i < a.dim; ++i) dot = dot + csa_mul(q[i], csa_candidate_value(a, where, i));\n',
    (
        '        float upper = 0.0f;\n'
        '        const bool split = gridDim.x > (unsigned int)(a.sequence * a.heads);\n'
        '        for (int i = 0; i < a.dim; ++i) {\n'
        '            const float term = csa_mul(q[i], csa_candidate_value(a, where, i));\n'
        '            if (split && 2 * i >= a.dim) upper = upper + term;\n'
        '            else dot = dot + term;\n'
        '        }\n'
        '        dot = dot + upper;\n'
    ),
    "sparse_sink_softmax_attention",
    frozenset({"sparse_sink_softmax_attention"}),
    "*",
    "with more than one batch row (a grid wider than S * N) each attention dot splits in two halves added at "
    "the end, split-K chosen by batch size: a case run at B = 1 agrees with the oracle, its rows at B > 1 do not",
    caught_by="invariance",
)
