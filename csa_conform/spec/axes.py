"""Axis names of every tensor a diff can print: stage payloads (from the stages) and operator tensors."""

from __future__ import annotations

from csa_conform.spec.stages import BY_NAME

# Operator inputs and outputs: axis names of the tensors that are not stage payloads.
OPERATOR_AXES = {
    "query": ("b", "s", "h", "d"),
    "current_kv": ("b", "k", "d"),
    "compressor_kv": ("b", "s", "d"),
    "compressor_gate": ("b", "s", "d"),
    "compressor_ape": ("slot", "d"),
    "compressor_norm": ("d",),
    "past_compressed_kv": ("b", "r", "d"),
    "past_compression_carry": ("b", "slot", "ch", "d"),
    "seqlens_k": ("b",),
    "total_sequence_length": (),
    "head_sink": ("h",),
    "index_query": ("b", "s", "i", "d"),
    "index_weight": ("b", "s", "i"),
    "index_compressor_kv": ("b", "s", "d"),
    "index_compressor_gate": ("b", "s", "d"),
    "index_compressor_ape": ("slot", "d"),
    "index_compressor_norm": ("d",),
    "past_index_key": ("b", "r", "byte"),
    "past_index_carry": ("b", "slot", "ch", "d"),
    "attention_bias": ("b", "h", "s", "c"),
    "Y": ("b", "s", "h", "d"),
    "present_compressed_kv": ("b", "r", "d"),
    "present_compression_carry": ("b", "slot", "ch", "d"),
    "present_index_key": ("b", "r", "byte"),
    "present_index_carry": ("b", "slot", "ch", "d"),
    "selected_indices": ("b", "i", "s", "k"),
}


def payload_axes(stage: str, tensor: str) -> tuple[str, ...] | None:
    """Axis names of a stage payload or operator tensor; None when the spec does not know it."""
    owner = BY_NAME.get(stage)
    payload = owner.payload(tensor) if owner is not None else None
    return payload.axes if payload is not None else OPERATOR_AXES.get(tensor)
