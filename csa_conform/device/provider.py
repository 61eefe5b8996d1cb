"""Python stage providers (specs/providers.md): any implementation of some stages, judged like kernels.

A provider is a Python object named by ``--kernels python:MODULE:OBJECT`` (or
``python:path/to/file.py:OBJECT``). It declares ``name``, ``version`` and
``device`` and implements any subset of the eight stages as methods named
after them, or a fused call (``index_select``: stages 3-5, ``attend``:
stages 6-7, as the built-in launches fuse them). A method takes the stage's
operator inputs and the upstream payloads it reads by name (specs/stage-payloads.md),
and ``geometry`` (csa_conform.contract.StepGeometry) if its signature names it; it returns
the payloads of its stages by tensor name, as any array that speaks DLPack,
the CUDA array interface or ``__array__``. Stages a provider lacks run on the
host oracle inside the run, as ``--force-host`` stages do. A method that names
``probe`` is handed a callback in explain's probed re-run (None otherwise), through
which it shows its sub-step intermediates (``ProvidedProbes``).

The runner holds a step's tensors on the provider's device (NumPy arrays for
``cpu``, CuPy arrays for ``cuda``; ``from_dlpack`` converts them into the
provider's own type) and adopts what it returns without a copy where the
device matches: NumPy through DLPack on the CPU, CuPy on the GPU.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol

import numpy as np

from csa_conform.contract import StepGeometry, attention_bias
from csa_conform.device.determinism import Nondeterminism
from csa_conform.device.provenance import DeviceInfo, LaunchRecord
from csa_conform.device.tensors import StepTensors
from csa_conform.errors import DeviceUnavailable, HostStageRejected, UsageError
from csa_conform.numerics.bits import unsigned
from csa_conform.spec import (
    BY_NAME,
    DECODED_PAYLOADS,
    LAUNCHES,
    STAGE_NAMES,
    WRITEBACK,
    WRITEBACK_SOURCES,
    stages_for_ratio,
)

PREFIX = "python:"
PROVIDER_PATH = "python"
DECLARED = ("name", "version", "device")
DEVICES = ("cpu", "cuda")

# The fused calls a provider may offer instead of single stages: the built-in launches that compute more
# than one stage, by their read-back's name (index_select = stages 3-5, attend = stages 6-7).
GROUPS: dict[str, tuple[str, ...]] = {
    launch.read_back.value: launch.stages for launch in LAUNCHES if len(launch.stages) > 1
}

# The upstream payloads each stage reads, beside its operator inputs (what the oracle's stage functions read).
# A stage that reads a cache is also given its decoded view (DECODED_PAYLOADS: logical_records, logical_keys).
UPSTREAM: dict[str, tuple[tuple[str, str], ...]] = {
    "compression_update": (),
    "index_key_update": (),
    "index_query_finalize": (),
    "index_scoring": (("index_query_finalize", "transformed"), ("index_key_update", "present_index_key")),
    "selection": (("index_scoring", "scores"),),
    "candidate_assembly": (("selection", "selected"),),
    "sparse_sink_softmax_attention": (("compression_update", "present_compressed_kv"),
                                      ("candidate_assembly", "candidates")),
    "writeback": tuple(WRITEBACK_SOURCES.values()),
}


def is_provider(kernels: str | None) -> bool:
    return bool(kernels) and kernels.startswith(PREFIX)


class StageProvider(Protocol):
    """What a provider declares; its stage methods are looked up by name (``STAGE_NAMES``, ``GROUPS``)."""

    name: str
    version: str
    device: str


class ProviderStageFailed(HostStageRejected):
    """A provider's call raised or returned what is no payload: the stage's verdict, not a crash of the tool."""


@dataclass(frozen=True)
class ProviderCall:
    """One call of a provider in a step: the method and the stages it computes (plan_step's ``calls``)."""

    module: str
    stages: tuple[str, ...]


def _load(spec: str) -> tuple[Any, Path | None]:
    """The object ``python:TARGET:OBJECT`` names, and the file it came from."""
    body = spec[len(PREFIX):]
    target, _, attribute = body.rpartition(":")
    if not target or not attribute:
        raise UsageError(f"--kernels {spec}: a provider is python:MODULE:OBJECT or python:path/to/file.py:OBJECT")
    if target.endswith(".py") or "/" in target:
        path = Path(target)
        if not path.is_file():
            raise UsageError(f"--kernels {spec}: no file {target}")
        name = "csa_provider_" + hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:12]
        loader = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(loader)
        sys.modules[name] = module
        try:
            loader.loader.exec_module(module)
        except Exception as error:  # noqa: BLE001 - the provider's own code: an environment error naming it
            sys.modules.pop(name, None)
            raise DeviceUnavailable(f"--kernels {spec}: {target} failed to load: {type(error).__name__}: {error}") \
                from None
    else:
        try:
            module = importlib.import_module(target)
        except ModuleNotFoundError as error:
            if error.name and target.startswith(error.name):
                raise UsageError(f"--kernels {spec}: no module named {error.name!r}") from None
            raise DeviceUnavailable(f"--kernels {spec}: {target} needs {error.name!r}, which is not installed") \
                from None
        except Exception as error:  # noqa: BLE001 - as above
            raise DeviceUnavailable(f"--kernels {spec}: {target} failed to import: {type(error).__name__}: {error}") \
                from None
        path = Path(module.__file__) if getattr(module, "__file__", None) else None
    if not hasattr(module, attribute):
        raise UsageError(f"--kernels {spec}: {target} has no {attribute!r}")
    found = getattr(module, attribute)
    if inspect.isclass(found) or inspect.isfunction(found):
        try:
            found = found()
        except Exception as error:  # noqa: BLE001 - the provider's own constructor
            raise DeviceUnavailable(f"--kernels {spec}: {attribute}() raised {type(error).__name__}: {error}") \
                from None
    return found, path


class Transfer:
    """The half of a backend a provider run needs: tensors to the provider's device and back.

    ``cpu`` keeps NumPy arrays (nothing crosses); ``cuda`` holds CuPy arrays on the current device.
    """

    builds: dict = {}

    def __init__(self, device: str, describe: str):
        self.gpu = device.startswith("cuda")
        self.ordinal = int(device.partition(":")[2] or 0)
        self._describe = describe

    def info(self) -> DeviceInfo:
        if not self.gpu:
            return DeviceInfo(name=self._describe)
        import cupy

        properties = cupy.cuda.runtime.getDeviceProperties(self.ordinal)
        return DeviceInfo(name=f"{self._describe}, {properties['name'].decode()}",
                          compute_capability="".join(map(str, cupy.cuda.Device(self.ordinal).compute_capability)),
                          cuda_runtime=cupy.cuda.runtime.runtimeGetVersion(),
                          cuda_driver=cupy.cuda.runtime.driverGetVersion(), cupy=cupy.__version__)

    def upload(self, array: np.ndarray):
        if not self.gpu:
            return array
        import cupy

        with cupy.cuda.Device(self.ordinal):
            return cupy.asarray(array)

    def download(self, array) -> np.ndarray:
        if isinstance(array, np.ndarray):
            return array
        import cupy

        return cupy.asnumpy(array)


def adopt(value: Any, where: str):
    """A returned array as NumPy (on the CPU) or CuPy (on the GPU), without a copy where the device matches."""
    if isinstance(value, np.ndarray):
        return value
    if hasattr(value, "__dlpack_device__"):
        kind = value.__dlpack_device__()[0]
        try:
            if kind == 1:  # kDLCPU
                return np.from_dlpack(value)
            if kind in (2, 3, 13):  # CUDA, pinned host, CUDA managed
                import cupy

                return cupy.from_dlpack(value)
        except (BufferError, TypeError, RuntimeError, ValueError) as error:
            raise TypeError(f"{where} cannot be read through DLPack: {error}") from None
        raise TypeError(f"{where} lives on DLPack device type {kind}, neither the CPU nor CUDA")
    if hasattr(value, "__cuda_array_interface__"):
        import cupy

        return cupy.asarray(value)
    if hasattr(value, "__array__"):
        return np.asarray(value)
    raise TypeError(f"{where} is a {type(value).__name__}, not an array (DLPack, CUDA array interface or __array__)")


@dataclass(frozen=True)
class RecordedCall:
    """One provider call of a step, with its arguments bound (``again`` repeats it) and what it returned."""

    case: str
    step: int
    call: ProviderCall
    again: Callable[[], Any]
    payloads: dict


@dataclass
class ProvidedProbes:
    """What one provider call handed its ``probe`` callback in a probed run: each intermediate as a host copy by
    name, and what was no probe (a provider defect, said in the explanation, never the stage's verdict)."""

    call: str  # the method
    stages: tuple[str, ...]
    accepts: bool  # whether the method names ``probe`` at all
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    defects: list[str] = field(default_factory=list)


class ProbeCalls:
    """A probed step's provider calls, one ProvidedProbes each (the step result's ``probes``): the provider's
    counterpart of a probed kernel build's logs (csa_conform.device.probes.ProbeRecorder)."""

    def __init__(self):
        self.logs: list[ProvidedProbes] = []


class ProviderSite(Protocol):
    """The step a provider call runs in (csa_conform.device.step.StepRun)."""

    g: StepGeometry
    t: StepTensors
    stages: dict[str, dict[str, np.ndarray]]
    reference: Mapping[str, Mapping[str, np.ndarray]]
    findings: list
    repeat: int
    case: str
    step: int
    probes: Any  # ProbeCalls in explain's probed re-run, else None

    @property
    def isolated(self) -> bool: ...

    def on_device(self, stage: str) -> bool: ...

    def record(self, launch: LaunchRecord) -> None: ...


class Provider:
    """A loaded provider: what it declares, the calls it offers per ratio, and how one call runs."""

    def __init__(self, spec: str):
        self.spec = spec
        self.object: StageProvider
        self.object, self.path = _load(spec)
        missing = [name for name in DECLARED if not isinstance(getattr(self.object, name, None), str)]
        if missing:
            raise UsageError(f"--kernels {spec}: the provider declares no {', '.join(missing)} "
                             f"(a provider declares name, version and device as strings: specs/providers.md)")
        self.name, self.version, self.device = (getattr(self.object, name) for name in DECLARED)
        kind, _, ordinal = self.device.partition(":")
        if kind not in DEVICES or (ordinal and not (kind == "cuda" and ordinal.isdigit())):
            raise UsageError(f"--kernels {spec}: device {self.device!r} is not cpu, cuda or cuda:N")
        self.methods = tuple(name for name in (*STAGE_NAMES, *GROUPS) if callable(getattr(self.object, name, None)))
        if not self.methods:
            raise UsageError(f"--kernels {spec}: the provider implements no stage (methods named "
                             f"{', '.join(STAGE_NAMES)}, or {', '.join(GROUPS)})")
        self.transfer = Transfer(self.device, f"{self.name} {self.version} on {self.device}")
        self.recording = False  # bench sets it: keep the calls of the last step run, to repeat them
        self.recorded: list[RecordedCall] = []
        if self.transfer.gpu and importlib.util.find_spec("cupy") is None:
            raise DeviceUnavailable(f"--kernels {spec}: {self.name} runs on {self.device}, and its tensors cross "
                                    "through CuPy, which is not installed (pip install 'csa-conform[cuda]')")

    @property
    def gpu(self) -> bool:
        return self.transfer.gpu

    def calls(self, ratio: int) -> tuple[ProviderCall, ...]:
        """The provider's calls for a step of this ratio, in pipeline order: a fused call where it has one."""
        stages = [stage.name for stage in stages_for_ratio(ratio)]
        calls, covered = [], set()
        for stage in stages:
            if stage in covered:
                continue
            group = next((name for name, members in GROUPS.items() if members[0] == stage
                          and set(members) <= set(stages) and name in self.methods), None)
            members = GROUPS[group] if group else (stage,) if stage in self.methods else ()
            if members:
                calls.append(ProviderCall(group or stage, members))
                covered.update(members)
        return tuple(calls)

    def lacks(self, ratio: int) -> frozenset[str]:
        """The stages of a step of this ratio the provider does not compute (they run on the host oracle)."""
        provided = {stage for call in self.calls(ratio) for stage in call.stages}
        return frozenset(stage.name for stage in stages_for_ratio(ratio) if stage.name not in provided)

    def describe(self) -> dict:
        """The provider as the run's provenance records it (the results document's ``kernels.kernels``)."""
        files = {}
        if self.path is not None and self.path.is_file():
            files[self.path.name] = hashlib.sha256(self.path.read_bytes()).hexdigest()
        lacking = sorted(self.lacks(4) | self.lacks(128), key=STAGE_NAMES.index)
        return {"path": self.spec, "builtin": False, "files": files,
                "provider": {"name": self.name, "version": self.version, "device": self.device,
                             "methods": list(self.methods), "host_stages": lacking}}

    # --- one call ------------------------------------------------------------------------

    def _value(self, site: ProviderSite, stage: str, tensor: str):
        key = f"{stage}/{tensor}"
        if site.isolated and stage in site.reference:
            return site.t.upload(key, site.reference[stage][tensor])
        if key not in site.t:
            site.t.put(key, site.stages[stage][tensor])
        return site.t.device(key)

    def arguments(self, site: ProviderSite, call: ProviderCall) -> dict[str, Any]:
        """What the call reads: the operator inputs of its stages and the payloads it reads from outside it."""
        g = site.g
        values: dict[str, Any] = {}
        for stage in call.stages:
            for name in BY_NAME[stage].inputs:
                if name == "attention_bias":
                    values[name] = site.t.upload("attention_bias/broadcast", attention_bias(
                        site.t.host(name), (g.batch, g.heads, g.sequence, g.candidate_count))) if g.has_bias else None
                else:
                    values[name] = site.t.device(name)
            for upstream, tensor in UPSTREAM[stage]:
                if upstream in call.stages or upstream not in {s.name for s in stages_for_ratio(g.ratio)}:
                    continue
                values[tensor] = self._value(site, upstream, tensor)
                for (owner, decoded), cache in DECODED_PAYLOADS.items():
                    if (owner, cache) == (upstream, tensor):
                        values[decoded] = self._value(site, owner, decoded)
        convert = getattr(self.object, "from_dlpack", None)
        if callable(convert):
            values = {name: None if value is None else convert(value) for name, value in values.items()}
        return values

    def run(self, site: ProviderSite, call: ProviderCall) -> None:
        method = getattr(self.object, call.module)
        arguments = self.arguments(site, call)
        arguments["geometry"] = site.g
        accepted = _accepted(method, arguments)
        if _names_probe(method):
            accepted["probe"] = None
        if isinstance(site.probes, ProbeCalls):
            log = ProvidedProbes(call.module, call.stages, accepts="probe" in accepted)
            site.probes.logs.append(log)
            if log.accepts:
                accepted["probe"] = self._probe(log)
        first = self._payloads(site, call, method, accepted)
        if self.recording:
            if self.recorded and (self.recorded[-1].case, self.recorded[-1].step) != (site.case, site.step):
                self.recorded = []
            self.recorded.append(RecordedCall(site.case, site.step, call, lambda: method(**accepted), first))
        if site.repeat > 1:
            again = [self._payloads(site, call, method, accepted) for _ in range(1, site.repeat)]
            site.findings += _differing(first, again, call, self.name)
        for stage in call.stages:
            if not site.on_device(stage):
                continue
            site.stages[stage] = {tensor: self.transfer.download(value) for tensor, value in first[stage].items()}
            for tensor, value in first[stage].items():
                site.t.put(f"{stage}/{tensor}", value)
            for output in site.g.output_names if stage == WRITEBACK.name else BY_NAME[stage].outputs:
                site.t.put(output, first[stage][output])
        site.record(LaunchRecord(PROVIDER_PATH, call.stages, module=self.name, entry=call.module))

    def _probe(self, log: ProvidedProbes) -> Callable[[str, Any], None]:
        """The ``probe(name, array)`` a call of a probed run is handed: it keeps a host copy of each
        intermediate (the provider may reuse its buffer after the call) and never raises into the provider,
        so probing cannot make a verdict."""
        where = f"{self.name}.{log.call}"

        def probe(name: str, array: Any) -> None:
            if not isinstance(name, str):
                log.defects.append(f"{where} called probe with the name {name!r}, not a string")
                return
            if name in log.arrays:
                log.defects.append(f"{where} called probe({name!r}) more than once (one call holds the whole "
                                   "intermediate; the first is kept)")
                return
            try:
                log.arrays[name] = np.array(self.transfer.download(adopt(array, f"{where}'s probe {name!r}")),
                                            copy=True)
            except Exception as error:  # noqa: BLE001 - the provider's array: its defect, said in the explanation
                log.defects.append(str(error) if isinstance(error, TypeError) else
                                   f"{where}'s probe {name!r} cannot be read: {type(error).__name__}: {error}")

        return probe

    def _payloads(self, site: ProviderSite, call: ProviderCall, method: Callable, arguments: dict) -> dict:
        stage = call.stages[0]
        where = f"{self.name}.{call.module}"
        try:
            returned = method(**arguments)
        except Exception as error:  # noqa: BLE001 - the implementation under test failed: its verdict
            raise ProviderStageFailed(stage, f"{where} raised {type(error).__name__}: {error}") from None
        if not isinstance(returned, Mapping):
            raise ProviderStageFailed(stage, f"{where} returned a {type(returned).__name__}, not a mapping of "
                                             "tensor names to arrays")
        payloads: dict[str, dict] = {}
        for member in call.stages:
            tensors = list(site.g.output_names) if member == WRITEBACK.name else [
                payload.tensor for payload in BY_NAME[member].writes]
            absent = [tensor for tensor in tensors if tensor not in returned]
            if absent:
                raise ProviderStageFailed(member, f"{where} returned no {', '.join(absent)} for {member}")
            try:
                payloads[member] = {tensor: adopt(returned[tensor], f"{where}'s {tensor}")
                                    for tensor in tensors}
            except TypeError as error:
                raise ProviderStageFailed(member, str(error)) from None
        return payloads



def _accepted(method: Callable, arguments: dict[str, Any]) -> dict[str, Any]:
    """The arguments the method's signature names (all of them when it takes ``**kwargs``)."""
    try:
        parameters = inspect.signature(method).parameters
    except (TypeError, ValueError):
        return arguments
    if any(parameter.kind is inspect.Parameter.VAR_KEYWORD for parameter in parameters.values()):
        return arguments
    return {name: value for name, value in arguments.items() if name in parameters}


def _names_probe(method: Callable) -> bool:
    """Whether the method's signature names ``probe`` (never handed through ``**kwargs``: those take inputs)."""
    try:
        parameter = inspect.signature(method).parameters.get("probe")
    except (TypeError, ValueError):
        return False
    return parameter is not None and parameter.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                                        inspect.Parameter.KEYWORD_ONLY)


def _differing(first: dict, again: list[dict], call: ProviderCall, name: str) -> list[Nondeterminism]:
    """A Nondeterminism per returned tensor whose bits differ between the first call and any later one."""
    found = []
    tensors = [(stage, tensor) for stage in first for tensor in first[stage]]
    runs = len(again) + 1
    for index, (stage, tensor) in enumerate(tensors):
        one = _host(first[stage][tensor])
        bits = unsigned(one).reshape(-1)
        differing = []
        for run, payloads in enumerate(again, start=2):
            other = _host(payloads[stage][tensor])
            if other.shape != one.shape or other.dtype != one.dtype:
                differing.append((run, 0, f"{one.dtype}{list(one.shape)}", f"{other.dtype}{list(other.shape)}"))
                continue
            where = np.flatnonzero(unsigned(other).reshape(-1) != bits)
            if where.size:
                element, width = int(where[0]), one.dtype.itemsize * 2
                differing.append((run, element, f"0x{int(bits[element]):0{width}x}",
                                  f"0x{int(unsigned(other).reshape(-1)[element]):0{width}x}"))
        if differing:
            run, element, first_bits, other_bits = differing[0]
            coords = tuple(int(i) for i in np.unravel_index(element, one.shape)) if one.size else ()
            found.append(Nondeterminism(call.module, name, call.stages, index, tensor, runs, len(differing), run,
                                        element, coords, first_bits, other_bits))
    return found


def _host(array) -> np.ndarray:
    if isinstance(array, np.ndarray):
        return array
    import cupy

    return cupy.asnumpy(array)


def load_provider(spec: str) -> Provider:
    return Provider(spec)


__all__ = ["GROUPS", "PREFIX", "PROVIDER_PATH", "ProbeCalls", "ProvidedProbes", "Provider", "ProviderCall",
           "ProviderStageFailed", "StageProvider", "Transfer", "UPSTREAM", "adopt", "is_provider", "load_provider"]
