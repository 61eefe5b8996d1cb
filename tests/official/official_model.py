"""A scalar model of the official numerics, one (b, s, h) row or one (b, s, c) score at a time.

Written from the rules of specs/official-profile.md, independently of the
profile's vectorised code, with one switch per rule: the tests require the
profile to equal the model with every rule kept, and the model with one rule
broken to differ from it on the same input (so that input pins that rule).
"""

from __future__ import annotations

import numpy as np

from csa_conform.numerics.bf16 import bf16_round
from csa_conform.numerics.libm import expf

F32 = np.float32
# Rules the golden attention step pins; block_order needs a crafted cancellation (its own test).
RULES = ("bf16_p", "block64", "sink_outside_max", "bf16_inputs", "bf16_output")
SCORING_RULES = ("bf16_dot", "bf16_weight", "bf16_term", "bf16_total")


def sequential(values: np.ndarray) -> np.float32:
    """Left-to-right binary32 sum starting from 0 (np.add.accumulate is sequential)."""
    values = np.asarray(values, dtype=F32)
    return F32(0) if values.size == 0 else F32(np.add.accumulate(np.concatenate([[F32(0)], values]))[-1])


def attention_row(q, kv, valid, sink, scale, bias=None, broken: str | None = None):
    """Y [D] of one (b, s, h) row: q [D], kv [C, D] in candidate order, valid [C]."""
    q, kv = np.asarray(q, F32), np.asarray(kv, F32)
    if broken != "bf16_inputs":
        q, kv = bf16_round(q), bf16_round(kv)
    logits = np.array([sequential(q * kv[j]) for j in range(len(kv))], dtype=F32) * F32(scale)
    if bias is not None:
        logits = logits + np.asarray(bias, F32)
    logits = np.where(valid, logits, F32(-np.inf)).astype(F32)
    return online_row(logits, kv, sink, broken)


def online_row(logits, kv, sink, broken: str | None = None):
    """Y [D] of one row from its logits [C] (-inf invalid) and bf16 values kv [C, D]."""
    block = len(kv) if broken == "block64" else 64
    inside = broken == "sink_outside_max"  # broken: the sink joins the max and the sum from the start
    m = F32(sink) if inside else F32(-np.inf)
    z, o = F32(1 if inside else 0), np.zeros(kv.shape[1], F32)
    with np.errstate(invalid="ignore", over="ignore"):
        for begin in range(0, len(kv), block):
            part = logits[begin : begin + block]
            m_new = F32(np.fmax(m, np.fmax.reduce(part, initial=-np.inf)))
            if m_new == -np.inf:
                continue
            r = expf(np.array([m - m_new], F32))[0]
            p = np.where(part != -np.inf, expf(part - m_new), F32(0)).astype(F32)
            pv = p if broken == "bf16_p" else bf16_round(p)
            order = range(len(part) - 1, -1, -1) if broken == "block_order" else range(len(part))
            p_sum, v_sum = F32(0), np.zeros_like(o)
            for j in order:
                p_sum = F32(p_sum + p[j])
                v_sum = (v_sum + pv[j] * kv[begin + j]).astype(F32)
            z = F32(z * r + p_sum)
            o = (o * r + v_sum).astype(F32)
            m = m_new
        if m == -np.inf:
            return np.zeros(kv.shape[1], F32)
        if not inside:
            z = F32(z + expf(np.array([F32(sink) - m], F32))[0])
        y = (o / z).astype(F32)
    return y if broken == "bf16_output" else bf16_round(y)


def index_score(q, keys, weights, broken: str | None = None):
    """Score of one (b, s, c): q [I, 128] transformed queries, keys [128], weights [I] (the f32 input)."""
    heads, width = q.shape
    scalar = F32(width**-0.5 * heads**-0.5)
    w = bf16_round(np.asarray(weights, F32))
    w = (w * scalar).astype(F32) if broken == "bf16_weight" else bf16_round(w * scalar)
    terms = []
    for i in range(heads):
        dot = sequential(bf16_round(q[i]) * bf16_round(keys))
        dot = dot if broken == "bf16_dot" else bf16_round(np.array([dot], F32))[0]
        term = F32(max(dot, F32(0)) * w[i])
        terms.append(term if broken == "bf16_term" else bf16_round(np.array([term], F32))[0])
    total = sequential(np.array(terms, F32))
    return total if broken == "bf16_total" else bf16_round(np.array([total], F32))[0]
