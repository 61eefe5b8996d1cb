"""The size rule and the starting points of ``reduce_case``, with a stand-in for the device run (no
kernels): it names a divergence whenever a case keeps what a planted bug would need. Also the floor
``reduce`` reports and the count of a file that omits a position-0 step's carries."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from csa_conform.check.model import StepVerdict
from csa_conform.compare.bitwise import TensorDiff
from csa_conform.golden import GoldenFile, write_goldens
from csa_conform.repro.reduce import AS_GIVEN, ALIKE, FAILING_STEP, FROM_ZERO, _suffixes, floor_of, reduce_case
from csa_conform.golden.edits import restarted, stream_of, without_carries

ROOT = Path(__file__).resolve().parents[2]
CI_GOLDENS = ROOT / "goldens" / "ci.h5"
SIGNATURE = {"stage": "selection", "tensor": "selected_indices"}


def _stand_in(needs):
    """A probe that diverges at the last step whenever ``needs(inputs of the last step)`` holds."""
    def probe(case):
        inputs = case.steps[-1].inputs
        if not needs(inputs):
            return None
        diff = TensorDiff(SIGNATURE["stage"], SIGNATURE["tensor"], (1, 1), "int32", ("b", "s"), passed=False,
                          first={"coords": "b=0 s=0"})
        return StepVerdict(len(case.steps) - 1, False, stage=SIGNATURE["stage"], diffs=[diff])
    return probe


def _stream(case: str):
    with GoldenFile(CI_GOLDENS) as golden:
        return stream_of(golden, case)


def _quiet(_line: str) -> None:
    pass


def test_every_starting_point_is_shrunk_and_the_smallest_kept_never_larger_than_the_case():
    """A bug at position 3 of a two-step B = 2 stream (its decode): the stream from its first step and the
    decode from its stored state both shrink; the smallest is written and is at most the case."""
    stream = _stream("random.r4-b2n2-i2-k512")
    probe = _stand_in(lambda inputs: int(inputs["total_sequence_length"]) == 4)
    reduction = reduce_case(stream, "random.r4-b2n2-i2-k512", probe, 60, _quiet)
    names = [name for name, _ in reduction.starts]
    assert names[0] in (FROM_ZERO, FAILING_STEP) and set(names) == {FROM_ZERO, FAILING_STEP}
    assert reduction.complete and reduction.source == "random.r4-b2n2-i2-k512"
    assert reduction.reduced.elements() == min(elements for _, elements in reduction.starts)
    assert reduction.reduced.size() <= stream.size() and 3 * reduction.reduced.elements() < stream.elements()
    assert int(reduction.reduced.steps[-1]["total_sequence_length"]) == 4 and reduction.reduced.batch == 1
    case = reduction.case.steps[-1].inputs
    assert probe(reduction.case) is not None and int(case["total_sequence_length"]) == 4


def test_a_case_no_edit_can_shrink_is_handed_back_as_it_was_given():
    stream = _stream("boundaries.r4-prefill-5")
    original = stream.case("x", "").steps[0].inputs
    probe = _stand_in(lambda inputs: inputs.keys() == original.keys() and all(
        inputs[name].shape == array.shape and inputs[name].tobytes() == array.tobytes()
        for name, array in original.items()))
    reduction = reduce_case(stream, "boundaries.r4-prefill-5", probe, 30, _quiet)
    assert reduction.start in (FROM_ZERO, AS_GIVEN) and reduction.reduced.size() == stream.size()
    # only edits of attributes and outputs (top-k, selected_indices), which leave the inputs, are kept
    assert probe(reduction.case) is not None and reduction.complete


def test_the_files_smaller_case_diverging_alike_wins_when_it_reduces_smaller():
    """By the stand-in's rule the given case keeps its bias and position 7, while a smaller case that
    diverges alike (one token from position 0, no bias) needs neither: its reduction is written."""
    stream = _stream("random.r4-bias-1")
    other = _stream("boundaries.r4-prefill-1")
    assert "attention_bias" not in other.steps[0]
    probe = _stand_in(lambda inputs: (int(inputs["total_sequence_length"]), "attention_bias" in inputs) in
                      ((8, True), (1, False)))
    asked = []

    def alike(target, limit_s):
        asked.append((target, limit_s))
        return "boundaries.r4-prefill-1", other

    reduction = reduce_case(stream, "random.r4-bias-1", probe, 40, _quiet, alike)
    assert asked == [(("selection", "selected_indices"), 10.0)]
    assert reduction.source == "boundaries.r4-prefill-1" and reduction.start == f"{ALIKE} (boundaries.r4-prefill-1)"
    assert reduction.reduced.elements() < min(elements for name, elements in reduction.starts if ALIKE not in name)
    assert reduction.reduced.elements() < other.elements() < stream.elements()
    assert reduction.case.description == "reduced from boundaries.r4-prefill-1"


def test_the_suffixes_tried_start_at_the_last_tokens_the_divergent_one_and_each_block_end():
    stream = _stream("boundaries.r4-prefill-9")  # positions 0..8: block ends at tokens 3 and 7
    assert (stream.start, stream.tokens) == (0, 9)
    # the last two (8, 7), the block ends and the tokens before them (3, 2, 7, 6), halves (1, 2, 4, 8)
    assert _suffixes(stream, {}) == [8, 7, 6, 4, 3, 2, 1]
    assert _suffixes(stream, {"s": 5}) == [8, 7, 6, 5, 4, 3, 2, 1]


def test_the_floor_names_the_inputs_the_contract_fixes_and_what_varies():
    """One token resumed at position 127 (ratio 128): the APE table, the norm, the cursors, the carry, the
    records of its position (none) and a current_kv of 128 positions are fixed; the token's query and
    compressor rows and the sink vary."""
    floor = floor_of(_stream("quant-edge.r128-fp8-overflow"))
    assert floor.fixed == {"compressor_ape": ((128, 512), 65_536), "compressor_norm": ((512,), 512),
                           "total_sequence_length": ((), 1), "seqlens_k": ((1,), 1),
                           "past_compression_carry": ((1, 128, 2, 512), 131_072),
                           "past_compressed_kv": ((1, 0, 583), 0)}  # position 127 holds no record yet
    assert (floor.window_from, floor.window) == (0, 128 * 512)
    assert floor.fixed_elements == 262_658
    assert floor.varying == {"query": 512, "compressor_kv": 512, "compressor_gate": 512, "head_sink": 1}


def test_a_file_that_omits_its_carries_is_counted_as_stored(tmp_path):
    stream = without_carries(restarted(_stream("boundaries.r4-prefill-5"), 0, 2))
    path = tmp_path / "omitted.h5"
    write_goldens(path, [stream.case("omitted", "")])
    with GoldenFile(path) as golden:
        read = stream_of(golden, "omitted")
        stored = golden.read_step("omitted", 0).inputs
        cleared = golden.cleared_carries("omitted", 0)
    assert cleared == ("past_compression_carry", "past_index_carry") and read.carries_omitted
    assert read.elements() == stream.elements() == sum(
        int(array.size) for name, array in stored.items() if name not in cleared)
    assert all(np.isneginf(stored[name][..., 1, :]).all() for name in cleared)
