"""DeepSeek-V4's official numerics of compressed sparse attention in PyTorch, behind the provider protocol.

A reference for a serving stack, and what csa-conform judges against the
``official`` profile's calibrated envelope (specs/official-profile.md,
specs/providers.md):

    csa-conform generate --suite ci --profile official -o build/official.h5
    csa-conform calibrate build/official.h5 -o build/envelope.json
    csa-conform diff build/official.h5 --tolerance build/envelope.json \
        --kernels python:examples/providers/torch_official.py:TorchOfficial

It implements the three stages whose arithmetic the official code defines
differently from the CPU reference (index scoring as a bf16 einsum, top-k
selection with its tie order, and block-64 online-softmax attention with the
sink added to the denominator after the loop) and candidate assembly, the
index arithmetic between them. The compressors and query finalization follow
the same rules in the official code as in the reference and are not written
here: csa-conform's host oracle runs them, and the run header says so.

Every tensor is computed on ``device`` (CUDA when there is one, else the CPU)
in binary32 holding bf16 values where the official code has bf16 tensors:
``bf16(x)`` rounds to nearest even and widens back, which is what a bf16
tensor read by a binary32 accumulator holds. Products of bf16 operands are
exact in binary32. Sums run in the official order the profile fixes: dots
ascending in d, index heads ascending, each softmax block's sums ascending in
candidate from 0 (one elementwise add per term, never a fused multiply-add).
What is left to differ from the NumPy profile is torch's ``exp`` against
glibc's ``expf``: rounding, inside the envelope.

Attention shows explain each row's softmax maximum and denominator through
``probe`` (specs/providers.md, "Probes"), so a probed re-run tells a wrong
maximum from a wrong denominator (the sink left out: the maximum equal, the
denominator not).
"""

from __future__ import annotations

import torch

BLOCK = 64  # candidates per online-softmax block
DENSE_WINDOW = 128  # the dense window's slots


def bf16(x: torch.Tensor) -> torch.Tensor:
    """A binary32 tensor rounded to bf16 (nearest even) and widened back."""
    return x.to(torch.bfloat16).to(torch.float32)


def ascending(terms) -> torch.Tensor:
    """Σ of the terms in the order given, from 0, in binary32: the official order of a dot or block sum."""
    total = None
    for term in terms:
        total = term + 0.0 if total is None else total + term
    return total


class TorchOfficial:
    name = "torch-official"
    version = torch.__version__
    device = "cuda" if torch.cuda.is_available() else "cpu"

    def __init__(self):
        # binary32 must stay binary32: a TF32 matmul would round the bf16 operands' products.
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False

    @staticmethod
    def from_dlpack(array) -> torch.Tensor:
        """Inputs arrive as NumPy (CPU) or CuPy (CUDA) arrays; torch shares their memory."""
        return torch.from_dlpack(array)

    # --- stage 4 -------------------------------------------------------------------------------

    def index_scoring(self, geometry, transformed, logical_keys, index_weight):
        """score = bf16(Σ_i bf16(relu(bf16(q_i·k)) · w_i)), w_i = bf16(bf16(weight_i) · 128^-1/2 · I^-1/2)."""
        heads, width = transformed.shape[2], transformed.shape[3]
        queries, keys = bf16(transformed), bf16(logical_keys)
        dots = bf16(ascending(queries[:, :, :, None, d] * keys[:, None, None, :, d] for d in range(width)))
        scale = torch.tensor(width**-0.5 * heads**-0.5, dtype=torch.float32)
        weights = bf16(bf16(index_weight) * scale.to(index_weight.device))
        terms = bf16(torch.relu(dots) * weights[..., None])
        scores = bf16(ascending(terms[:, :, head] for head in range(heads)))
        return {"scores": torch.where(self._causal(geometry, scores), scores, -torch.inf)}

    @staticmethod
    def _causal(geometry, scores: torch.Tensor) -> torch.Tensor:
        """[1, S, records]: query s at position start + s scores the records before (position + 1) / 4."""
        positions = geometry.start + torch.arange(geometry.sequence, device=scores.device)
        count = torch.clamp((positions + 1) // 4, max=geometry.next_records)
        return (torch.arange(scores.shape[-1], device=scores.device)[None, :] < count[:, None])[None]

    # --- stage 5 -------------------------------------------------------------------------------

    def selection(self, geometry, scores):
        """The first Kw causal records by descending score, equal scores in ascending record index."""
        live = self._causal(geometry, scores).expand_as(scores)
        keys = torch.where(live, -scores, torch.inf)
        order = torch.sort(keys, dim=-1, stable=True).indices[..., : geometry.topk_width]
        selected = torch.where(torch.gather(live, -1, order), order, -1).to(torch.int32)
        replicated = selected[:, None].expand(-1, geometry.index_heads, -1, -1).contiguous()
        return {"selected": selected, "selected_indices": replicated}

    # --- stage 6 -------------------------------------------------------------------------------

    def candidate_assembly(self, geometry, selected=None):
        """Each query's dense window (absolute positions), then its compressed records; -1 an invalid slot."""
        device = selected.device if selected is not None else self._device()
        positions = geometry.start + torch.arange(geometry.sequence, device=device)
        first = torch.clamp(positions + 1 - DENSE_WINDOW, min=0).clamp(min=geometry.current_kv_base)
        absolute = first[:, None] + torch.arange(geometry.dense_candidates, device=device)[None, :]
        inside = (absolute <= positions[:, None]) & (absolute - geometry.current_kv_base < geometry.current_kv_len)
        dense = torch.where(inside, absolute, -1).expand(geometry.batch, -1, -1)
        if selected is None:  # ratio 128: every record, valid below (position + 1) / 128
            records = torch.arange(geometry.next_records, device=device)[None, :]
            compressed = torch.where(records < ((positions + 1) // geometry.ratio)[:, None], records, -1)
            compressed = compressed.expand(geometry.batch, -1, -1)
        else:
            compressed = selected.to(torch.int64)
        return {"candidates": torch.cat([dense, compressed], dim=-1).to(torch.int32)}

    def _device(self) -> torch.device:
        return torch.device(self.device)

    # --- stage 7 -------------------------------------------------------------------------------

    def sparse_sink_softmax_attention(self, geometry, query, current_kv, head_sink, attention_bias,
                                      logical_records, candidates, probe=None):
        values, empty = self._gather(geometry, current_kv, logical_records, candidates)
        queries = bf16(query)
        logits = ascending(queries[:, :, :, None, d] * values[:, :, None, :, d]
                           for d in range(query.shape[-1])) * geometry.scale.item()
        if attention_bias is not None:
            logits = logits + attention_bias.permute(0, 2, 1, 3)
        logits = logits.masked_fill(empty[:, :, None, :], -torch.inf)
        return {"scores": logits, "Y": self._online_softmax(logits, values, head_sink, probe)}

    @staticmethod
    def _gather(geometry, current_kv, logical_records, candidates):
        """Each candidate's bf16 kv row [B, S, C, D]: dense slots from current_kv, compressed ones from the
        records; an empty slot (-1) reads zeros. Also the empty slots' mask [B, S, C]."""
        batch, dim = current_kv.shape[0], current_kv.shape[-1]
        table = torch.cat([current_kv, logical_records.to(torch.float32),
                           current_kv.new_zeros((batch, 1, dim))], dim=1)
        zero_row = table.shape[1] - 1
        candidates = candidates.to(torch.int64)
        dense, compressed = candidates[..., : geometry.dense_candidates], candidates[..., geometry.dense_candidates:]
        rows = torch.cat([torch.where(dense >= 0, dense - geometry.current_kv_base, zero_row),
                          torch.where(compressed >= 0, geometry.current_kv_len + compressed, zero_row)], dim=-1)
        batch_index = torch.arange(batch, device=rows.device)[:, None, None]
        return bf16(table)[batch_index, rows], candidates < 0

    def _online_softmax(self, logits, values, head_sink, probe=None):
        """Blocks of 64 candidates: running max m, denominator Z and numerator O; the sink after the loop.
        ``probe`` is shown m and Z of every row [B, S, N] (Z 0 where a row has no candidate)."""
        shape = logits.shape[:3]
        maximum = logits.new_full(shape, -torch.inf)
        denominator = logits.new_zeros(shape)
        numerator = logits.new_zeros(shape + values.shape[-1:])
        for begin in range(0, logits.shape[-1], BLOCK):
            block = logits[..., begin: begin + BLOCK]
            block_max = torch.maximum(maximum, block.amax(dim=-1))
            live = block_max != -torch.inf
            rescale = torch.where(live, torch.exp(maximum - block_max), 0.0)
            p = torch.where(block != -torch.inf, torch.exp(block - block_max[..., None]), 0.0)
            weights = bf16(p)
            denominator = denominator * rescale + ascending(p[..., j] for j in range(p.shape[-1]))
            numerator = numerator * rescale[..., None] + ascending(
                weights[..., j, None] * values[:, :, None, begin + j] for j in range(p.shape[-1]))
            maximum = block_max
        active = maximum != -torch.inf
        denominator = denominator + self._sink_mass(head_sink, maximum, active)
        if probe is not None:
            probe("softmax_max", maximum)
            probe("softmax_denominator", torch.where(active, denominator, 0.0))
        return torch.where(active[..., None], bf16(numerator / denominator[..., None]), 0.0)

    @staticmethod
    def _sink_mass(head_sink, maximum, active):
        """exp(sink[h] - m): the sink adds denominator mass only, never enters the max."""
        return torch.where(active, torch.exp(head_sink.to(torch.float32) - maximum), 0.0)


class TorchOfficialWithoutSink(TorchOfficial):
    """A planted bug for the envelope to catch: the sink's denominator mass left out."""

    name = "torch-official-without-sink"

    @staticmethod
    def _sink_mass(head_sink, maximum, active):
        return torch.zeros_like(maximum)
