"""The numeric search: trials screened on attention's differing query rows and confirmed on the whole
stage, and the stated cap on the combinations tried (reported in the document when hit)."""

from __future__ import annotations

import jsonschema
import numpy as np
import pytest

import csa_conform.explain.search as explain_search
from csa_conform.check.results import schema
from csa_conform.explain import EXPLAINED, UNEXPLAINED
from csa_conform.explain.rounded_libm import correctly_rounded
from csa_conform.explain.rows import differing_rows
from csa_conform.explain.stages import run_stage
from csa_conform.numerics.variant import Numerics

from ci_steps import explain_payload, first_step

ATTENTION = "sparse_sink_softmax_attention"


def _rounded_expf_rows(g, inputs, expected, rows):
    """The attention payload with expf correctly rounded in `rows` only, the reference's elsewhere."""
    rounded = run_stage(ATTENTION, g, inputs, expected, Numerics({"expf": correctly_rounded("expf")}))
    payload = {name: np.array(array, copy=True) for name, array in expected[ATTENTION].items()}
    for name in payload:
        payload[name][:, rows] = rounded[name][:, rows]
    return rounded, payload


def test_attention_trials_run_on_the_differing_rows_and_the_cause_on_the_whole_stage():
    g, inputs, expected = first_step("boundaries.r4-prefill-7")
    rounded, _ = _rounded_expf_rows(g, inputs, expected, slice(None))
    rows = differing_rows(rounded, expected[ATTENTION])
    assert 0 < rows.size <= g.sequence // 2, "the case must have rows the hypothesis leaves alone"
    explanation = explain_payload(ATTENTION, g, inputs, expected, rounded)
    assert explanation.verdict == EXPLAINED and explanation.cause.key == "expf:correctly-rounded"
    # no softmax denominator of this step rounds otherwise: the P·V weights' expf alone is an equal variant
    assert [trial.key for trial in explanation.rivals] == ["expf:correctly-rounded", "weights-expf:correctly-rounded"]
    assert explanation.search["screened_rows"] == rows.size
    whole = sum(np.asarray(array).size for array in expected[ATTENTION].values())
    assert all(trial.elements == whole for trial in explanation.rivals)
    # only a trial that reproduces the screened rows is re-run on the whole stage
    measured = [trial for trial in explanation.trials if not trial.rejected]
    screened = {trial.elements for trial in measured} - {whole}
    assert len(screened) == 1 and screened.pop() < whole


def test_a_hypothesis_that_reproduces_only_the_screened_rows_is_no_cause():
    """The device rounds expf correctly in one differing row only: screened on that row the hypothesis
    reproduces, but re-run on the whole stage it changes rows the device computed the reference's way."""
    g, inputs, expected = first_step("boundaries.r128-resumed-119-chunks")
    rounded, _ = _rounded_expf_rows(g, inputs, expected, slice(None))
    rows = differing_rows(rounded, expected[ATTENTION])
    assert rows.size >= 2
    _, payload = _rounded_expf_rows(g, inputs, expected, rows[:1])
    explanation = explain_payload(ATTENTION, g, inputs, expected, payload)
    assert explanation.search["screened_rows"] == 1
    assert explanation.verdict == UNEXPLAINED and explanation.cause is None
    single = next(trial for trial in explanation.trials if trial.key == "expf:correctly-rounded")
    assert single.mismatches > 0 and single.elements == sum(a.size for a in expected[ATTENTION].values())


def test_a_trial_closer_on_the_screened_rows_only_is_not_called_closest():
    """Screened on the one differing row, expf correctly rounded leaves one flipped bit; on the whole stage it
    also changes the rows the device computed the reference's way, more elements than the device's own
    divergence: it brings nothing closer, and the headline does not say it does."""
    g, inputs, expected = first_step("boundaries.r128-resumed-119-chunks")
    rounded, _ = _rounded_expf_rows(g, inputs, expected, slice(None))
    rows = differing_rows(rounded, expected[ATTENTION])
    _, payload = _rounded_expf_rows(g, inputs, expected, rows[:1])
    y = payload["Y"][:, rows[0]].reshape(-1)
    y[np.flatnonzero(y.view(np.uint32) != expected[ATTENTION]["Y"][:, rows[0]].reshape(-1).view(np.uint32))[0]] *= 2
    payload["Y"][:, rows[0]] = y.reshape(payload["Y"][:, rows[0]].shape)
    explanation = explain_payload(ATTENTION, g, inputs, expected, payload)
    single = next(trial for trial in explanation.trials if trial.key == "expf:correctly-rounded")
    assert explanation.search["screened_rows"] == 1 and single.mismatches < explanation.baseline
    assert explanation.verdict == UNEXPLAINED and explanation.closest is None
    assert "closest:" not in explanation.headline()


def test_the_combination_search_stops_at_its_cap_and_says_so(monkeypatch):
    """A record byte no ingredient produces and no single comes closer to: the stalled cap stops it."""
    g, inputs, expected = first_step("boundaries.r4-prefill-8")
    stage = "compression_update"
    payload = {name: np.array(array, copy=True) for name, array in expected[stage].items()}
    payload["present_compressed_kv"][0, -1, -1] ^= 0x01  # the last bf16 byte of the RoPE tail
    monkeypatch.setattr(explain_search, "STALLED_CAP", 3)
    explanation = explain_payload(stage, g, inputs, expected, payload)
    search = explanation.search
    assert explanation.verdict == UNEXPLAINED and explanation.closest is None
    assert search["combinations"] == 3 and search["cap"] == 3 and search["capped"] and search["untried"] > 0
    # re-runs of a sub-step or of a reading: neither singles nor combinations
    reruns = ("pool:", "rms:", "bf16:", "codes:", "rope:", "hadamard:", "layout:", "offset:")
    assert len(explanation.trials) - search["singles"] == 3 + sum(
        trial.key.startswith(reruns) for trial in explanation.trials)
    assert any(f"stopped at its cap of 3 combinations ({search['untried']:,} more not tried)" in line
               for line in explanation.lines())
    entry = schema()["properties"]["explain"]["properties"]["explanations"]["items"]
    jsonschema.validate(explanation.to_dict(), dict(entry, **{"$defs": schema()["$defs"]}))


def test_without_the_cap_every_combination_runs(monkeypatch):
    g, inputs, expected = first_step("boundaries.r4-prefill-8")
    stage = "compression_update"
    payload = {name: np.array(array, copy=True) for name, array in expected[stage].items()}
    payload["present_compressed_kv"][0, -1, -1] ^= 0x01
    monkeypatch.setattr(explain_search, "STALLED_CAP", 1000)
    search = explain_payload(stage, g, inputs, expected, payload).search
    assert not search["capped"] and search["untried"] == 0 and search["combinations"] > 3


def test_a_single_that_comes_closer_lifts_the_cap_to_the_full_one():
    """expf correctly rounded fixes every row but one flipped bit: the search may combine further."""
    g, inputs, expected = first_step("boundaries.r128-resumed-119-chunks")
    rounded, payload = _rounded_expf_rows(g, inputs, expected, slice(None))
    payload["Y"].reshape(-1)[np.flatnonzero(
        payload["Y"].reshape(-1).view(np.uint32) != expected[ATTENTION]["Y"].reshape(-1).view(np.uint32))[0]] *= 2
    explanation = explain_payload(ATTENTION, g, inputs, expected, payload)
    assert explanation.verdict == UNEXPLAINED and explanation.closest.key == "expf:correctly-rounded"
    assert explanation.search["cap"] == explain_search.COMBINATION_CAP


@pytest.mark.parametrize("port, key", [({"deferred_normalization": True}, "values:deferred-normalization"),
                                       ({"binary64_logits": True}, "logits:binary64")])
def test_an_attention_ported_as_flash_kernels_do_is_named_by_its_re_run(port, key):
    """The value sum normalized once at the end, or the logit dots carried in binary64."""
    g, inputs, expected = first_step("boundaries.r4-prefill-7")
    ported = run_stage(ATTENTION, g, inputs, expected, Numerics(**port))
    assert differing_rows(ported, expected[ATTENTION]).size
    explanation = explain_payload(ATTENTION, g, inputs, expected, ported)
    assert explanation.verdict == EXPLAINED and explanation.cause.key == key
    assert explanation.cause.confidence == "strong"


def test_a_value_sum_in_binary64_is_named_and_its_tiles_are_variants_of_one_ingredient():
    g, inputs, expected = first_step("boundaries.r4-prefill-7")
    wide = run_stage(ATTENTION, g, inputs, expected, Numerics(binary64_values=0))
    explanation = explain_payload(ATTENTION, g, inputs, expected, wide)
    assert explanation.verdict == EXPLAINED and explanation.cause.key.startswith("values:binary64")
    # no row of this step has more than 64 candidate slots: every tile rounds once, the same payload
    assert g.candidate_count <= 64
    assert {trial.key for trial in explanation.rivals} == {"values:binary64", "values:binary64-tile64",
                                                           "values:binary64-tile128", "values:binary64-tile256"}


def test_an_accumulation_difference_no_variant_makes_is_not_claimed():
    g, inputs, expected = first_step("boundaries.r4-prefill-7")
    payload = {name: np.array(array, copy=True) for name, array in expected[ATTENTION].items()}
    output = payload["Y"].reshape(-1).view(np.uint32)
    output[::97] ^= 1  # the last bit of some outputs, as no accumulation order makes them
    explanation = explain_payload(ATTENTION, g, inputs, expected, payload)
    assert explanation.verdict != EXPLAINED
    assert not any(trial.reproduces for trial in explanation.trials if trial.key.startswith("values:"))


def test_a_binary64_value_sum_rounded_per_tile_is_told_from_one_rounded_once_where_a_row_spans_two_tiles():
    g, inputs, expected = first_step("boundaries.r128-resumed-247-to-257")
    assert g.candidate_count > 128  # the dense slots and the records: a row spans tiles of 64 and of 128
    tiled = run_stage(ATTENTION, g, inputs, expected, Numerics(binary64_values=64))
    once = run_stage(ATTENTION, g, inputs, expected, Numerics(binary64_values=0))
    assert np.asarray(tiled["Y"]).tobytes() != np.asarray(once["Y"]).tobytes()
    explanation = explain_payload(ATTENTION, g, inputs, expected, tiled)
    assert explanation.verdict == EXPLAINED and explanation.cause.key == "values:binary64-tile64"
    assert [trial.key for trial in explanation.rivals] == ["values:binary64-tile64"]


def test_a_fit_that_looks_structural_does_not_end_the_numeric_search():
    """Flush-to-zero in a query row of tiny values keeps the row's energy and breaks its inverse Hadamard, which
    the sub-step fit reads as another orthogonal transform: the numeric search still runs and names it."""
    g, inputs, expected = first_step("edges.r4-ties-b1n2-i5")
    stage = "index_query_finalize"
    flushed = run_stage(stage, g, inputs, expected, Numerics(ftz=True))
    explanation = explain_payload(stage, g, inputs, expected, flushed)
    fit = next(finding for finding in explanation.diagnosis if finding.kind == "sub-step")
    assert fit.evidence["rule"] == "orthogonal" and fit.evidence["structural"]
    assert explanation.verdict == EXPLAINED and explanation.cause.key == "ftz", explanation.headline()
