"""A case as a stream of steps: its index, built and checked before any of its data is read.

Indexing a case checks its layout, its case digest, the windows its steps
take of the kv history and the declared size of every tensor against the
case's geometry; reading then only has to check each array's sha256.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import h5py
import numpy as np

from csa_conform.contract import INPUT_NAMES
from csa_conform.contract.attributes import FLOAT_ATTRIBUTES
from csa_conform.errors import GoldenFormatError, GoldenIntegrityError
from csa_conform.golden.carries import CARRY_WIDTH_SOURCE, carries_of, cleared_shape
from csa_conform.golden.digest import case_digest
from csa_conform.golden.layout import CASE_DIGEST, KV_HISTORY, STEP_GROUPS, WINDOW, CaseInfo, TensorEntry
from csa_conform.golden.validation import CheckedFile

MAX_BATCH = 1 << 10
MAX_ROWS = 1 << 24
INT64_BOUND = 2.0**63
_INPUT_RANK = {name: rank for rank, name in enumerate(INPUT_NAMES)}


@dataclass
class StepIndex:
    name: str
    expect_error: str | None
    window: tuple[int, int] | None
    # step-relative path -> (entry, dataset or None for the current_kv window)
    tensors: dict[str, tuple[TensorEntry, h5py.Dataset | None]]
    stages: tuple[str, ...]
    # carries the step omits (it starts at position 0), by name: the cleared carry's shape
    cleared: dict[str, tuple[int, ...]] = field(default_factory=dict)


@dataclass
class CaseIndex:
    info: CaseInfo
    history: tuple[TensorEntry, h5py.Dataset] | None
    steps: list[StepIndex]
    history_rows: np.ndarray | None = None



class CaseIndexer:
    """Builds the index of a case of one open file of one schema version."""

    def __init__(self, file: CheckedFile, schema_version: int):
        self.file = file
        self.schema_version = schema_version

    def index_case(self, case_id: str, where: str) -> CaseIndex:
        group = self.file.member(self.file.handle["cases"], case_id, h5py.Group)
        attrs = self.file.json_attr(group, "attrs_json", where, non_finite=True)
        if not isinstance(attrs, dict) or not all(
            isinstance(value, (int, float, str)) for value in attrs.values()
        ):
            raise GoldenFormatError(f"{self.file.path}: {where}: attrs_json must be an object of numbers and strings")
        for key, value in attrs.items():
            # Every node attribute but the float ones is an int64: 1e30 there is no integer it could read as.
            if isinstance(value, float) and key not in FLOAT_ATTRIBUTES and not abs(value) < INT64_BOUND:
                raise GoldenFormatError(f"{self.file.path}: {where}: attrs_json: attribute {key} = {value!r} "
                                        "is outside int64")
        output_names = self.file.json_attr(group, "output_names_json", where)
        if not isinstance(output_names, list) or not all(isinstance(name, str) for name in output_names):
            raise GoldenFormatError(f"{self.file.path}: {where}: output_names_json must be a list of strings")
        family = self.file.text_attr(group, "family", where) or ""
        description = self.file.text_attr(group, "description", where) or ""
        seed = group.attrs.get("seed")
        if seed is not None:
            if not isinstance(seed, np.integer) or isinstance(seed, np.bool_):
                raise GoldenFormatError(f"{self.file.path}: {where}: attribute seed is not an integer")
            seed = int(seed)
        members = set(self.file.member_names(group)) - {"steps", KV_HISTORY}
        if members:
            raise GoldenFormatError(f"{self.file.path}: {where}: unexpected member {sorted(members)[0]!r}")
        history = None
        if KV_HISTORY in group:
            dataset = self.file.member(group, KV_HISTORY, h5py.Dataset)
            history = (self.file.entry(dataset, KV_HISTORY), dataset)
        steps = [self.index_step(node, history) for node in self.step_groups(group, case_id)]
        if self.schema_version >= 2:
            stored = self.file.digest_attr(group, CASE_DIGEST, where)
            computed = case_digest(
                case_id, attrs, output_names, family, seed, description,
                None if history is None else history[0],
                [(step.expect_error, step.window, [entry for entry, dataset in step.tensors.values()
                                                   if dataset is not None]) for step in steps],
            )
            if computed != stored:
                raise GoldenIntegrityError(
                    self.file.path, f"case {where}",
                    f"{CASE_DIGEST} mismatch (stored {stored}, computed {computed}): "
                    "its attributes, tensor list, shapes, dtypes or checksums changed",
                )
        index = CaseIndex(
            CaseInfo(
                case_id=case_id,
                attrs=attrs,
                output_names=tuple(output_names),
                family=family,
                seed=seed,
                description=description,
                step_count=len(steps),
                errors=tuple(i for i, step in enumerate(steps) if step.expect_error is not None),
            ),
            history,
            steps,
        )
        self.check_geometry(index, where)
        for step in steps:
            self.omitted_carries(step, attrs, where)
        return index

    def omitted_carries(self, step: StepIndex, attrs: dict, where: str) -> None:
        """Record the carries an accepted step omits, refusing the omission unless it starts at position 0.

        A rejected step keeps what it lacks: a missing input may be what the reference rejects.
        """
        missing = [name for name in carries_of(attrs) if f"inputs/{name}" not in step.tensors]
        if not missing or step.expect_error is not None:
            return
        total, query = step.tensors.get("inputs/total_sequence_length"), step.tensors.get("inputs/query")
        start = None
        if total is not None and total[0].shape == () and total[0].dtype.kind in "iu" and query is not None \
                and query[0].ndim >= 2:
            start = int(self.file.read(*total)) - query[0].shape[1]
        for name in missing:
            source = step.tensors.get(f"inputs/{CARRY_WIDTH_SOURCE[name]}")
            shape = None if source is None else cleared_shape(name, attrs["compression_ratio"], source[0].shape)
            if start != 0 or shape is None:
                reason = (f"the step starts at position {start}, not 0" if start is not None and start != 0 else
                          "its first position cannot be read" if start is None else
                          f"it has no [B, S, width] inputs/{CARRY_WIDTH_SOURCE[name]} to give the cleared carry's shape")
                raise GoldenFormatError(
                    f"{self.file.path}: {where}/steps/{step.name}: inputs/{name} is omitted, but {reason} "
                    "(only a step that starts at position 0 may omit its carries)"
                )
            step.cleared[name] = shape

    def step_groups(self, group: h5py.Group, case_id: str) -> list[h5py.Group]:
        steps = self.file.require_group(group, "steps")
        names = sorted(self.file.member_names(steps))
        if not names:
            raise GoldenFormatError(f"{self.file.path}: case {case_id!r} has no steps")
        if names != [f"{index:04d}" for index in range(len(names))]:
            raise GoldenFormatError(
                f"{self.file.path}: case {case_id!r} steps must be named 0000, 0001, ...; got {names[:4]}"
            )
        return [self.file.member(steps, name, h5py.Group, checked=True) for name in names]

    def index_step(self, node: h5py.Group, history) -> StepIndex:
        where = node.name
        expect_error = self.file.text_attr(node, "expect_error", where)
        members = self.file.member_names(node)
        unexpected = set(members) - set(STEP_GROUPS)
        if unexpected:
            raise GoldenFormatError(f"{self.file.path}: {where}: unexpected member {sorted(unexpected)[0]!r}")
        if "inputs" not in members:
            raise GoldenFormatError(f"{self.file.path}: {where} has no inputs group")
        if expect_error is None and "outputs" not in members:
            raise GoldenFormatError(f"{self.file.path}: {where} has neither outputs nor expect_error")
        inputs = self.datasets(self.file.member(node, "inputs", h5py.Group), "inputs/")
        window = self.window(node, history, inputs)
        inputs = dict(sorted(inputs.items(), key=input_rank))
        tensors = dict(inputs)
        stages = ()
        if "stages" in members:
            stage_groups = self.file.member(node, "stages", h5py.Group)
            stages = tuple(self.file.member_names(stage_groups))
            for stage in stages:
                tensors.update(self.datasets(self.file.member(stage_groups, stage, h5py.Group), f"stages/{stage}/"))
        if "outputs" in members:
            tensors.update(self.datasets(self.file.member(node, "outputs", h5py.Group), "outputs/"))
        return StepIndex(node.name.rsplit("/", 1)[1], expect_error, window, tensors, stages)

    def window(self, node: h5py.Group, history, inputs: dict) -> tuple[int, int] | None:
        if WINDOW not in node.attrs:
            return None
        where = node.name
        rows = node.attrs[WINDOW]
        if self.schema_version < 2 or history is None or "inputs/current_kv" in inputs:
            raise GoldenFormatError(
                f"{self.file.path}: {where}: {WINDOW} needs schema_version 2, a kv_history and no inputs/current_kv"
            )
        if not isinstance(rows, np.ndarray) or rows.shape != (2,) or rows.dtype.kind not in "iu":
            raise GoldenFormatError(f"{self.file.path}: {where}: {WINDOW} must be two integers")
        start, stop = int(rows[0]), int(rows[1])
        entry = history[0]
        if entry.ndim != 3 or not 0 <= start < stop <= entry.shape[1]:
            raise GoldenFormatError(
                f"{self.file.path}: {where}: {WINDOW} [{start}, {stop}] is not a window of kv_history {entry.shape}"
            )
        shape = (entry.shape[0], stop - start, entry.shape[2])
        inputs["inputs/current_kv"] = (TensorEntry("inputs/current_kv", entry.dtype, shape, None), None)
        return (start, stop)

    def datasets(self, group: h5py.Group, prefix: str) -> dict[str, tuple[TensorEntry, h5py.Dataset]]:
        found = {}
        for name in self.file.member_names(group):
            dataset = self.file.member(group, name, h5py.Dataset, checked=True)
            found[prefix + name] = (self.file.entry(dataset, prefix + name), dataset)
        return found

    def check_geometry(self, index: CaseIndex, where: str) -> None:
        """Refuse tensors larger than the case's geometry can make, before reading any.

        A step's tensors are bounded by batch B (seqlens_k's length), the rows
        T the stream has reached (total_sequence_length), the heads of the
        node attributes and the widest row the contract has (2 x 512 floats).
        """
        attrs = index.info.attrs
        heads = max(positive_count(attrs.get("num_heads")), positive_count(attrs.get("index_num_heads")))
        largest_rows = 0
        for step in index.steps:
            batch, rows = 1, 0
            seqlens = step.tensors.get("inputs/seqlens_k")
            if seqlens is not None and seqlens[0].ndim == 1:
                batch = min(max(seqlens[0].shape[0], 1), MAX_BATCH)
            total = step.tensors.get("inputs/total_sequence_length")
            if total is not None and total[0].shape == () and total[0].dtype.kind in "iu":
                rows = min(max(int(self.file.read(*total)), 0), MAX_ROWS)
            largest_rows = max(largest_rows, rows)
            limit = tensor_limit(batch, rows, heads)
            for entry, dataset in step.tensors.values():
                if entry.nbytes > limit:
                    raise GoldenFormatError(
                        f"{self.file.path}: {where}/steps/{step.name}/{entry.path} declares shape {entry.shape} "
                        f"({entry.nbytes} bytes), more than the case's geometry allows ({limit} bytes)"
                    )
        if index.history is not None:
            entry = index.history[0]
            limit = tensor_limit(MAX_BATCH, largest_rows, 1)
            if entry.nbytes > limit:
                raise GoldenFormatError(
                    f"{self.file.path}: {where}/{KV_HISTORY} declares shape {entry.shape}, more than the "
                    f"case's geometry allows ({limit} bytes)"
                )


def tensor_limit(batch: int, rows: int, heads: int) -> int:
    """Bytes a tensor of a step can need: B x H x R x (R + 2048) x 8 with R = T + 1024 rows, plus carries."""
    rows += 1024
    return 8 * batch * heads * rows * (rows + 2048) + (4 << 20) * batch


def positive_count(value) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 < value <= MAX_BATCH else 1


def input_rank(member: tuple[str, object]) -> int:
    return _INPUT_RANK.get(member[0].rpartition("/")[2], len(_INPUT_RANK))

