"""Realistic porting bugs the ci suite used to cover thinly (each caught by one to five cases): kept
apart from mutants.MUTANTS; tests/fuzz finds them by search, tests/goldens counts the ci cases that
catch them."""

from __future__ import annotations

from mutants import Mutant

THIN_MUTANTS = (
    Mutant(
        "sink_inside_the_max",
        "block_quant.cuh",
        "        shared_maximum = maximum;\n",
        "        if (maximum != CSA_NEG_INF) maximum = fmaxf(maximum, a.sink[r.head]);\n        shared_maximum = maximum;\n",
        "sparse_sink_softmax_attention",
        frozenset({"sparse_sink_softmax_attention"}),
        "*",
        "the sink logit joins the row maximum the softmax subtracts: only rows whose sink is above every score "
        "change",
    ),
    Mutant(
        "index_weight_folded",
        "csa_ratio4_index_select.cu",
        "1.0f / sqrtf((float)index_dim) / sqrtf((float)index_heads);",
        "1.0f / sqrtf((float)(index_dim * index_heads));",
        "index_scoring",
        frozenset({"index_scoring"}),
        "random.r4-*",
        "the head weight 1/sqrt(d)/sqrt(I) folded into 1/sqrt(d*I), which rounds differently for some I only",
    ),
    Mutant(
        "dense_window_one_early",
        "block_quant.cuh",
        "const long long window = r.position + 1 - 128 > 0 ? r.position + 1 - 128 : 0;",
        "const long long window = r.position - 128 > 0 ? r.position - 128 : 0;",
        "candidate_assembly",
        frozenset({"candidate_assembly", "sparse_sink_softmax_attention"}),
        "boundaries.*",
        "the dense window starts one position early once a query is past 128: a 129th token is attended",
    ),
)
