"""Binary32 lanes held in one LLVM vector, for the dot kernels' register accumulators.

numba keeps an accumulator that lives in an array in memory, loaded and
stored around every few terms, which caps a dot kernel near a third of the
machine's no-FMA peak. A ``Lanes`` value is an SSA vector, so a block of
them stays in registers for a whole reduction. Each operation is one IEEE
binary32 product or sum per lane, emitted without fast-math flags: LLVM may
neither contract a product and a sum into a fused multiply-add nor
reassociate, so every lane rounds as the reference's scalar code does.
A vector is one register: sixteen lanes where the host has AVX-512, else
eight (one AVX2 register, two SSE ones), so a block of eight vectors and its
operands fit the register file either way; any width is correct, since
lanes never mix. Only whole vectors are loaded and stored, at element
offsets of C-contiguous float32 arrays. A change here reaches the cached
kernels through compile_cache's digest of the package's kernel sources.
"""

from __future__ import annotations

from llvmlite import binding, ir
from numba.core import cgutils, types
from numba.core.datamodel import models, register_default
from numba.extending import intrinsic

LANES = 16 if binding.get_host_cpu_features().get("avx512f") else 8


class Lanes(types.Type):
    def __init__(self):
        super().__init__(name=f"Lanes{LANES}xfloat32")


lanes = Lanes()
_VECTOR = ir.VectorType(ir.FloatType(), LANES)


@register_default(Lanes)
class LanesModel(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, _VECTOR)


def _float32_array(array) -> bool:
    return isinstance(array, types.Array) and array.dtype == types.float32 and array.layout == "C"


def _lane_pointer(context, builder, array_type, array, index_type, index):
    indices = cgutils.unpack_tuple(builder, index, len(index_type)) if isinstance(index_type, types.BaseTuple) else [index]
    structure = context.make_array(array_type)(context, builder, array)
    element = cgutils.get_item_pointer(context, builder, array_type, structure, indices, wraparound=False)
    return builder.bitcast(element, _VECTOR.as_pointer())


def _index_fits(array, index) -> bool:
    if isinstance(index, types.Integer):
        return array.ndim == 1
    return isinstance(index, types.UniTuple) and isinstance(index.dtype, types.Integer) and len(index) == array.ndim


def _splat(builder, scalar):
    single = builder.insert_element(ir.Constant(_VECTOR, ir.Undefined), scalar, ir.Constant(ir.IntType(32), 0))
    return builder.shuffle_vector(single, single, ir.Constant(ir.VectorType(ir.IntType(32), LANES), [0] * LANES))


@intrinsic
def zero_lanes(typingctx):
    """LANES lanes of +0.0."""

    def codegen(context, builder, signature, args):
        return ir.Constant(_VECTOR, [0.0] * LANES)

    return lanes(), codegen


@intrinsic
def load_lanes(typingctx, array, index):
    """array[index], array[index + 1 in the last axis], ... (LANES elements, the last axis contiguous)."""
    if not (_float32_array(array) and _index_fits(array, index)):
        return None

    def codegen(context, builder, signature, args):
        pointer = _lane_pointer(context, builder, array, args[0], index, args[1])
        return builder.load(pointer, align=4)

    return lanes(array, index), codegen


@intrinsic
def store_lanes(typingctx, array, index, values):
    """The inverse of load_lanes."""
    if not (_float32_array(array) and _index_fits(array, index) and isinstance(values, Lanes)):
        return None

    def codegen(context, builder, signature, args):
        pointer = _lane_pointer(context, builder, array, args[0], index, args[1])
        builder.store(args[2], pointer, align=4)
        return context.get_dummy_value()

    return types.none(array, index, values), codegen


@intrinsic
def add_product(typingctx, total, weight, values):
    """total + weight * values, lane by lane: one binary32 product, then one binary32 sum, never fused."""
    if not (isinstance(total, Lanes) and weight == types.float32 and isinstance(values, Lanes)):
        return None

    def codegen(context, builder, signature, args):
        return builder.fadd(args[0], builder.fmul(_splat(builder, args[1]), args[2]))

    return lanes(total, weight, values), codegen


@intrinsic
def scale_lanes(typingctx, values, weight):
    """values * weight, lane by lane (one binary32 product)."""
    if not (isinstance(values, Lanes) and weight == types.float32):
        return None

    def codegen(context, builder, signature, args):
        return builder.fmul(args[0], _splat(builder, args[1]))

    return lanes(values, weight), codegen


@intrinsic
def add_lanes(typingctx, total, values):
    """total + values, lane by lane (one binary32 sum)."""
    if not (isinstance(total, Lanes) and isinstance(values, Lanes)):
        return None

    def codegen(context, builder, signature, args):
        return builder.fadd(args[0], args[1])

    return lanes(total, values), codegen


@intrinsic
def relu_lanes(typingctx, values):
    """values where values > 0, else +0 (a NaN lane gives +0, as ``x if x > 0 else 0``)."""
    if not isinstance(values, Lanes):
        return None

    def codegen(context, builder, signature, args):
        positive = builder.fcmp_ordered(">", args[0], ir.Constant(_VECTOR, [0.0] * LANES))
        return builder.select(positive, args[0], ir.Constant(_VECTOR, [0.0] * LANES))

    return lanes(values), codegen
