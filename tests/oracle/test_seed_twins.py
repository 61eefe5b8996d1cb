"""Twins of the CPU seed's operator tests, on the seed's own closed-form streams."""

from __future__ import annotations

import numpy as np
import pytest

from csa_conform import ContractError
from csa_conform.compare.testing import same_bits
from csa_conform.golden.recipes.closed_form import (
    TOPK,
    r4_index_ape,
    r4_index_score,
    r4_index_value,
    r128_ape,
    r128_compressor_score,
    r128_compressor_value,
    ratio4_plan,
    ratio128_plan,
)
from csa_conform.golden.recipes.stream import assemble, empty_state, play
from csa_conform.numerics import decode_fp8_record, expf
from csa_conform.oracle import run_step

F = np.float32


def r128_expected_carry(position: int) -> np.ndarray:
    carry = empty_state({"compression_ratio": 128}, 1)["past_compression_carry"]
    if (position + 1) % 128 == 0:
        return carry
    d = np.arange(512)
    for absolute in range(position - position % 128, position + 1):
        slot = absolute % 128
        ape = r128_ape(np.int64(slot), d)
        carry[0, slot, 0] = r128_compressor_value(np.int64(absolute), d)
        carry[0, slot, 1] = (r128_compressor_score(np.int64(absolute), d) - ape) + ape
    return carry


def test_ratio128_stateful_carry_matches_full_recompute_across_decode_boundary():
    decodes = tuple((position, 1, 128) for position in (254, 255, 256))
    stream = play(ratio128_plan(((0, 128, None), (128, 126, None)) + decodes), run_step)
    full = play(ratio128_plan(((0, 128, None), (128, 129, None))), run_step)[-1]

    record = stream[-1].outputs["present_compressed_kv"][0, 1]
    assert record[:8].tolist() == [119, 115, 115, 116, 116, 117, 118, 118]
    assert record[583 - 128 :][:8].tolist() == [173, 191, 51, 186, 117, 63, 143, 63]

    assert same_bits(stream[1].outputs["present_compression_carry"], r128_expected_carry(253))
    for offset, step in enumerate(stream[2:]):
        position = 254 + offset
        assert same_bits(step.outputs["present_compression_carry"], r128_expected_carry(position)), position
        assert same_bits(step.outputs["Y"], full.outputs["Y"][:, 126 + offset : 127 + offset]), position
    for name in ("present_compression_carry", "present_compressed_kv"):
        assert same_bits(stream[-1].outputs[name], full.outputs[name]), name
    logical = stream[-1].stages["compression_update"]["logical_records"][0, 1]
    assert same_bits(logical, decode_fp8_record(record))


def r4_expected_index_carry(position: int) -> np.ndarray:
    carry = empty_state({"compression_ratio": 4}, 1)["past_index_carry"]
    source = np.arange(256)
    channel, d = source // 128, source % 128

    def write(slot, absolute):
        ape = r4_index_ape(np.int64(absolute % 4), source)
        carry[0, slot, 0] = r4_index_value(np.int64(absolute), channel, d)
        carry[0, slot, 1] = (r4_index_score(np.int64(absolute), channel, d) - ape) + ape

    completed = (position + 1) // 4 * 4
    if completed >= 4:
        for slot in range(4):
            write(slot, completed - 4 + slot)
    for absolute in range(completed, position + 1):
        write(4 + absolute % 4, absolute)
    return carry


def scalar_selection(transformed, keys, weights, position, topk):
    """Element-by-element scores and ordering: an independent spelling of stages 4 and 5."""
    heads, width = transformed.shape
    scale = F(1) / np.sqrt(F(width)) / np.sqrt(F(heads))
    scores = []
    for record in range((position + 1) // 4):
        score = F(0)
        for head in range(heads):
            dot = F(0)
            for q, k in zip(transformed[head], keys[record]):
                dot = F(dot + F(q * k))
            score = F(score + F(F(max(dot, F(0)) * weights[head]) * scale))
        scores.append((record, score))
    assert len({score for _, score in scores}) == len(scores), "fixture must not tie"
    ranked = [record for record, _ in sorted(scores, key=lambda item: -item[1])][:topk]
    return ranked + [-1] * (topk - len(ranked))


def test_ratio4_index_compression_topk_and_streaming_match_independent_oracle():
    full16 = play(ratio4_plan(((0, 16),)), run_step)[0]
    assert same_bits(full16.outputs["present_index_carry"], r4_expected_index_carry(15))
    replicated = full16.outputs["selected_indices"]
    assert same_bits(replicated[:, 0], replicated[:, 1]), "every index head repeats the shared selection"
    transformed = full16.stages["index_query_finalize"]["transformed"][0]
    keys = full16.stages["index_key_update"]["logical_keys"][0]
    weights = full16.inputs["index_weight"][0]
    for position in range(16):
        expected = scalar_selection(transformed[position], keys, weights[position], position, TOPK)
        assert replicated[0, 0, position].tolist() == expected, position
    last = replicated[0, 0, 15].tolist()
    assert sum(record not in last for record in range(4)) >= 2, "top-k must observably exclude blocks"

    prefix = play(ratio4_plan(((0, 6),)), run_step)[0]
    assert same_bits(prefix.outputs["present_index_carry"], r4_expected_index_carry(5))
    incremental = play(ratio4_plan(((0, 6), (6, 1), (7, 1))), run_step)
    assert same_bits(incremental[1].outputs["present_index_carry"], r4_expected_index_carry(6))
    full8 = play(ratio4_plan(((0, 8),)), run_step)[0]
    last_step = incremental[-1]
    for name in ("present_compressed_kv", "present_index_key", "present_compression_carry", "present_index_carry"):
        assert same_bits(last_step.outputs[name], full8.outputs[name]), name
    assert same_bits(last_step.outputs["Y"], full8.outputs["Y"][:, 7:8])
    assert same_bits(last_step.outputs["selected_indices"], full8.outputs["selected_indices"][:, :, 7:8])


def test_ratio4_topk_ties_remain_explicitly_unsupported():
    plan = ratio4_plan(((0, 8),))
    step = plan.steps[0]
    step.replace["index_weight"] = np.zeros_like(step.fresh["index_query"][..., 0])
    inputs = assemble(plan, step, plan.initial_state)
    with pytest.raises(ContractError) as raised:
        run_step(plan.attrs, inputs, list(plan.output_names))
    assert raised.value.kind == "unsupported"
    assert str(raised.value) == (
        "CompressedSparseAttention: Unsupported: portable top-k tie ordering is unfrozen: "
        "equal score 0 at [batch=0, query=7] for compressed records 0 and 1"
    )


def scalar_attention(query, rows, sink, scale, bias):
    """One (b, s, h) row of stage 7 spelled element by element."""
    scores = []
    for row in rows:
        if row is None:
            scores.append(F(-np.inf))
            continue
        dot = F(0)
        for q, k in zip(query, row):
            dot = F(dot + F(q * k))
        scores.append(F(F(dot * scale) + bias[len(scores)]))
    valid = [score for score in scores if score != -np.inf]
    if not valid:
        return scores, np.zeros(query.shape, dtype=F)
    maximum = max(valid)
    denominator = F(0)
    for score in valid:
        denominator = F(denominator + expf(F(score - maximum)))
    denominator = F(denominator + expf(F(sink - maximum)))
    output = np.zeros(query.shape, dtype=F)
    for score, row in zip(scores, rows):
        if score != -np.inf:
            probability = F(expf(F(score - maximum)) / denominator)
            output = (output + (probability * row).astype(F)).astype(F)
    return scores, output


def test_gathered_dense_fallback_matches_scalar_sink_oracle():
    plan = ratio4_plan(((0, 12),))
    step = plan.steps[0]
    rng = np.random.default_rng(3)
    step.fresh["attention_bias"] = rng.standard_normal((1, 1, 12, 12 + 2)).astype(F)
    golden = play(plan, run_step)[0]
    query, kv = golden.inputs["query"][0], golden.inputs["current_kv"][0]
    records = golden.stages["compression_update"]["logical_records"][0]
    candidates = golden.stages["candidate_assembly"]["candidates"][0]
    attention = golden.stages["sparse_sink_softmax_attention"]
    scale = F(1) / np.sqrt(F(512))
    for s in range(12):
        dense = [kv[c] if c >= 0 else None for c in candidates[s, :12]]
        compressed = [records[c] if c >= 0 else None for c in candidates[s, 12:]]
        bias = golden.inputs["attention_bias"][0, 0, s]
        scores, output = scalar_attention(query[s, 0], dense + compressed, golden.inputs["head_sink"][0], scale, bias)
        assert same_bits(np.array(scores, dtype=F), attention["scores"][0, s, 0]), s
        assert same_bits(output, golden.outputs["Y"][0, s, 0]), s


def test_fp8_compressed_cache_matches_same_logical_f32_cache():
    chunks = ((0, 128, None), (128, 3, None), (131, 1, 128))
    packed_plan = ratio128_plan(chunks)
    f32_plan = ratio128_plan(chunks)
    f32_plan.attrs["cache_format"] = "f32"
    f32_plan.initial_state = empty_state(f32_plan.attrs, 1)
    packed, logical = play(packed_plan, run_step), play(f32_plan, run_step)
    for fp8_step, f32_step in zip(packed, logical):
        assert same_bits(fp8_step.outputs["Y"], f32_step.outputs["Y"])
        decoded = decode_fp8_record(fp8_step.outputs["present_compressed_kv"])
        assert same_bits(decoded, f32_step.outputs["present_compressed_kv"])
