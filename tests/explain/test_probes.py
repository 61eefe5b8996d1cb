"""Sub-step probes on the host emulation: a probed build computes the unprobed one's bytes, its probes
equal the oracle's intermediates on the built-in kernels, and a planted bug is located at the sub-step
where it was planted (RMSNorm, the FP8 encoder, the index scorer's ReLU, the softmax probabilities), every
probe before it equal."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from csa_conform.cli import main
from csa_conform.contract import validate_step
from csa_conform.device.kernels import KernelDirectory
from csa_conform.device.probes import (ENTRY_HEADER, LOG_HEADER, ProbeEntry, compressor_units, empty_log, parse,
                                        placed, scored_record_units, softmax_slot_units)
from csa_conform.device.runner import DeviceRunner
from csa_conform.explain.probes import PAYLOAD_FIRST, PROBED, probe_step, probe_text, probed_launches
from csa_conform.golden import GoldenFile
from csa_conform.spec import STAGE_NAMES, Mode

pytestmark = pytest.mark.usefixtures("emulated_cuda")

ROOT = Path(__file__).resolve().parents[2]
CI = ROOT / "goldens" / "ci.h5"
# ratio 4 from position 0 (main and index records, index queries), ratio 128 resumed over two batch rows with
# an f32 cache, ratio 4 resumed with two records a row; SIGNED: ratio 4 whose index dots go negative (4 index
# heads, one query, no record completed)
COMPRESSION = ("compression_update",)
CASES = (("boundaries.r4-prefill-8", 0), ("edges.r128-f32-ties-b2n3", 0), ("boundaries.r4-chunks-3-3-6-2", 2))
SIGNED = "random.r4-i4-k3-signed"


def _plant(tmp_path: Path, old: str, new: str, file: str = "block_quant.cuh") -> KernelDirectory:
    directory = tmp_path / "kernels"
    shutil.copytree(ROOT / "kernels", directory)
    source = directory / file
    text = source.read_text()
    assert text.count(old) == 1, old
    source.write_text(text.replace(old, new))
    return KernelDirectory(directory)


def _step(golden: GoldenFile, case: str, index: int):
    info = golden.case_info(case)
    step = golden.read_step(case, index)
    return info, step, validate_step(info.attrs, step.inputs, info.output_names)


def _observed(kernels: KernelDirectory, case: str, index: int, stages=tuple(PROBED)) -> dict:
    """The probe observations of ``stages`` (only their launches on the device, as explain runs them)."""
    with GoldenFile(CI) as golden:
        info, step, g = _step(golden, case, index)
        host = frozenset(STAGE_NAMES) - probed_launches(g.ratio, stages)
        unprobed = DeviceRunner(kernels, mode=Mode.ISOLATED, force_host=host).run_step(
            info.attrs, step.inputs, info.output_names, reference=step.stages)
        return probe_step(DeviceRunner(kernels, mode=Mode.ISOLATED), info.attrs, info.output_names, step.inputs,
                          step.stages, unprobed.stages, g, list(stages))


@pytest.mark.parametrize(("case", "index"), CASES)
def test_a_probed_build_computes_the_unprobed_bytes_and_the_oracles_intermediates(case, index):
    with GoldenFile(CI) as golden:
        info, step, _ = _step(golden, case, index)
        runs = [DeviceRunner(mode=Mode.ISOLATED, probes=probes).run_step(info.attrs, step.inputs, info.output_names,
                                                                          reference=step.stages)
                for probes in (False, True)]
    plain, probed = runs
    assert not plain.probes and probed.probes
    for stage in STAGE_NAMES:
        for name, array in plain.stages.get(stage, {}).items():
            other = np.asarray(probed.stages[stage][name])
            assert np.asarray(array).tobytes() == other.tobytes(), f"{stage}/{name} moved under -DCSA_PROBES"
    for stage, observation in _observed(KernelDirectory(), case, index).items():
        assert observation["trusted"] and not observation["moved"], observation
        assert observation["first_divergent"] is None, probe_text(observation)
        seen = [probe for probe in observation["probes"] if probe["status"] == "equal"]
        first = [PAYLOAD_FIRST[stage][0]] if stage in PAYLOAD_FIRST else []
        assert [probe["name"] for probe in seen] == first + list(PROBED[stage]), observation
        assert all(probe["elements"] > 0 for probe in seen)


def test_a_bug_planted_in_rmsnorm_is_observed_at_rmsnorm(tmp_path):
    kernels = _plant(tmp_path, "squares / (float)dim + 1.0e-6f", "squares / (float)(dim - 1) + 1.0e-6f")
    observation = _observed(kernels, "boundaries.r4-prefill-8", 0, COMPRESSION)["compression_update"]
    statuses = {probe["name"]: probe["status"] for probe in observation["probes"]}
    assert observation["first_divergent"] == "RMSNorm" and observation["exact"] and observation["trusted"]
    assert observation["unobserved_before"] == []  # the pool is equal: the kv copy it reads did not diverge
    assert statuses["pooled"] == statuses["bf16"] == "equal" and statuses["rmsnorm"] == "differs"
    assert "the first divergent sub-step is RMSNorm — gate + APE scores, pool, bf16 equal; RMSNorm:" in probe_text(
        observation)


def test_a_bug_in_the_kv_copy_into_the_carry_is_located_at_the_pool_or_the_unobserved_copy_before_it(tmp_path):
    """No probe observes the kv rows the compressor copies into its carry; the pool reads them. A pool that
    differs while the gate + APE scores are equal may start there, and the line says so."""
    kernels = _plant(tmp_path, "current[phase * slot_stride + d] = kv[row * width + d];",
                     "current[phase * slot_stride + d] = kv[row * width + (d ^ 1)];")
    observation = _observed(kernels, "boundaries.r4-prefill-8", 0, COMPRESSION)["compression_update"]
    assert observation["first_divergent"] == "pool" and not observation["exact"]
    assert observation["unobserved_before"] == ["the kv rows' copy into the carry"]
    assert "pool (not observed before it: the kv rows' copy into the carry, so it may start there)" in probe_text(
        observation)


def test_a_probe_holding_the_reference_values_elsewhere_before_the_first_divergent_one_is_named_with_it():
    """RoPE's sine and cosine swapped on tied data: the RoPE and Hadamard probes hold the reference's values in other
    places and the FP4 block scale is the first to hold other values; where the values moved may be the first
    wrong sub-step, so the location is not exact and the claim names them."""
    from csa_conform.explain.probes import compared, probe_claim

    ramp = np.arange(4, dtype=np.float32)[None, None]
    reference = {"bf16": ramp, "rope": ramp, "hadamard": ramp, "fp4_scale": np.ones((1, 1, 1), np.float32)}
    device = dict(reference, rope=ramp[..., ::-1].copy(), fp4_scale=np.full((1, 1, 1), 2, np.float32))
    observation = compared("index_query_finalize", reference, {}, ("q",),
                           lambda name: (device[name], ("q",)) if name in device else "not written", "m", [])
    assert observation["first_divergent"] == "FP4 block scale" and not observation["exact"]
    claim = probe_claim(observation)
    assert "FP4 block scale or one before it whose values sit in other places (RoPE) (probes:" in claim.text
    assert not claim.detail["exact"] and "unobserved" not in claim.text


def test_the_first_divergent_probe_carries_the_value_classes_of_its_differences(tmp_path):
    kernels = _plant(tmp_path, "const float weight = csa_expf(score - maximum);", "const float weight = csa_expf(score);")
    observation = _observed(kernels, "edges.r128-f32-far-gates", 0, COMPRESSION)["compression_update"]
    pooled = next(probe for probe in observation["probes"] if probe["name"] == "pooled")
    assert observation["first_divergent"] == "pool" and pooled["status"] == "differs"
    # the gates at +96 overflow exp and those at -112 underflow it: NaN wherever one of them is pooled
    nan = pooled["class_counts"][0]
    assert nan.startswith("pool: ") and "hold NaN where the reference holds a normal value" in nan
    assert "hold NaN where the reference holds a normal value" in probe_text(observation)


def test_a_bug_planted_in_the_fp8_encoder_is_observed_at_its_codes(tmp_path):
    kernels = _plant(tmp_path, "code = ((mbits + 0x7ffffu + ((mbits >> 20) & 1u)) >> 20) - (120u << 3);",
                     "code = (mbits >> 20) - (120u << 3);")
    observation = _observed(kernels, "boundaries.r4-prefill-8", 0, COMPRESSION)["compression_update"]
    statuses = {probe["name"]: probe["status"] for probe in observation["probes"]}
    assert observation["first_divergent"] == "FP8 codes" and observation["exact"]
    assert [statuses[name] for name in ("pool_scores", "pooled", "bf16", "rmsnorm", "rope", "fp8_scale")] == [
        "equal"] * 6
    first = next(probe for probe in observation["probes"] if probe["name"] == "fp8_codes")["first"]
    assert first["device"]["value"] == first["reference"]["value"] - 1  # truncated: one code toward zero


def _statuses(observation: dict) -> dict[str, str]:
    return {probe["name"]: probe["status"] for probe in observation["probes"]}


def test_the_new_probes_compare_what_the_kernel_computes(tmp_path):
    """On the signed case the probed index select and attention compute the unprobed bytes, the index dots go
    negative (so the ReLU probe holds zeros the dots do not) and the attention probabilities are compared over
    every valid slot, not only zeros: each new probe equals the oracle's intermediate."""
    observed = _observed(KernelDirectory(), SIGNED, 0, ("index_scoring", "sparse_sink_softmax_attention"))
    with GoldenFile(CI) as golden:
        _, step, g = _step(golden, SIGNED, 0)
    from csa_conform.explain.probes import oracle_probes

    scoring = oracle_probes("index_scoring", g, step.inputs, step.stages)
    assert (scoring["index_dots"] < 0).any() and (scoring["index_relu"] == 0).sum() > (scoring["index_dots"] == 0).sum()
    attention = oracle_probes("sparse_sink_softmax_attention", g, step.inputs, step.stages)
    assert (attention["softmax_probabilities"] > 0).sum() > g.heads
    for stage in ("index_scoring", "sparse_sink_softmax_attention"):
        assert observed[stage]["trusted"] and not observed[stage]["moved"], observed[stage]
        assert observed[stage]["first_divergent"] is None, probe_text(observed[stage])
        assert set(_statuses(observed[stage]).values()) == {"equal"}


def test_an_index_scorer_without_its_relu_is_observed_at_the_relu(tmp_path):
    kernels = _plant(tmp_path, "const float relu = fmaxf(dot, 0.0f);", "const float relu = dot;",
                     "csa_ratio4_index_select.cu")
    observation = _observed(kernels, SIGNED, 0, ("index_scoring",))["index_scoring"]
    assert observation["trusted"] and observation["first_divergent"] == "index ReLU" and observation["exact"]
    assert _statuses(observation) == {"index_dots": "equal", "index_relu": "differs", "index_score": "differs"}
    first = next(probe for probe in observation["probes"] if probe["name"] == "index_relu")["first"]
    assert set(first["coords"]) == {"b", "s", "record", "i"}
    assert first["reference"]["bits"] == "0x00000000" and float(first["device"]["value"]) < 0
    assert "the first divergent sub-step is index ReLU — index dots equal; index ReLU:" in probe_text(observation)


def test_a_head_loop_run_backwards_moves_the_dots_and_changes_only_the_score(tmp_path):
    """The dots and ReLUs are the reference's values in other calls (not a divergence of theirs); the per-record
    score, summed in the other order, is the first sub-step holding other values."""
    kernels = _plant(tmp_path, "for (int h = 0; h < index_heads; ++h) {", "for (int h = index_heads - 1; h >= 0; --h) {",
                     "csa_ratio4_index_select.cu")
    observation = _observed(kernels, "random.r4-n4-i3-k1", 0, ("index_scoring",))["index_scoring"]
    assert observation["first_divergent"] == "index score"
    assert _statuses(observation) == {"index_dots": "reordered", "index_relu": "reordered", "index_score": "differs"}
    assert "index dots, index ReLU: the reference's values, in other places; index score:" in probe_text(observation)


def test_a_probe_that_saw_other_values_earlier_refutes_a_rearrangement_of_the_bytes(tmp_path):
    """A Hadamard normalized by 1/n: on the tie cases the packed keys happen to fit two halves exchanged, but the
    probes see the Hadamard's own values differ first, so the keys are not the reference's moved."""
    kernels = _plant(tmp_path, "const float normalizer = 1.0f / sqrtf((float)width);",
                     "const float normalizer = 1.0f / (float)width;")
    result = CliRunner().invoke(main, ["diff", str(CI), "--kernels", str(kernels.path), "--backend", "host", "--case",
                                       "edges.r4-ties-b1n1-i4", "--explain", "--json", "-q"])
    assert result.exit_code == 1, result.output
    explanation = next(entry for entry in json.loads(result.stdout)["explain"]["explanations"]
                       if entry["stage"] == "index_key_update" and entry["step"] == 0)
    assert explanation["probe"]["first_divergent"] == "Hadamard"
    assert not {finding["kind"] for finding in explanation["diagnosis"]} & {"permutation", "layout"}
    assert "exchanged" not in explanation["headline"] and "first sub-step whose probed output differs on the device is Hadamard" in (
        explanation["headline"])


def test_a_bug_in_the_softmax_probabilities_is_observed_there(tmp_path):
    """Probabilities over the denominator plus one ulp of it: the logits, maximum and denominator stay the
    reference's, every valid slot's probability moves."""
    kernels = _plant(tmp_path, "const float probability = csa_expf(logit - maximum) / denominator;",
                     "const float probability = csa_expf(logit - maximum) / "
                     "nextafterf(denominator, 2.0f * denominator);")
    observation = _observed(kernels, SIGNED, 0, ("sparse_sink_softmax_attention",))["sparse_sink_softmax_attention"]
    assert observation["trusted"] and observation["exact"]
    assert observation["first_divergent"] == "softmax probabilities", probe_text(observation)
    assert _statuses(observation) == {"logits": "equal", "softmax_max": "equal", "softmax_denominator": "equal",
                                      "softmax_probabilities": "differs"}
    first = next(probe for probe in observation["probes"] if probe["name"] == "softmax_probabilities")["first"]
    assert set(first["coords"]) == {"b", "s", "h", "c"}


def test_probes_of_some_units_are_placed_where_the_kernel_computes_them():
    """Index scoring's records strided over the threads up to each query's causal count, attention's
    probabilities at a row's valid slots a tile at a time; every other unit holds 0, and a missing call is
    said, never filled."""
    def entry(name, block, thread, ordinal, value):
        return ProbeEntry(name, block, thread, ordinal, 1, 4, np.float32(value).tobytes())

    limits = [1, 3]  # one batch row, two queries: records 0 and 0..2
    calls = [entry("index_score", 0, 0, 0, 1.0), entry("index_score", 1, 0, 0, 2.0),
             entry("index_score", 1, 1, 0, 3.0), entry("index_score", 1, 0, 1, 4.0)]
    computed = np.array([[[True, False, False], [True, True, True]]])
    array = placed(calls, scored_record_units(2, limits, 2), (1, 2, 3), np.float32, computed)
    assert array.reshape(2, 3).tolist() == [[1.0, 0.0, 0.0], [2.0, 3.0, 4.0]]
    assert placed(calls[:3], scored_record_units(2, limits, 2), (1, 2, 3), np.float32, computed) == (
        "3 calls for 4 units")
    assert "block 1 thread 0 made 2 calls for 1 units" in placed(
        calls, scored_record_units(2, [1, 1], 2), (1, 2, 3), np.float32, computed)
    valid = np.zeros((1, 1, 1, 5), bool)
    valid[..., [0, 3, 4]] = True
    units = softmax_slot_units(1, 1, 2, valid, tile=2)
    assert units(0, 0) == [(0, 0, 0, 0), (0, 0, 0, 4)] and units(0, 1) == [(0, 0, 0, 3)]


def test_a_probe_that_moves_the_kernels_bytes_is_reported_not_trusted(tmp_path):
    kernels = _plant(tmp_path, '    CSA_PROBE("rmsnorm", record, dim);\n',
                     '    CSA_PROBE("rmsnorm", record, dim);\n#ifdef CSA_PROBES\n    record[0] = 0.0f;\n#endif\n')
    observation = _observed(kernels, "boundaries.r4-prefill-8", 0, COMPRESSION)["compression_update"]
    assert not observation["trusted"] and "compression_update/present_compressed_kv" in observation["moved"]
    assert probe_text(observation).startswith("probes not trusted: the probed build changed the kernel's own bytes")


def _log(calls) -> np.ndarray:
    """A log holding a 2-float "rope" entry per (block, thread, value) call, in that order."""
    log = empty_log(64)
    at = LOG_HEADER
    for block, thread, value in calls:
        words = np.zeros(ENTRY_HEADER + 2, np.uint32)
        words[0] = words.size
        words[1:7] = np.frombuffer(b"rope".ljust(24, b"\0"), np.uint32)
        words[7:11] = (block, thread, 2, 4)
        words[11:] = np.array([value, -value], np.float32).view(np.uint32)
        log[at: at + words.size] = words
        at += words.size
    log[0] = at - LOG_HEADER
    return log


def test_the_log_is_parsed_in_each_threads_order_and_placed_on_the_units():
    log = _log([(1, 0, 10.0), (0, 0, 0.0), (1, 0, 11.0), (0, 0, 1.0)])
    parsed = parse("csa_ratio4_main_compression", log)
    assert [(entry.block, entry.ordinal) for entry in parsed.entries] == [(1, 0), (0, 0), (1, 1), (0, 1)]
    array = placed(parsed.entries, compressor_units(2), (2, 2), np.float32)
    assert array.shape == (2, 2, 1, 2) and array[1, 1, 0].tolist() == [11.0, -11.0]
    assert array[0, 1, 0].tolist() == [1.0, -1.0]
    assert "made 2 calls for 1 units" in placed(parsed.entries, compressor_units(1), (2, 2), np.float32)
    assert "3 calls for 4 units" in placed(parsed.entries[:3], compressor_units(2), (2, 2), np.float32)
    log[0] += 3  # a torn entry at the end is not read
    assert len(parse("m", log).entries) == 4


def test_the_abi_lists_every_probe_the_builtin_kernels_write_and_explain_compares():
    text = (ROOT / "specs" / "kernel-abi.md").read_text().split("| probe | sub-step |", 1)[1].split("\n\n", 1)[0]
    documented = {}
    for row in text.splitlines()[2:]:
        names, _, _, stages = (cell.strip() for cell in row.strip("|").split("|"))
        for name in re.findall(r"`(\w+)`", names):
            documented[name] = set(stages.split(", "))
    compared = {}
    for stage, names in PROBED.items():
        for name in names:
            compared.setdefault(name, set()).add(stage)
    assert documented == compared
    written = set()
    for path in (ROOT / "kernels").iterdir():
        written |= set(re.findall(r'CSA_PROBE\("(\w+)"', path.read_text()))
    assert written == set(compared)


def test_a_log_without_room_drops_entries_and_its_probes_are_not_trusted(monkeypatch):
    import csa_conform.device.runner as runner

    monkeypatch.setattr(runner, "room_for", lambda elements: 600)  # a few entries of the first record
    observation = _observed(KernelDirectory(), "boundaries.r4-prefill-8", 0, COMPRESSION)["compression_update"]
    assert observation["dropped"] > 0 and not observation["trusted"]
    assert probe_text(observation) == (f"probes not trusted: the probe log had no room for {observation['dropped']:,} "
                                       "entries")


def test_probes_that_saw_nothing_say_why_once_per_reason():
    unwritten = {"status": "unobserved", "reason": "the kernel wrote no such probe"}
    observation = {"moved": [], "dropped": 0, "probes": [{"name": "pooled", "sub_step": "pool", **unwritten},
                                                         {"name": "bf16", "sub_step": "bf16", **unwritten}]}
    assert probe_text(observation) == "probes: none observed (pool, bf16: the kernel wrote no such probe)"


def test_the_cuda_backend_finds_the_log_nvcc_and_nvrtc_declare():
    from csa_conform.device.cuda import _declares

    assert _declares(".global .align 8 .u64 csa_probe_log;\n", "csa_probe_log")
    assert _declares("  .visible .global .align 8 .u64 csa_probe_log;\n", "csa_probe_log")
    assert not _declares(".global .align 8 .u64 csa_probe_log_other;\n.reg .u64 %rd<4>;\n", "csa_probe_log")


def test_an_unexplained_divergences_headline_leads_with_the_sub_step_its_probes_observed(tmp_path):
    """The RMSNorm bug through explain itself: the fit's list of sub-steps the bytes were consistent with gives
    way to the probe's observation, and the ablations that made it vanish follow as facts of this step."""
    from click.testing import CliRunner

    from csa_conform.cli import main

    kernels = _plant(tmp_path, "squares / (float)dim + 1.0e-6f", "squares / (float)(dim - 1) + 1.0e-6f")
    result = CliRunner().invoke(main, ["explain", str(CI), "--kernels", str(kernels.path), "--backend", "host",
                                       "--case", "boundaries.r4-prefill-8", "--stage", "compression_update", "-q"])
    assert result.exit_code == 1, result.output
    headline = next(line for line in result.output.splitlines() if "step 0 compression_update" in line)
    assert ": unexplained: sub-step: the first sub-step whose probed output differs on the device is RMSNorm (probes: " in headline
    assert "bf16 before it equal: the divergence arises in RMSNorm or between the two)" in headline
    assert "consistent with" not in headline


def test_scores_the_pool_reads_from_a_carry_never_rotated_may_differ_before_their_probe(tmp_path):
    """The ratio-4 carry left unrotated at a block's end: the next block's pool reads stale slots, so the first
    probe that differs is the gate + APE scores it reads from the carry, though this step computed every score it
    wrote right: the claim names the carry's writes before that probe as where the divergence may start."""
    from csa_conform.explain.probes import probe_claim

    kernels = _plant(tmp_path, "state[i] = state[block_floats + i];", "state[i] = state[i];")
    observation = _observed(kernels, "boundaries.r4-prefill-8", 0, COMPRESSION)["compression_update"]
    assert observation["first_divergent"] == "gate + APE scores" and not observation["exact"]
    assert probe_claim(observation).text.startswith(
        "the first sub-step whose probed output differs on the device is gate + APE scores or an unobserved one before it (the rows' "
        "scores written into the carry, or carried over from the past one) (probes: ")


def test_every_probe_equal_lists_all_that_no_probe_observed_where_the_divergence_arises():
    from csa_conform.explain.probes import AFTER_PROBES, probe_claim

    equal = {"status": "equal", "differing": 0, "elements": 4}
    observation = {"moved": [], "dropped": 0, "after_probes": list(AFTER_PROBES["index_query_finalize"]),
                   "probes": [{"name": "bf16", "sub_step": "bf16", **equal},
                              {"name": "hadamard", "sub_step": "Hadamard", **equal},
                              {"name": "fp4_codes", "sub_step": "FP4 codes", "status": "unobserved",
                               "reason": "the kernel wrote no such probe"}]}
    claim = probe_claim(observation)
    assert claim.text == ("every probed sub-step (bf16, Hadamard) is the reference's bit for bit on the device: the "
                          "divergence arises in what no probe observed (FP4 codes; the FP4 round trip's "
                          "dequantization; the write of transformed)")
    assert probe_text(observation).endswith("the divergence is in what no probe saw (FP4 codes; the FP4 round trip's "
                                            "dequantization; the write of transformed)")


def test_a_fit_whose_sub_steps_the_probes_saw_equal_under_other_names_is_dropped():
    """Every probe of an index key equal: a fit listing RMSNorm, the Hadamard and the FP4 quantization (its block
    scales and codes probed equal) or the pool and the rows streamed into the carry says nothing the probes left
    open, and goes; one that lists a sub-step no probe saw stays."""
    from csa_conform.explain import UNEXPLAINED, Explanation
    from csa_conform.explain.claims import FIT
    from csa_conform.explain.entry import _probed
    from csa_conform.explain.patterns.findings import SUB_STEP, Finding
    from csa_conform.explain.patterns.substeps import STREAMED
    from csa_conform.explain.probes import AFTER_PROBES, probe_claim

    stage = "index_key_update"
    observation = {"moved": [], "dropped": 0, "after_probes": list(AFTER_PROBES[stage]),
                   "probes": [{"name": name, "sub_step": sub_step, "status": "equal", "differing": 0, "elements": 4}
                              for name, sub_step in zip(PROBED[stage], ("gate + APE scores", "pool", "bf16", "RMSNorm",
                                                                "RoPE", "Hadamard", "FP4 block scale",
                                                                "FP4 codes"))]}

    def fit(*consistent):
        return Finding(SUB_STEP, stage, "present_index_key", "consistent with ...", 1, 1,
                       {"sub_step": None, "consistent": list(consistent)}, FIT)

    kept = fit("FP4 block quantization", "the write of present_index_key")
    explanation = Explanation("case", 0, stage, UNEXPLAINED, diagnosis=[
        fit("RMSNorm", "Hadamard", "FP4 block quantization"), fit(STREAMED, "pool"), kept])
    _probed(explanation, probe_claim(observation))
    assert explanation.diagnosis == [kept]


def test_a_probe_whose_calls_wrote_another_extent_is_the_first_divergent_sub_step(tmp_path):
    """The ratio-4 compressor passing the RoPE its pair count as its width: the RoPE probe holds half the
    reference's values. That sub-step ran over another extent, which is a divergence of its own, observed."""
    from csa_conform.explain.probes import probe_claim

    kernels = _plant(tmp_path, "csa_compressed_rope(pooled + dim - rope_dim, rope_dim, block_start);",
                     "csa_compressed_rope(pooled + dim - rope_dim, rope_dim / 2, block_start);",
                     "csa_ratio4_main_compression.cu")
    observation = _observed(kernels, "boundaries.r4-prefill-8", 0, COMPRESSION)["compression_update"]
    rope = next(probe for probe in observation["probes"] if probe["sub_step"] == "RoPE")
    assert rope["status"] == "extent" and rope["elements"] * 2 == rope["reference_elements"]
    assert observation["first_divergent"] == "RoPE" and observation["exact"]
    assert probe_claim(observation).text == (
        f"the first sub-step whose probed output differs on the device is RoPE (probes: its calls wrote {rope['elements']:,} elements "
        f"where the reference's RoPE computes {rope['reference_elements']:,}: it ran over another extent)")
    assert "the first divergent sub-step is RoPE — " in probe_text(observation)
