"""Realistic porting bugs at edges a short random stream does not reach: a ratio-4 query past position 128
whose current_kv holds more than its window, a batch row's offset into the shared selection, a long
ratio-128 carry. Kept apart from mutants.MUTANTS (the ci suite need not catch them three times):
tests/fuzz must find the window one, and tests/reduce shrinks cases of each."""

from __future__ import annotations

from mutants import Mutant

EDGE_MUTANTS = (
    Mutant(
        "r4_window_one_early_past_128",
        "csa_ratio4_attention.cu",
        "    const CsaAttentionRow r = csa_attention_row(attention, (int)blockIdx.x);\n",
        "    CsaAttentionRow r = csa_attention_row(attention, (int)blockIdx.x);\n"
        "    if (r.dense_start > r.kv_base) r.dense_start -= 1;\n",
        "candidate_assembly",
        frozenset({"candidate_assembly", "sparse_sink_softmax_attention"}),
        "boundaries.r4-resumed-126-*",
        "the ratio-4 dense window starts one position early wherever current_kv holds that position (a query "
        "past 128 whose window is full): the query's own position drops out",
    ),
    Mutant(
        "r4_selection_row_without_index_heads",
        "csa_ratio4_attention.cu",
        "selected + ((long long)r.b * index_heads * sequence + r.s) * topk_width;",
        "selected + ((long long)r.b * sequence + r.s) * topk_width;",
        "candidate_assembly",
        frozenset({"candidate_assembly", "sparse_sink_softmax_attention"}),
        "edges.r4-n5-i3-k2-b2-*",
        "batch row b reads its selection as if selected_indices had one index head: rows after the first attend "
        "another row's (or head's) records once I > 1",
    ),
    Mutant(
        "r128_carry_copied_as_64_slots",
        "block_quant.cuh",
        "    for (long long i = 0; i < carry_floats; ++i) state[i] = past_state[i];",
        "    for (long long i = 0; i < (overlap ? carry_floats : carry_floats / 2); ++i) state[i] = past_state[i];",
        "compression_update",
        frozenset({"compression_update"}),
        "boundaries.r128-resumed-*",
        "a resumed ratio-128 step copies only the first 64 slots of its past carry: a block completed after "
        "position 64 of it pools unwritten slots",
    ),
)
