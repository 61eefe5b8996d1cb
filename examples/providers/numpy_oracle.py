"""A NumPy stage provider: csa-conform's own oracle stages behind the provider protocol (specs/providers.md).

The conformant control of the protocol: every stage is the oracle's, so
``csa-conform diff goldens/ci.h5 --kernels python:examples/providers/numpy_oracle.py:NumpyOracle``
must pass every case; a run that does not is a fault of the runner, not of
this provider. It is also the smallest complete provider to copy: one method
per stage, each taking the stage's operator inputs and upstream payloads by
name and returning its payloads by tensor name. Each shows explain the
oracle's own sub-step intermediates through ``probe`` (specs/providers.md,
"Probes"): the oracle captures them under the probe names, and a probed call
hands each on in the protocol's layout.
"""

from __future__ import annotations

import numpy as np

import csa_conform
from csa_conform.contract import StepGeometry
from csa_conform.errors import ContractError
from csa_conform.numerics.variant import REFERENCE, Numerics
from csa_conform.oracle.engine import resolve_engine
from csa_conform.oracle.stage_functions import STAGE_FUNCTIONS


class _Arguments:
    """What a stage function of the oracle reads (its StageInputs), answered from a provider call's arguments."""

    def __init__(self, geometry: StepGeometry, tensors: dict, upstream: dict, numerics: Numerics = REFERENCE):
        self.geometry = geometry
        self.engine = resolve_engine(numerics=numerics)
        self._tensors = tensors
        self._upstream = upstream

    def input(self, name: str) -> np.ndarray:
        return self._tensors[name]

    def upstream(self, stage: str, tensor: str) -> np.ndarray:
        return self._upstream[tensor]

    def row_failure(self, stage, failure) -> None:
        if failure is not None:
            raise ContractError(failure.message, failure.kind)

    def prior_failure(self, stage):
        return None


def _oracle(stage: str, geometry: StepGeometry, inputs: dict, upstream: dict | None = None, probe=None) -> dict:
    """The oracle's stage; in a probed call (``probe`` given) it captures its intermediates and shows each."""
    if probe is None:
        return STAGE_FUNCTIONS[stage](_Arguments(geometry, inputs, upstream or {}))
    captured: dict = {}
    payload = STAGE_FUNCTIONS[stage](_Arguments(geometry, inputs, upstream or {}, Numerics(probes=captured)))
    for name, array in captured.items():
        if stage == "index_query_finalize":  # the oracle holds the query rows (b, s) as one axis; a probe splits it
            array = array.reshape((geometry.batch, geometry.sequence) + array.shape[1:])
        probe(name, array)
    return payload


class NumpyOracle:
    name = "numpy-oracle"
    version = csa_conform.__version__
    device = "cpu"

    def compression_update(self, geometry, compressor_kv, compressor_gate, compressor_ape, compressor_norm,
                           past_compressed_kv, past_compression_carry, probe=None):
        return _oracle("compression_update", geometry, dict(
            compressor_kv=compressor_kv, compressor_gate=compressor_gate, compressor_ape=compressor_ape,
            compressor_norm=compressor_norm, past_compressed_kv=past_compressed_kv,
            past_compression_carry=past_compression_carry), probe=probe)

    def index_key_update(self, geometry, index_compressor_kv, index_compressor_gate, index_compressor_ape,
                         index_compressor_norm, past_index_key, past_index_carry, probe=None):
        return _oracle("index_key_update", geometry, dict(
            index_compressor_kv=index_compressor_kv, index_compressor_gate=index_compressor_gate,
            index_compressor_ape=index_compressor_ape, index_compressor_norm=index_compressor_norm,
            past_index_key=past_index_key, past_index_carry=past_index_carry), probe=probe)

    def index_query_finalize(self, geometry, index_query, probe=None):
        return _oracle("index_query_finalize", geometry, dict(index_query=index_query), probe=probe)

    def index_scoring(self, geometry, transformed, present_index_key, index_weight, probe=None):
        return _oracle("index_scoring", geometry, dict(index_weight=index_weight),
                       dict(transformed=transformed, present_index_key=present_index_key), probe=probe)

    def selection(self, geometry, scores, probe=None):
        return _oracle("selection", geometry, {}, dict(scores=scores), probe=probe)

    def candidate_assembly(self, geometry, selected=None, probe=None):
        return _oracle("candidate_assembly", geometry, {}, dict(selected=selected), probe=probe)

    def sparse_sink_softmax_attention(self, geometry, query, current_kv, head_sink, attention_bias,
                                      present_compressed_kv, candidates, probe=None):
        return _oracle("sparse_sink_softmax_attention", geometry,
                       dict(query=query, current_kv=current_kv, head_sink=head_sink, attention_bias=attention_bias),
                       dict(present_compressed_kv=present_compressed_kv, candidates=candidates), probe=probe)

    def writeback(self, geometry, **sources):
        """The operator outputs: each is the payload of the stage that wrote it (the caches, the selection, Y)."""
        return {name: sources[name] for name in geometry.output_names}
