"""Bit-level primitives of the CPU reference, vectorised over any leading shape."""

from csa_conform.numerics.bf16 import bf16_bits, bf16_round, bf16_to_f32
from csa_conform.numerics.e8m0 import e8m0_decode, e8m0_encode
from csa_conform.numerics.fp4 import e2m1_decode, e2m1_encode, quantize_fp4_blocks
from csa_conform.numerics.fp8 import e4m3_decode, e4m3_encode, quantize_fp8_blocks
from csa_conform.numerics.hadamard import hadamard_bf16
from csa_conform.numerics.index_query import finalize_index_query
from csa_conform.numerics.libm import cosf, expf, log2f, powf, sinf
from csa_conform.numerics.records import (
    decode_fp4_record,
    decode_fp8_record,
    pack_fp4_record,
    pack_fp8_record,
    unpack_fp4_record,
    unpack_fp8_record,
)
from csa_conform.numerics.rope import compressed_rope

__all__ = [
    "bf16_bits", "bf16_round", "bf16_to_f32",
    "e8m0_decode", "e8m0_encode",
    "e2m1_decode", "e2m1_encode", "quantize_fp4_blocks",
    "e4m3_decode", "e4m3_encode", "quantize_fp8_blocks",
    "hadamard_bf16", "finalize_index_query", "compressed_rope",
    "cosf", "expf", "log2f", "powf", "sinf",
    "decode_fp4_record", "decode_fp8_record", "pack_fp4_record", "pack_fp8_record",
    "unpack_fp4_record", "unpack_fp8_record",
]
