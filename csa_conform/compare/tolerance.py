"""Calibrated tolerances: an envelope per stage and tensor, measured from the official numerics' gap.

``calibrate`` measures the gap between the reference and the official
profile (csa_conform.check.gap, isolated by default) over one or more golden files
and writes, per stage and tensor, limits on the statistics a device run is
later held to (``diff --tolerance``):

- a tensor both profiles produce bit for bit everywhere gets ``exact = true``:
  inside the envelope means bit-exact;
- a float tensor: ``abs.max``, ``abs.p99`` and ``cosine_distance_max`` at
  MARGIN times the measured value, and ``neginf_mask_mismatches = 0`` (the
  -inf masks must agree exactly). Relative error is reported, not bounded:
  its tail is set by elements whose reference value is near zero and moves
  between subsets of a suite by more than any sensible margin;
- an index tensor: the share of rows whose set differs and ``1 - overlap_min``
  at MARGIN times the measured value (at most 1);
- a byte tensor (packed records): the share of differing bytes at MARGIN times.

The statistic is the suite-wide one (over every compared element of the
files), measured the same way on the device run, so the device is within the
envelope when each of its statistics is at most the limit. A stage/tensor the
file does not list must be bit-exact. Bit equality stays the default gate of
``diff``; the envelope is a second verdict next to it.

The file is a small TOML subset this module writes itself: a ``[calibration]``
table of strings, numbers and a list of strings, then one table per
``"stage/tensor"`` holding ``exact`` and the limits as numbers. It is read
with ``tomllib`` (``tomli`` on Python 3.10).
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

from csa_conform.compare.errorstats import MODES, Gap, TensorErrors
from csa_conform.errors import UsageError
from csa_conform.profiles.numerics import REFERENCE

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

MARGIN = 2.0
FLOAT_BOUNDS = ("abs.max", "abs.p99", "cosine_distance_max", "neginf_mask_mismatches")
INDEX_BOUNDS = ("rows_differing", "overlap_deficit")
BYTE_BOUNDS = ("bytes_differing",)
FORMAT = "csa-conform-tolerances"


def statistic(entry: dict, name: str) -> float:
    """One named statistic of a TensorErrors entry (errorstats)."""
    if "." in name:
        measure, stat = name.split(".", 1)
        return float(entry[measure][stat])
    if name in ("cosine_distance_max", "neginf_mask_mismatches"):
        return float(entry[name])
    if name == "rows_differing":
        sets = entry["sets"]
        return 0.0 if sets["rows"] == 0 else 1 - sets["rows_identical"] / sets["rows"]
    if name == "overlap_deficit":
        return 1 - float(entry["sets"]["overlap_min"])
    if name == "bytes_differing":
        return 0.0 if entry["elements"] == 0 else 1 - entry["identical"] / entry["elements"]
    raise KeyError(name)


def bound_names(kind: str) -> tuple[str, ...]:
    return {"float": FLOAT_BOUNDS, "index": INDEX_BOUNDS, "bytes": BYTE_BOUNDS}.get(kind, ())


@dataclass
class Tolerances:
    """Per "stage/tensor": {"exact": bool, limit name: number}; ``calibration`` says how they were made."""

    limits: dict = field(default_factory=dict)
    calibration: dict = field(default_factory=dict)

    @classmethod
    def calibrated(cls, gap: Gap, files: list[str], margin: float = MARGIN) -> Tolerances:
        limits = {}
        for errors in gap.rows():
            entry = errors.entry()
            key = f"{errors.stage}/{errors.tensor}"
            exact = entry["steps"] == entry["steps_identical"]
            limits[key] = {"exact": exact}
            if not exact:
                for name in bound_names(entry["kind"]):
                    value = margin * statistic(entry, name)
                    if name in ("neginf_mask_mismatches",):
                        value = 0.0
                    if name in INDEX_BOUNDS or name in BYTE_BOUNDS:
                        value = min(1.0, value)
                    limits[key][name] = value
        calibration = {
            "format": FORMAT, "expected_profile": gap.expected, "actual_profile": gap.actual, "mode": gap.mode,
            "margin": margin, "steps": gap.compared, "files": [str(path) for path in files],
        }
        return cls(limits, calibration)

    def to_toml(self) -> str:
        lines = ["# csa-conform tolerances (csa-conform calibrate; specs/official-profile.md)", "[calibration]"]
        for key, value in self.calibration.items():
            lines.append(f"{key} = {_toml_value(value)}")
        for key, limits in self.limits.items():
            lines += ["", f'["{key}"]']
            lines += [f"{_toml_key(name)} = {_toml_value(value)}" for name, value in limits.items()]
        return "\n".join(lines) + "\n"

    @classmethod
    def read(cls, path: str | Path) -> Tolerances:
        try:
            document = tomllib.loads(Path(path).read_text())
        except (OSError, UnicodeDecodeError) as error:
            raise UsageError(f"{path}: cannot read the tolerance file ({error})") from None
        except tomllib.TOMLDecodeError as error:
            raise UsageError(f"{path}: not a tolerance file: {error}") from None
        calibration = document.pop("calibration", None)
        if not isinstance(calibration, dict) or calibration.get("format") != FORMAT:
            raise UsageError(f"{path}: not a tolerance file: no [calibration] table with format = \"{FORMAT}\"")
        for key, limits in document.items():
            if "/" not in key or not isinstance(limits, dict) or not isinstance(limits.get("exact"), bool):
                raise UsageError(f"{path}: table [{key!r}] is not a \"stage/tensor\" table with exact = true|false")
            for name, value in limits.items():
                if name != "exact" and (not isinstance(value, (int, float)) or isinstance(value, bool)
                                        or not math.isfinite(value) or value < 0):
                    raise UsageError(f"{path}: [{key!r}] {name} must be a finite number >= 0, not {value!r}")
        if calibration.get("mode") not in MODES:
            raise UsageError(f"{path}: [calibration] mode must be one of {', '.join(MODES)}, "
                             f"not {calibration.get('mode')!r}")
        return cls(document, calibration)

    def run_mode(self, path: str, mode: str | None) -> str:
        """The mode a run judged by this envelope runs in: the one it was measured in. A statistic of one mode
        means nothing in the other (chained, a selection that differs upstream moves Y by whole candidates), so
        an explicit other ``mode`` is refused rather than judged."""
        calibrated = self.calibration["mode"]
        if mode is not None and mode != calibrated:
            raise UsageError(f"--mode {mode}: {path} was calibrated {calibrated}, and its limits hold only for "
                             f"{calibrated} runs; leave out --mode, or calibrate with --mode {mode}")
        return calibrated

    def judge_run(self, path: str, measured: list[Gap | None]) -> dict:
        """A run's dual verdict per stage and tensor (bit-exact, and within this envelope), from the error
        statistics its cases gathered (``path`` is this file's, as the results document names it)."""
        total = Gap(REFERENCE, "device")
        for gap in measured:
            if gap is not None:
                total.merge(gap)
        verdicts = [self.judge(errors) for errors in total.rows()]
        return {"file": path, "within": all(verdict["within"] for verdict in verdicts), "stages": verdicts}

    def judge(self, errors: TensorErrors) -> dict:
        """The dual verdict of one stage/tensor of a device run: bit-exact, and within the envelope."""
        entry = errors.entry()
        bit_exact = entry["steps"] == entry["steps_identical"]
        limits = self.limits.get(f"{errors.stage}/{errors.tensor}", {"exact": True})
        bounds = []
        if limits["exact"]:
            bounds.append({"statistic": "bit-exact", "limit": 0.0, "measured": float(entry["elements"] - entry["identical"]),
                           "within": bit_exact})
        else:
            for name, limit in limits.items():
                if name == "exact":
                    continue
                measured = statistic(entry, name)
                bounds.append({"statistic": name, "limit": float(limit), "measured": measured,
                               "within": measured <= limit})
        return {
            "stage": errors.stage, "tensor": errors.tensor, "bit_exact": bit_exact,
            "within": all(bound["within"] for bound in bounds), "bounds": bounds, "errors": entry,
        }


def _toml_key(name: str) -> str:
    return f'"{name}"' if "." in name else name


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(float(value)) if isinstance(value, float) else str(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(item) for item in value) + "]"
    text = str(value).replace("\\", "\\\\").replace('"', '\\"')
    return f'"{text}"'
