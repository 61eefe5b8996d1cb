"""The specs in specs/ say what the code does: payloads, attributes, stages, kernel ABI."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from csa_conform._base.resources import builtin_kernels
from csa_conform.contract import INPUT_NAMES, claim_metadata, unsupported_reason, validate_step
from csa_conform.device.kernels import MODULES, PRELUDE, STRICT_OPTIONS
from csa_conform.device.launches import ATTENTION_BLOCK, REPLICATE_BLOCK
from csa_conform.device.ptx import CATEGORIES
from csa_conform.golden.recipes.closed_form import ratio4_plan, ratio128_plan
from csa_conform.golden.recipes.stream import assemble, play
from csa_conform.oracle import run_step
from csa_conform.spec import LAUNCHES, STAGE_NAMES, payload_table

SPEC = Path(__file__).resolve().parents[1] / "specs" / "stage-payloads.md"


def documented() -> set[tuple[str, str]]:
    rows = re.findall(r"^\| (\w+) \| ([\w*][^|]*?) \|", SPEC.read_text(), flags=re.MULTILINE)
    return {(stage, tensor) for stage, tensor in rows if stage != "stage"}


def emitted(plan) -> set[tuple[str, str]]:
    golden = play(plan, run_step)[-1]
    return {
        (stage, "*every operator output*" if stage == "writeback" else tensor)
        for stage, payload in golden.stages.items()
        for tensor in payload
    }


def test_spec_lists_every_payload_of_both_ratios():
    produced = emitted(ratio4_plan(((0, 8),))) | emitted(ratio128_plan(((0, 128, None),)))
    assert produced == documented()
    assert {stage for stage, _ in produced} == set(STAGE_NAMES)


def test_the_payload_table_is_the_one_the_spec_generates():
    """specs/stage-payloads.md holds payload_table() verbatim; edit the spec entries, then paste it."""
    assert payload_table() in SPEC.read_text(), "regenerate the table: python -c " \
        "'from csa_conform.spec import payload_table; print(payload_table())'"


# --- specs/contract.md ------------------------------------------------------------------------

CONTRACT = SPEC.parent / "contract.md"


def table(path: Path, header: str) -> list[list[str]]:
    """Rows of the markdown table whose header row starts with ``| header |``."""
    lines = path.read_text().splitlines()
    start = next(index for index, line in enumerate(lines) if line.startswith(f"| {header} |"))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


class RecordingAttributes(dict):
    """Attributes that remember every name the contract looks up."""

    def __init__(self, attrs, seen: set):
        super().__init__(attrs)
        self.seen = seen

    def get(self, name, default=None):
        self.seen.add(name)
        return super().get(name, default)

    def __getitem__(self, name):
        self.seen.add(name)
        return super().__getitem__(name)

    def __contains__(self, name):
        self.seen.add(name)
        return super().__contains__(name)


def node(ratio: int):
    """(attrs, shapes, dtypes, output names) of a stream's first step the reference accepts."""
    plan = ratio4_plan(((0, 8),)) if ratio == 4 else ratio128_plan(((0, 128, None),))
    inputs = assemble(plan, plan.steps[0], plan.initial_state)
    shapes, dtypes = claim_metadata(inputs)
    return dict(plan.attrs), shapes, dtypes, list(plan.output_names), inputs


def claim(ratio: int, **changes) -> str | None:
    """The claim gate on the accepted node with attributes changed (None deletes one)."""
    attrs, shapes, dtypes, outputs, _ = node(ratio)
    for name, value in changes.items():
        if value is None:
            attrs.pop(name, None)
        else:
            attrs[name] = value
    if attrs.get("cache_format", ATTRIBUTES["cache_format"][1]) == "f32":
        shapes[6], dtypes[6] = shapes[6][:2] + (512,), np.dtype(np.float32)
    return unsupported_reason(attrs, shapes, dtypes, outputs)


ATTRIBUTES = {row[0]: row[1:] for row in table(CONTRACT, "attribute")}
PARSE = {"int": int, "float": float, "string": str}
WRONG_TYPE = {"int": True, "string": 1}


def test_attribute_table_lists_every_attribute_the_contract_reads():
    seen: set = set()
    for ratio in (4, 128):
        attrs, shapes, dtypes, outputs, inputs = node(ratio)
        unsupported_reason(RecordingAttributes(attrs, seen), shapes, dtypes, outputs)
        validate_step(RecordingAttributes(attrs, seen), inputs, outputs)
    assert seen == set(ATTRIBUTES)


@pytest.mark.parametrize("name", sorted(ATTRIBUTES))
def test_attribute_default_and_type_are_the_contracts(name):
    kind, default = ATTRIBUTES[name][:2]
    for ratio in (4, 128):
        if default == "required":
            assert name in (claim(ratio, **{name: None}) or "")
        else:
            assert claim(ratio, **{name: None}) == claim(ratio, **{name: PARSE[kind](default)})
        if kind in WRONG_TYPE:
            assert claim(ratio, **{name: WRONG_TYPE[kind]}) is not None
        else:
            assert claim(ratio, **{name: 1}) == claim(ratio, **{name: None}), "a non-float scale reads as absent"


@pytest.mark.parametrize("name", sorted(ATTRIBUTES))
@pytest.mark.parametrize("ratio", [4, 128])
def test_attribute_values_each_ratio_accepts(name, ratio):
    kind, rule = ATTRIBUTES[name][0], ATTRIBUTES[name][2 if ratio == 4 else 3]
    accepted = node(ratio)[0].get(name)
    if rule == "> 0":
        assert accepted > 0 and claim(ratio, **{name: 0}) is not None
    elif rule == ">= 0":
        assert claim(ratio, **{name: 0.0}) is None and claim(ratio, **{name: 0.5}) is None
        assert claim(ratio, **{name: -0.5}) is not None
    else:
        values = [PARSE[kind](value.strip()) for value in rule.split(",")]
        for value in values:
            assert claim(ratio, **{name: value}) is None, value
        outside = values[-1] + 1 if kind == "int" else "not-" + values[-1]
        assert claim(ratio, **{name: outside}) is not None


def test_contract_names_the_stages_in_pipeline_order():
    named = re.findall(r"^\d\. `(\w+)`", CONTRACT.read_text(), flags=re.MULTILINE)
    assert tuple(named) == STAGE_NAMES


def test_contract_input_table_is_the_positional_schema():
    rows = table(CONTRACT, "#")
    assert [(int(number), name) for number, name, *_ in rows] == list(enumerate(INPUT_NAMES))


# --- specs/kernel-abi.md ----------------------------------------------------------------------

ABI = SPEC.parent / "kernel-abi.md"


def signature(entry: str, source: str) -> str:
    match = re.search(r'extern "C" __global__ void ' + entry + r"\s*\(([^)]*)\)", source)
    assert match, f"{entry} is not an extern \"C\" __global__ entry"
    return ", ".join(" ".join(parameter.split()) for parameter in match.group(1).split(","))


def test_abi_modules_entries_stages_and_blocks_are_the_runners():
    rows = table(ABI, "module file")
    assert {file.removesuffix(".cu"): entry for file, entry, *_ in rows} == MODULES
    launched = {launch.module: ", ".join(launch.stages) for launch in LAUNCHES}
    assert {file.removesuffix(".cu"): stages for file, _, stages, _ in rows} == launched
    blocks = {file.removesuffix(".cu"): int(shape.rsplit("×", 1)[1]) for file, _, _, shape in rows}
    assert blocks["csa_ratio4_index_replicate"] == REPLICATE_BLOCK
    assert blocks["csa_ratio4_attention"] == blocks["csa_ratio128_attention"] == ATTENTION_BLOCK
    assert {blocks[module] for module in MODULES if "attention" not in module and "replicate" not in module} == {1}


def test_abi_argument_lists_are_the_builtin_kernels_signatures():
    kernels = builtin_kernels()
    documented = {entry: arguments.strip("`") for entry, arguments in table(ABI, "entry")}
    assert set(documented) == set(MODULES.values())
    for module, entry in MODULES.items():
        assert documented[entry] == signature(entry, (kernels / f"{module}.cu").read_text()), entry


def test_abi_compile_options_ptx_categories_and_prelude_functions():
    text = ABI.read_text()
    assert "    " + " ".join(STRICT_OPTIONS) + "\n" in text
    categories = text.split("PTX report counts the instruction", 1)[1].split("(exit", 1)[0]
    assert re.findall(r"`([.\w]+)`", categories) == list(CATEGORIES)
    prelude = (builtin_kernels() / PRELUDE).read_text()
    required = re.findall(r"`(\w+)\(", text.split("The prelude must define", 1)[1].split("The built-in", 1)[0])
    assert len(required) == 5
    for function in required:
        assert re.search(r"__device__ (__forceinline__ )?\w+ " + function + r"\(", prelude), function


# --- specs/ as a whole ------------------------------------------------------------------------

OUTSIDE_CITATIONS = re.compile(r"\.\./shared|(CONTRACT|HARNESS|STYLE|COMMON)\.md")
TEXT_SUFFIXES = {".py", ".md", ".cu", ".cuh", ".cpp", ".h", ".toml", ".txt", ".cfg", ".in"}


def test_specs_index_lists_every_spec():
    index = (SPEC.parent / "README.md").read_text()
    listed = set(re.findall(r"\]\(([\w-]+\.md)\)", index))
    present = {path.name for path in SPEC.parent.glob("*.md")} - {"README.md"}
    assert present <= listed


def test_nothing_cites_documents_outside_the_repository():
    root = SPEC.parents[1]
    files = [root / "README.md", root / "Makefile", root / "pyproject.toml"]
    for folder in ("csa_conform", "kernels", "specs", "tests", "benchmarks"):
        files += [path for path in (root / folder).rglob("*") if path.suffix in TEXT_SUFFIXES]
    citing = [str(path.relative_to(root)) for path in files
              if path != Path(__file__).resolve() and OUTSIDE_CITATIONS.search(path.read_text())]
    assert citing == []


# Project issue numbers are history for maintainers (benchmarks/README.md), not something a user can
# look up; an upstream project's `owner/repo#N` is a citation and stays.
ISSUE_NUMBER = re.compile(r"(?i)\bissues? #?\d+|(?<![\w/.-])#\d+\b")


def test_user_facing_docs_cite_no_issue_numbers():
    import click

    from csa_conform.cli import main

    root = SPEC.parents[1]
    texts = {str(path.relative_to(root)): path.read_text()
             for path in [root / "README.md", root / "CONTRIBUTING.md", *sorted((root / "specs").glob("*.md"))]}
    context = click.Context(main, info_name="csa-conform")
    texts["csa-conform --help"] = main.get_help(context)
    for name, command in main.commands.items():
        texts[f"csa-conform {name} --help"] = command.get_help(click.Context(command, info_name=name, parent=context))
    citing = {name: ISSUE_NUMBER.findall(text) for name, text in texts.items() if ISSUE_NUMBER.search(text)}
    assert citing == {}
    assert ISSUE_NUMBER.findall("both of issue 18's targets, see #31; cupy/cupy#9576") == ["issue 18", "#31"]
