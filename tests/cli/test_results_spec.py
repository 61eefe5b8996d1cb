"""specs/results-document.md, the JSON Schema and the code agree: fields, failure types, version, example."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema

from csa_conform._base import statuses
from csa_conform.check import results
from csa_conform.check.results import RESULTS_VERSION, schema

SPEC = (Path(__file__).resolve().parents[2] / "specs" / "results-document.md").read_text()


def table_after(heading: str) -> list[str]:
    """First-column names of the first table under a heading."""
    section = SPEC.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\| `([^`]+)` \|", section, flags=re.MULTILINE)


def test_version_is_the_codes():
    assert re.search(r"^# The results document — version (\d+)$", SPEC, flags=re.MULTILINE).group(1) == str(
        RESULTS_VERSION
    )
    assert schema()["properties"]["version"] == {"const": RESULTS_VERSION}


def test_top_level_fields_are_the_schemas():
    assert set(table_after("Top level")) == set(schema()["properties"])


def test_case_fields_are_the_schemas():
    assert set(table_after("Cases, steps, stages, tensors")) == set(schema()["$defs"]["case"]["properties"])


def test_failure_types_are_the_schemas_and_the_codes():
    documented = table_after("Failures")
    assert documented == schema()["$defs"]["failure_type"]["enum"]
    constants = {value for module in (results, statuses) for name, value in vars(module).items()
                 if name.isupper() and isinstance(value, str)}
    assert set(documented) <= constants


def test_the_example_is_a_valid_document():
    example = json.loads(SPEC.split("```json\n", 1)[1].split("```", 1)[0])
    jsonschema.validate(example, schema())
