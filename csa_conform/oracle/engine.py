"""Which implementation of the oracle's hot loops runs a step.

`numpy` is the reference formulation: readable, one module per stage, always
available. `numba` runs index scoring, attention's dot products and value
sums, the softmax's expf, compressor pooling and record finalization, and
index-query finalization as compiled kernels (compiled/dots.py,
compiled/record_kernels.py, compiled/libm_kernels.py) with the same binary32 operations in
the same order, so both engines give the same bytes
(tests/oracle/test_engines.py compares them on every golden step). `auto`,
the default, picks numba when it can be imported and the address-space
limit (``ulimit -v``) leaves it room: LLVM needs about NUMBA_ADDRESS_SPACE
to load and compile the kernels and aborts the process (no exception) when
it runs out, so under a tighter limit `auto` is numpy and an explicit
`numba` is refused as a memory shortage (exit 4).
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from functools import cache, partial
from typing import Callable

from csa_conform._base.memory import address_space_left, human
from csa_conform.errors import MemoryShortage, UsageError
from csa_conform.numerics.variant import REFERENCE, Numerics

ENGINE_VARIABLE = "CSA_CONFORM_ENGINE"
ENGINE_CHOICES = ("auto", "numpy", "numba")
# Measured: a verify with cached kernels peaks at 450 MB of address space; compiling them takes more.
NUMBA_ADDRESS_SPACE = 1 << 30
ENGINE_SLOTS = ("compression_update", "index_key_update", "index_query_finalize", "index_scoring",
          "sparse_sink_softmax_attention")  # Engine's fields after its name, in order


@dataclass(frozen=True)
class Engine:
    """The stage functions an engine swaps in; all other stages are shared NumPy code."""

    name: str
    compression_update: Callable
    index_key_update: Callable
    index_query_finalize: Callable
    index_scoring: Callable
    sparse_sink_softmax_attention: Callable
    numerics: Numerics = REFERENCE  # what the shared NumPy stages (selection) compute under


def numba_available() -> bool:
    return importlib.util.find_spec("numba") is not None


def _numba_has_room(left: tuple[int, str] | None) -> bool:
    return left is None or left[0] >= NUMBA_ADDRESS_SPACE


def auto_engine_name() -> str:
    """What "auto" picks: numba where it is installed and the address-space limit leaves it room."""
    return "numba" if numba_available() and _numba_has_room(address_space_left()) else "numpy"


def resolve_engine(choice: str | None = None, numerics: Numerics = REFERENCE) -> Engine:
    """The engine named by `choice`, else by $CSA_CONFORM_ENGINE, else auto, computing `numerics`."""
    source = "engine" if choice else ENGINE_VARIABLE
    name = choice or os.environ.get(ENGINE_VARIABLE) or "auto"
    if name not in ENGINE_CHOICES:
        raise UsageError(f"{source} {name!r} is not an oracle engine: expected one of {', '.join(ENGINE_CHOICES)}")
    if name == "auto":
        name = auto_engine_name()
    elif name == "numba" and not numba_available():
        raise UsageError("oracle engine 'numba' needs the numba package: pip install numba, or use engine numpy")
    elif name == "numba" and not _numba_has_room(left := address_space_left()):
        raise MemoryShortage(f"oracle engine 'numba' needs about {human(NUMBA_ADDRESS_SPACE)} of address space to "
                             f"compile its kernels, more than the {left[1]} leaves ({human(left[0])}); "
                             "use engine numpy (the same bytes)")
    if numerics is not REFERENCE:
        # The compiled kernels are the reference arithmetic only; a swapped ingredient (explain) needs numpy.
        numpy = _engine("numpy")
        return Engine("numpy", *(partial(getattr(numpy, stage), numerics=numerics) for stage in ENGINE_SLOTS),
                      numerics=numerics)
    return _engine(name)


def chosen_engine(choice: str | None) -> str | None:
    """Check a command's `choice` before any work (a bad name or a memory shortage is refused at once).

    The result is what the command passes to its oracle runs and --jobs workers as an argument:
    the resolved name, or None without a choice (each run then resolves the default itself), so
    nothing is written to the environment a test session or a caller's later commands share.
    """
    engine = resolve_engine(choice)
    return engine.name if choice is not None else None


@cache
def _engine(name: str) -> Engine:
    if name == "numba":
        from csa_conform.oracle.compiled import stage_kernels as stages

        return Engine(
            name, stages.compression_update, stages.index_key_update, stages.index_query_finalize,
            stages.index_scoring, stages.sparse_sink_softmax_attention,
        )
    from csa_conform.oracle.compression_update import compression_update
    from csa_conform.oracle.index_key_update import index_key_update
    from csa_conform.oracle.index_query_finalize import index_query_finalize
    from csa_conform.oracle.index_scoring import index_scoring
    from csa_conform.oracle.sparse_sink_softmax_attention import sparse_sink_softmax_attention

    return Engine(name, compression_update, index_key_update, index_query_finalize, index_scoring,
                  sparse_sink_softmax_attention)
