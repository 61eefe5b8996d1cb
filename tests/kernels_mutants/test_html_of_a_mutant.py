"""report --html of a buggy kernel's `diff --explain` says why before anything else: a summary per kernel
module with each failing case's headline linked to its detail; failing cases first; the oracle-rejected
cases one counted, expandable line, never matrix rows; attention/Y and writeback/Y, which only inherit the
compressor's divergence, folded under it; per divergence the explanation, the diagnosis and the reproduce
and reduce commands; heatmaps with legible cells and the first difference's values and bits. Emulated on
the host."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from mutants import MUTANTS

import csa_conform.report.html as html_report
from csa_conform.cli import main
from csa_conform.exitcodes import ExitCode
from csa_conform.explain import structural_note
from csa_conform.report.html import MIN_CELL, render_html
from csa_conform.report.merge import merge_shards

pytestmark = pytest.mark.slow  # five emulated runs of a mutant (about a minute on two cores)

ROOT = Path(__file__).resolve().parents[2]
CI = ROOT / "goldens" / "ci.h5"
CASES = "*r128-[bcf][i3a]*"  # failing random and edge cases, passing ones, errors.attr-r128-cache-fp4 (rejected)
REJECTED = "errors.attr-r128-cache-fp4"
BUG = next(mutant for mutant in MUTANTS if mutant.name == "fp8_scale_rounded_down")


def invoke(*args):
    return CliRunner().invoke(main, [str(arg) for arg in args])


@pytest.fixture(scope="module")
def documents(tmp_path_factory, emulation_backend) -> dict[str, dict]:
    """diff --explain of the mutant over CASES, whole and in two shards, its explain and bisect."""
    from csa_conform.device import cuda

    folder = tmp_path_factory.mktemp("html-mutant")
    patch = pytest.MonkeyPatch()
    patch.setattr(cuda, "CudaBackend", lambda: emulation_backend)
    try:
        kernels = BUG.apply(ROOT / "kernels", folder / "kernels")
        runs = {
            "diff": ("diff", CI, "--case", CASES, "--kernels", kernels, "--explain", "--json"),
            "shard1": ("diff", CI, "--case", CASES, "--kernels", kernels, "--explain", "--shard", "1/2", "--json"),
            "shard2": ("diff", CI, "--case", CASES, "--kernels", kernels, "--explain", "--shard", "2/2", "--json"),
            "explain": ("explain", CI, "--case", "random.r128-bias-B*", "--kernels", kernels, "--json"),
            "bisect": ("bisect", CI, "--case", "random.r128-bias-BNSC", "--kernels", kernels, "--json"),
        }
        found = {}
        for name, args in runs.items():
            result = invoke(*args)
            assert result.exit_code == ExitCode.DIVERGED, result.output
            found[name] = json.loads(result.stdout)
        return found
    finally:
        patch.undo()


@pytest.fixture(scope="module")
def page(documents) -> str:
    return render_html([documents["diff"]])


def failing(document: dict) -> list[dict]:
    return [case for case in document["cases"] if not case["passed"]]


def test_the_summary_comes_first_and_gives_each_failing_cases_headline_linked(documents, page):
    document = documents["diff"]
    summary, matrix = page.index("Summary: "), page.index("Verdicts: case × stage")
    assert summary < matrix < page.index("Failing cases (")
    head = page[summary:matrix]
    assert f"Summary: {len(failing(document))} of {len(document['cases'])} cases fail" in head
    assert "csa_ratio128_compression.cu" in head and "compression_update" in head
    anchors = set(re.findall(r"id='(run1-case\d+)'", page))
    links = re.findall(r"<a href='#(run1-case\d+)'>([^<]+)</a>", head)
    assert sorted(name for _, name in links) == sorted(case["case"] for case in failing(document))
    assert {anchor for anchor, _ in links} <= anchors
    for explanation in document["explain"]["explanations"]:
        if explanation["verdict"] != "inherited":  # each case's own headline, as explain wrote it
            suffix = explanation["headline"].split("]: ", 1)[1]
            assert suffix.replace("'", "&#x27;") in head, suffix


def test_the_summary_counts_every_verdict_of_explain(documents, page):
    """Ambiguous and failed verdicts are counted beside explained and unexplained (each count its own)."""
    document = copy.deepcopy(documents["diff"])
    counts = dict(zip(("explained", "ambiguous", "inherited", "unexplained", "failed"), (5, 3, 7, 2, 1)))
    document["explain"]["summary"] = {"divergences": sum(counts.values()), **counts}
    head = render_html([document]).split("Verdicts: case × stage")[0]
    assert ("explain: 18 divergences: 5 explained, 3 ambiguous, 7 inherited, 2 unexplained, 1 failed") in head
    measured, head = documents["diff"]["explain"]["summary"], page.split("Verdicts: case × stage")[0]
    assert (f"{measured['ambiguous']} ambiguous, {measured['inherited']} inherited, {measured['unexplained']} "
            f"unexplained{structural_note(measured)}, {measured['failed']} failed</p>") in head


def test_rejected_cases_are_one_line_and_failing_cases_come_first(documents, page):
    matrix = page[page.index("Verdicts: case × stage"):]
    labels = re.findall(r"<text x='0' y='\d+'>([^<]+)</text>", matrix[:matrix.index("</svg>")])
    document = documents["diff"]
    rejected = [case["case"] for case in document["cases"]
                if case["passed"] and not case["steps_compared"] and case.get("rejected_steps")]
    assert REJECTED in rejected and not set(rejected) & set(labels)
    names = [case["case"] for case in failing(document)]
    assert labels[:len(names)] == names and len(labels) == len(document["cases"]) - len(rejected)
    assert f"<details><summary>{len(rejected)} oracle-rejected cases: every step rejected as stored" in page
    assert page.index(REJECTED) > page.index("Verdicts: case × stage")


def test_inherited_stages_are_folded_under_the_compressor(documents, page):
    cases = len(failing(documents["diff"]))
    assert page.count("2 stages only inherit this divergence: sparse_sink_softmax_attention (step 0), "
                      "writeback (step 0)") == cases
    assert "<b>writeback/Y</b>" not in page and "<b>sparse_sink_softmax_attention/Y</b>" not in page
    assert page.count("<b>compression_update/present_compressed_kv</b>") == cases
    assert "<i style='background:#f4a582'></i>inherited" in page


def test_each_divergence_has_its_explanation_diagnosis_and_commands(documents, page):
    case = failing(documents["diff"])[0]
    detail = page[page.index(f"<h3>{case['case']}</h3>"):]
    detail = detail[:detail.index("</section>")]
    stage = case["steps"][0]["stages"][0]
    assert "<th colspan='2'>explanation</th>" in detail and "evidence (first element)" in detail
    assert f"<b>{stage['diagnosis'][0]['kind']}</b>" in detail
    assert stage["reproduce"] in detail and stage["kernel"] in detail
    reduce = f"csa-conform reduce {CI} --case {case['case']} --kernels "
    assert reduce in detail and "--explain" not in detail.split(reduce)[1].split("</code>")[0]


def test_heatmap_cells_are_legible_and_name_the_first_difference(documents, page):
    cells = re.findall(r"<rect x='\d+' y='\d+' width='(\d+)' height='(\d+)' fill='rgb", page)
    assert cells and min(int(width) for width, _ in cells) >= MIN_CELL
    assert min(int(height) for _, height in cells) >= MIN_CELL
    tensor = failing(documents["diff"])[0]["steps"][0]["stages"][0]["tensors"][0]
    first = tensor["first"]
    assert (f"first difference at {first['coords']}: expected {first['expected']} [{first['expected_bits']}], "
            f"actual {first['actual']} [{first['actual_bits']}]") in page
    row_axis, column_axis = tensor["heatmap"]["axes"]
    assert f">{row_axis} ↓</text>" in page and f">{column_axis} →</text>" in page


def test_shards_merge_into_the_page_of_the_whole_run(documents, page):
    merged = merge_shards([documents["shard1"], documents["shard2"]])
    assert len(merged) == 1
    whole = render_html(merged)
    strip = re.compile(r"<table><tr><th>argv</th>.*?</table>", re.S)  # the command lines differ, nothing else
    assert strip.sub("", whole) == strip.sub("", page)


def test_explain_and_bisect_documents_render(documents):
    text = render_html([documents["explain"], documents["bisect"]])
    assert text.count("Summary: ") == 2 and "<h3>Bisect</h3>" in text
    assert "first divergence" in text and "compression_update" in text
    assert "<th colspan='2'>explanation</th>" in text


def test_a_page_past_the_cap_counts_what_it_left_out(documents, monkeypatch):
    monkeypatch.setattr(html_report, "MAX_PAGE_BYTES", 60_000)
    text = render_html([documents["diff"]])
    drawn = text.count("<section class='case'")
    assert 0 < drawn < len(failing(documents["diff"]))
    assert (f"… and {len(failing(documents['diff'])) - drawn} more failing cases not drawn: the page stops at"
            in text)
    assert len(text.encode()) < 60_000 + 40_000  # the summary and matrix are always drawn
