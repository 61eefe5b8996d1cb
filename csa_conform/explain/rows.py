"""Re-running a stage under a hypothesis on only the rows that differ, then confirming on the whole stage.

Attention computes every query row (b, s) from that row's query, candidates
and bias and the step's shared key/value sources, so a hypothesis re-run on
the query rows where the device differs gives those rows' payload bit for
bit (the rows that already match are not recomputed). The numeric search
screens its hypotheses there; a screened trial that reproduces, is rejected
or is reported as the closest is re-run on the whole stage, since a
hypothesis must also leave the matching rows as they are. A stage is
screened only when at most half its rows differ; every other stage runs whole.
"""

from __future__ import annotations

import hashlib
from dataclasses import replace
from typing import Mapping

import numpy as np

from csa_conform.contract import attention_bias
from csa_conform.errors import ContractError
from csa_conform.explain.hypotheses import Hypothesis
from csa_conform.explain.stages import mismatches, run_stage
from csa_conform.explain.trial import Trial
from csa_conform.numerics.bits import differing_bits

ROW_STAGES = ("sparse_sink_softmax_attention",)
SCREENED_SHARE = 0.5  # screen only when at most this share of the rows differ


def differing_rows(target: Mapping[str, np.ndarray], reference: Mapping[str, np.ndarray]) -> np.ndarray:
    """Query rows s (axis 1) where any tensor of the device's payload differs bit for bit."""
    rows = None
    for name, array in target.items():
        mine, theirs = np.asarray(reference[name]), np.asarray(array)
        differ = differing_bits(mine, theirs)
        found = differ.any(axis=tuple(axis for axis in range(differ.ndim) if axis != 1))
        rows = found if rows is None else rows | found
    return np.flatnonzero(rows) if rows is not None else np.zeros(0, dtype=np.int64)


class Rerun:
    """One stage's re-runs under hypotheses: screened on the differing rows when that is sound and smaller."""

    def __init__(self, stage: str, g, inputs, upstream, target, reference: Mapping | None = None):
        self.stage, self.g, self.inputs, self.upstream, self.target = stage, g, inputs, upstream, target
        self.screened: int | None = None  # rows screened, when the trials run on a subset
        self._whole: dict[str, Trial] = {}
        self._hypotheses: dict[str, Hypothesis] = {}
        self._subset = None
        reference = reference if reference is not None else upstream.get(stage)
        if stage in ROW_STAGES and reference is not None and g.sequence > 1:
            rows = differing_rows(target, reference)
            if 0 < rows.size <= SCREENED_SHARE * g.sequence:
                self._subset = self._restricted(rows)
                self.screened = int(rows.size)

    def _restricted(self, rows: np.ndarray):
        g = self.g
        inputs = dict(self.inputs, query=np.ascontiguousarray(self.inputs["query"][:, rows]))
        if g.has_bias:
            full = attention_bias(self.inputs["attention_bias"], (g.batch, g.heads, g.sequence, g.candidate_count))
            inputs["attention_bias"] = np.ascontiguousarray(np.broadcast_to(
                full, (g.batch, g.heads, g.sequence, g.candidate_count))[:, :, rows])
        assembly = dict(self.upstream["candidate_assembly"])
        assembly["candidates"] = np.ascontiguousarray(assembly["candidates"][:, rows])
        upstream = dict(self.upstream, candidate_assembly=assembly)
        target = {name: np.asarray(array)[:, rows] for name, array in self.target.items()}
        return replace(g, sequence=int(rows.size)), inputs, upstream, target

    def _run(self, hypothesis: Hypothesis, g, inputs, upstream, target) -> Trial:
        tallies: dict = {}
        try:
            payload = run_stage(self.stage, g, inputs, upstream, hypothesis.numerics(tallies))
        except ContractError as error:
            return Trial(hypothesis.key, hypothesis.name, -1, 0, rejected=str(error))
        differing, total = mismatches(payload, target)
        changed = {what: (tally.changed, tally.seen) for what, tally in tallies.items()}
        digest = hashlib.sha1()
        for name in target:
            digest.update(np.ascontiguousarray(payload[name]).view(np.uint8).tobytes())
        return Trial(hypothesis.key, hypothesis.name, differing, total, changed, digest=digest.hexdigest())

    def trial(self, hypothesis: Hypothesis) -> Trial:
        """The hypothesis's trial on the screened rows (or on the whole stage when nothing is screened)."""
        self._hypotheses[hypothesis.key] = hypothesis
        if self._subset is None:
            return self._run(hypothesis, self.g, self.inputs, self.upstream, self.target)
        return self._run(hypothesis, *self._subset)

    def whole(self, trial: Trial) -> Trial:
        """The same hypothesis re-run on the whole stage."""
        if self._subset is None:
            return trial
        if trial.key not in self._whole:
            self._whole[trial.key] = self._run(self._hypotheses[trial.key], self.g, self.inputs, self.upstream,
                                               self.target)
        return self._whole[trial.key]

    def confirmed(self, hypothesis: Hypothesis, trial: Trial) -> Trial:
        """A screened trial that reproduces or is rejected, re-run on the whole stage; others as screened."""
        return self.whole(trial) if trial.reproduces or trial.rejected is not None else trial
