"""Shapes the reference loops handle by not looping: an empty batch."""

from __future__ import annotations

import pytest

from csa_conform.golden.recipes.closed_form import ratio4_plan, ratio128_plan
from csa_conform.golden.recipes.stream import assemble
from csa_conform.oracle import run_step

SHARED = {"compressor_ape", "compressor_norm", "head_sink", "index_compressor_ape", "index_compressor_norm",
          "total_sequence_length"}


@pytest.mark.parametrize("plan", [ratio128_plan(((0, 130, None),)), ratio4_plan(((0, 9),))], ids=["r128", "r4"])
def test_empty_batch_gives_empty_outputs_of_the_right_shape(plan):
    inputs = assemble(plan, plan.steps[0], plan.initial_state)
    empty = {name: value if name in SHARED else value[:0] for name, value in inputs.items()}
    full = run_step(plan.attrs, inputs, list(plan.output_names))
    result = run_step(plan.attrs, empty, list(plan.output_names))
    for name, value in result.outputs.items():
        assert value.shape == (0,) + full.outputs[name].shape[1:], name
        assert value.dtype == full.outputs[name].dtype, name
