"""run_step against every output of the real CPU reference kernel we hold."""

from __future__ import annotations

import json

import pytest
from reference_corpus import case_files, expected_error, reference_file, step_inputs, step_prefixes

from csa_conform import ContractError
from csa_conform.compare.testing import assert_bits_equal
from csa_conform.oracle import run_step


@pytest.mark.parametrize("name", case_files())
def test_reference_case_is_reproduced_bit_for_bit(name):
    archive = reference_file(name)
    attrs = json.loads(str(archive["attrs_json"]))
    output_names = json.loads(str(archive["output_names_json"]))
    for prefix in step_prefixes(archive):
        inputs = step_inputs(archive, prefix)
        error = expected_error(archive, prefix)
        if error is not None:
            with pytest.raises(ContractError) as raised:
                run_step(attrs, inputs, output_names)
            assert str(raised.value) == error
            assert raised.value.kind == ("unsupported" if "Unsupported: " in error else "invalid")
            continue
        result = run_step(attrs, inputs, output_names)
        assert list(result.outputs) == output_names
        for output in output_names:
            expected = archive[prefix + "out/" + output]
            actual = result.outputs[output]
            assert_bits_equal(actual, expected, f"{prefix}{output}")


def test_corpus_is_present_and_covers_both_ratios():
    names = case_files()
    assert any(name.startswith("r128") for name in names) and any(name.startswith("r4") for name in names)
