"""csa-conform's built-in CUDA kernels behind the provider protocol: a cross-check of the protocol itself.

``CupyBuiltinKernels`` launches the kernels of ``kernels/`` through CuPy and
NVRTC (strict build), one provider call per built-in launch: both
compressors, ``index_select`` (stages 3-5: the index-select launch, then the
replicate launch on its own selection) and ``attend`` (stages 6-7). Run with

    csa-conform diff goldens/ci.h5 --kernels python:examples/providers/builtin_kernels.py:CupyBuiltinKernels

its verdicts must be the native backend's (``csa-conform diff goldens/ci.h5``)
case for case. ``HostBuiltinKernels`` is the same on the g++ host emulation
(``--backend host``), so the cross-check runs without a GPU. ``CSA_PROVIDER_KERNELS=DIR``
launches another kernel directory of the built-in ABI instead (a planted bug, to compare with
``diff --kernels DIR``).

The launches, their arguments and read-backs are csa-conform's own
(csa_conform.device.launches), run here on the tensors the provider call is
given; only the call boundary is the protocol's. Those read-backs return
host arrays, so this provider's payloads cross to the host and back between
calls, which the protocol allows (a provider that returns device arrays keeps
them on the device). One difference is by
construction: the native runner confirms the candidate ids it reads off the
attention scores against the oracle's (csa_conform.device.candidates); a
provider never sees the oracle, so here the ids are the structural ones where
the scores are finite, which is what they are unless the kernel reads another
candidate than it should.
"""

from __future__ import annotations

import os

import numpy as np

import csa_conform
from csa_conform.device import launches
from csa_conform.device.backend import CUDA, HOST, backend_named
from csa_conform.device.kernels import KernelDirectory
from csa_conform.device.plan import plan_step
from csa_conform.device.provenance import RunProvenance
from csa_conform.device.step import Launcher, StepRun
from csa_conform.device.tensors import StepTensors
from csa_conform.spec import STAGE_NAMES, Mode

# Another kernel directory of the built-in ABI to launch instead (a planted-bug copy, for the cross-check).
KERNELS_ENV = "CSA_PROVIDER_KERNELS"


class CupyBuiltinKernels:
    name = "builtin-kernels"
    version = csa_conform.__version__
    device = "cuda"
    backend_name = CUDA

    def __init__(self):
        self._backend = None
        self.kernels = KernelDirectory(os.environ.get(KERNELS_ENV))
        self.provenance = RunProvenance(None, self.kernels.fingerprint())

    def backend(self):
        if self._backend is None:
            self._backend = backend_named(self.backend_name)()
            self.provenance.compiled = self._backend.builds
        return self._backend

    def _launch(self, geometry, stages: tuple[str, ...], tensors: dict) -> dict:
        """The built-in launches that compute ``stages``, on ``tensors`` (inputs and upstream buffers by name)."""
        plan = plan_step(geometry.ratio, Mode.CHAINED, frozenset(STAGE_NAMES) - set(stages))
        held = StepTensors(self.backend)
        for name, value in tensors.items():
            if value is not None:
                held.put(name, value)
        held.put("total_sequence_length", np.asarray(geometry.total, dtype=np.int64))
        run = StepRun(Launcher(self.backend, self.kernels, self.provenance), geometry, plan, held, {}, "", -1)
        for launch in plan.launches:
            launches.READ_BACKS[launch.read_back](run, launch)
        return {tensor: value for stage in stages for tensor, value in run.stages[stage].items()}

    def compression_update(self, geometry, compressor_kv, compressor_gate, compressor_ape, compressor_norm,
                           past_compressed_kv, past_compression_carry):
        return self._launch(geometry, ("compression_update",), dict(
            compressor_kv=compressor_kv, compressor_gate=compressor_gate, compressor_ape=compressor_ape,
            compressor_norm=compressor_norm, past_compressed_kv=past_compressed_kv,
            past_compression_carry=past_compression_carry))

    def index_key_update(self, geometry, index_compressor_kv, index_compressor_gate, index_compressor_ape,
                         index_compressor_norm, past_index_key, past_index_carry):
        return self._launch(geometry, ("index_key_update",), dict(
            index_compressor_kv=index_compressor_kv, index_compressor_gate=index_compressor_gate,
            index_compressor_ape=index_compressor_ape, index_compressor_norm=index_compressor_norm,
            past_index_key=past_index_key, past_index_carry=past_index_carry))

    def index_select(self, geometry, index_query, index_weight, present_index_key):
        return self._launch(geometry, ("index_query_finalize", "index_scoring", "selection"), dict(
            index_query=index_query, index_weight=index_weight, present_index_key=present_index_key))

    def attend(self, geometry, query, current_kv, head_sink, attention_bias, present_compressed_kv, selected=None):
        tensors = dict(query=query, current_kv=current_kv, head_sink=head_sink, attention_bias=attention_bias,
                       present_compressed_kv=present_compressed_kv)
        if selected is not None:  # the attention launch reads the replicated selection
            tensors["selected_indices"] = np.ascontiguousarray(np.broadcast_to(
                _host(selected)[:, None], (geometry.batch, geometry.index_heads) + tuple(selected.shape[1:])))
        return self._launch(geometry, ("candidate_assembly", "sparse_sink_softmax_attention"), tensors)

    def writeback(self, geometry, **sources):
        """The operator outputs are the buffers the launches wrote, as the native runner's writeback reads them."""
        return {name: sources[name] for name in geometry.output_names}


class HostBuiltinKernels(CupyBuiltinKernels):
    """The same launches on the g++ host emulation: the cross-check without a GPU."""

    name = "builtin-kernels-host"
    device = "cpu"
    backend_name = HOST


def _host(array) -> np.ndarray:
    return array if isinstance(array, np.ndarray) else array.get()
