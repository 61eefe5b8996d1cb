"""``report --html``: one self-contained HTML page of one or more results documents, saying *why*.

Per document, what a reader needs first comes first: what ran, then a summary
per kernel module (cases failing, the stage each divergence starts in, and
the explanation's or diagnosis's headline of each failing case, linked to
its detail), the tolerance verdict where one was judged, a case × stage
matrix of the cases that ran (failing first; cases the oracle rejects,
nothing compared, are one counted, expandable line), then per failing case
each divergence where it starts: the explanation (cause, evidence, the
kernel), the structural diagnosis (kind and where), the reproduce and reduce
commands, and per tensor a ULP histogram and a heatmap of where the
mismatches sit. A stage that only inherits a divergence (writeback/Y
repeating attention/Y, a later stage of a chained run reading what a
divergent one wrote, or what ``--explain`` found inherited) is folded under
the stage that started it. A page that would pass MAX_PAGE_BYTES stops
drawing cases and says how many it left out. Every plot is inline SVG
written here; the page loads nothing at view time (no script, no font, no
network).
"""

from __future__ import annotations

import math
import shlex
from dataclasses import dataclass, field
from html import escape

from csa_conform._base.statuses import DIVERGED, FAULT, HANG, IDENTICAL, INVALID, NOT_APPLICABLE, NOT_COMPARED
from csa_conform.check.gap import COLUMNS, table_rows
from csa_conform.explain import structural_note
from csa_conform.report.bench_plots import bench_html
from csa_conform.spec import STAGE_NAMES

MAX_PAGE_BYTES = 2_000_000  # the details of failing cases stop here; the rest are counted
MAX_TENSORS = 6  # tensor cards per divergence; the rest are counted
MAX_MATRIX_ROWS = 400
INHERITED = "inherited"
STATUS_COLOURS = {
    IDENTICAL: "#2ca02c", DIVERGED: "#d62728", NOT_APPLICABLE: "#d9d9d9", NOT_COMPARED: "#f2f2f2",
    INHERITED: "#f4a582", INVALID: "#e6ab02", "failed": "#8c1c13", FAULT: "#000000", HANG: "#4d4d4d",
}
ODD_COLOUR = "#9467bd"  # non-deterministic, replay-mismatch and other findings of one mode
CELL = 14
ORDER = {name: position for position, name in enumerate(STAGE_NAMES)}

STYLE = """
body { font-family: sans-serif; margin: 24px; color: #222; max-width: 1400px; }
h1 { font-size: 22px; } h2 { font-size: 18px; margin-top: 32px; border-bottom: 1px solid #ccc; }
h3 { font-size: 15px; margin: 18px 0 4px; } h4 { font-size: 14px; margin: 10px 0 4px; }
td:first-child code { white-space: nowrap; }
table { border-collapse: collapse; font-size: 12px; margin: 8px 0; }
td, th { border: 1px solid #ccc; padding: 2px 6px; text-align: left; vertical-align: top; }
th { background: #f4f4f4; }
.pass { color: #2ca02c; font-weight: bold; } .fail { color: #d62728; font-weight: bold; }
.case { border-left: 4px solid #d62728; padding: 2px 0 6px 12px; margin: 14px 0; }
.block { border: 1px solid #ddd; border-radius: 4px; padding: 6px 10px; margin: 8px 0; background: #fcfcfc; }
.card { display: inline-block; vertical-align: top; margin: 8px 16px 8px 0; padding: 8px;
        border: 1px solid #ddd; border-radius: 4px; max-width: 760px; background: #fff; }
.headline { font-size: 13px; } .why { font-size: 13px; margin: 4px 0; }
code, .message { font-family: monospace; font-size: 11px; }
.message { white-space: pre-wrap; } code { background: #f4f4f4; padding: 1px 3px; word-break: break-all; }
svg { display: block; margin: 4px 0; }
.legend span { display: inline-block; margin-right: 12px; font-size: 12px; }
.legend i { display: inline-block; width: 12px; height: 12px; margin-right: 4px; vertical-align: middle; }
details { margin: 6px 0; } summary { cursor: pointer; font-size: 13px; }
.left-out { font-style: italic; color: #555; }
"""


def render_html(documents: list[dict], title: str = "csa-conform report",
                samples: list[tuple[dict | None, str | None]] | None = None) -> str:
    """The page; ``samples``: per document its bench sidecar, or why there is none (report.bench_plots)."""
    parts = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{escape(title)}</title>",
             f"<style>{STYLE}</style></head><body><h1>{escape(title)}</h1>", _overview(documents)]
    budget = MAX_PAGE_BYTES - sum(map(len, parts))
    samples = samples or [(None, None)] * len(documents)
    for number, (document, kept) in enumerate(zip(documents, samples), 1):
        share = budget // (len(documents) - number + 1)
        text = _document(number, document, share, kept)
        budget -= len(text)
        parts.append(text)
    parts.append("</body></html>")
    return "\n".join(parts)


def _overview(documents: list[dict]) -> str:
    rows = ["<table><tr><th>#</th><th>command</th><th>golden file</th><th>verdict</th><th>cases</th>"
            "<th>failed</th><th>invalid</th><th>steps</th></tr>"]
    for number, document in enumerate(documents, 1):
        summary = document["summary"]
        golden = (document.get("golden") or {}).get("path", "")
        rows.append(f"<tr><td><a href='#run{number}'>{number}</a></td><td>{escape(document['command'])}</td>"
                    f"<td>{escape(str(golden))}</td><td>{_verdict(document)}</td>"
                    f"<td>{summary['cases']}</td><td>{summary['failed']}</td><td>{summary.get('invalid', 0)}</td>"
                    f"<td>{summary['steps']}</td></tr>")
    rows.append("</table>")
    return "".join(rows)


def _verdict(document: dict) -> str:
    verdict = "<span class='pass'>passed</span>" if document["passed"] else "<span class='fail'>FAILED</span>"
    return f"{verdict} (exit {document['exit_code']})"


# --- what the cases say ------------------------------------------------------------------------


@dataclass
class Folded:
    """A divergent stage that only inherits the divergence of the block it is folded under."""

    step: int
    stage: dict
    why: str


@dataclass
class Block:
    """A divergence where it starts: its step, its stage entry, what explain said, what it passed on."""

    step: int
    stage: dict
    explanation: dict | None
    folded: list[Folded] = field(default_factory=list)

    @property
    def module(self) -> str:
        kernel = self.stage.get("kernel")
        return kernel.split(":", 1)[0] if kernel else "no kernel (the host oracle or the stored payload)"


def rejected_case(case: dict) -> bool:
    """A case every step of which the oracle rejects, as stored: nothing to compare, nothing to show."""
    return case["passed"] and not case["steps_compared"] and bool(case.get("rejected_steps"))


def _fault(case: dict) -> dict | None:
    """The failure of the step whose kernel faulted or hung, if one did."""
    return next((step["failure"] for step in case.get("steps", [])
                 if (step.get("failure") or {}).get("type") in (FAULT, HANG)), None)


def _invalid(case: dict) -> str | None:
    failure = case.get("failure") or {}
    return failure["message"] if failure.get("type") == INVALID else None


def _explanations(document: dict) -> dict[tuple, dict]:
    return {(entry["case"], entry["step"], entry["stage"]): entry
            for entry in (document.get("explain") or {}).get("explanations", [])}


def _chained(document: dict) -> bool:
    """Whether a stage read what earlier divergent stages of the run wrote (diff and bisect, not isolated)."""
    return document["command"] in ("diff", "bisect", "explain") and document["options"].get("mode") != "isolated"


def _signature(stage: dict) -> set[tuple]:
    return {(tensor["tensor"], tensor.get("mismatches"), (tensor.get("first") or {}).get("coords"))
            for tensor in stage["tensors"]}


def blocks(document: dict, case: dict, explained: dict[tuple, dict]) -> list[Block]:
    """The case's divergences where they start, each with the later stages that only inherit it."""
    found = sorted(((step["step"], stage) for step in case.get("steps", []) for stage in step.get("stages", [])),
                   key=lambda pair: (pair[0], ORDER.get(pair[1]["stage"], len(ORDER))))
    chained = _chained(document)
    made: list[Block] = []
    for step, stage in found:
        explanation = explained.get((case["case"], step, stage["stage"]))
        origin, why = (made[-1] if made else None), None
        repeated = next((block for block in made if block.step == step
                         and _signature(stage) <= _signature(block.stage)), None)
        if repeated is not None:
            origin, why = repeated, f"repeats {repeated.stage['stage']}'s payload bit for bit"
        elif origin is not None and explanation is not None and explanation["verdict"] == INHERITED:
            why = explanation.get("note") or INHERITED
        elif origin is not None and explanation is None and chained:
            why = ("diverges after it in a chained run, reading what it wrote (run --explain or --mode isolated "
                   "to tell whether it diverges on its own)")
        if why is None:
            made.append(Block(step, stage, explanation))
        else:
            origin.folded.append(Folded(step, stage, why))
    return made


def headline(case: dict, block: Block | None) -> str:
    """The one line a summary shows for a failing case: explain's, else the diagnosis's, else the first
    tensor's message, else the case's or a step's failure."""
    if block is None:
        failure = case.get("failure") or next(
            (step.get("failure") or (step.get("findings") or [None])[0] for step in case.get("steps", [])
             if step.get("failure") or step.get("findings")), None)
        return failure["message"] if failure else "failed"
    if block.explanation is not None:
        text = block.explanation["headline"]
        prefix = f"{case['case']} step {block.step} {block.stage['stage']}"
        if text.startswith(prefix):
            text = text[len(prefix):].lstrip()
            if text.startswith("[") and "]" in text:
                text = text.split("]", 1)[1]
            text = text.lstrip(": ")
        return text
    if block.stage.get("diagnosis"):
        finding = block.stage["diagnosis"][0]
        return f"{finding['kind']}: {finding['headline']}"
    return block.stage["tensors"][0]["message"]


# --- one document -----------------------------------------------------------------------------


def _document(number: int, document: dict, budget: int, samples: tuple[dict | None, str | None]) -> str:
    parts = [f"<h2 id='run{number}'>{number}. {escape(document['command'])} "
             f"{escape(str((document.get('golden') or {}).get('path', '')))}: {_verdict(document)}</h2>",
             _provenance(document)]
    if document.get("error"):
        parts.append(f"<p class='fail'>{escape(document['error']['type'])}: {escape(document['error']['message'])}</p>")
    explained = _explanations(document)
    cases = document["cases"]
    failing = [case for case in cases if not case["passed"]]
    found = {case["case"]: blocks(document, case, explained) for case in failing}
    if document.get("bisect"):
        parts.append(_bisect(document["bisect"]))
    if failing:
        parts.append(_summary(number, document, failing, found))
    if document.get("tolerance"):
        parts.append(_tolerance(document["tolerance"]))
    rejected = [case for case in cases if rejected_case(case)]
    if document["command"] != "gap" and cases:
        shown = failing + [case for case in cases if case["passed"] and not rejected_case(case)]
        parts.append("<h3>Verdicts: case × stage</h3>")
        if shown:
            parts.append(verdict_matrix(document, shown, found))
        parts.append(_rejected_line(rejected))
    if document.get("gap"):
        parts.append(_gap(document["gap"]))
    if document.get("bench"):
        parts.append(bench_html(document["bench"], *samples))
    if document.get("mutate"):
        parts.append(_mutation(document["mutate"]))
    if failing:
        parts.append(f"<h3>Failing cases ({len(failing)})</h3>")
        budget -= sum(map(len, parts))
        left = len(failing)
        for index, case in enumerate(failing):
            text = _case_detail(number, index, document, case, found[case["case"]])
            if len(text) > budget and index:
                break
            parts.append(text)
            budget -= len(text)
            left -= 1
        if left:
            parts.append(f"<p class='left-out'>… and {left} more failing cases not drawn: the page stops at "
                         f"{MAX_PAGE_BYTES // 1_000_000} MB (their details are in the JSON document).</p>")
    return "\n".join(parts)


def _provenance(document: dict) -> str:
    items = [("argv", " ".join(document.get("argv", [])))]
    golden = document.get("golden") or {}
    if golden.get("sha256"):
        items.append(("golden sha256", golden["sha256"]))
    kernels = document.get("kernels") or {}
    if kernels:
        described = kernels.get("kernels") or {}
        provider = described.get("provider")
        built = (f"provider {provider['name']} {provider['version']} on {provider['device']}" if provider
                 else f"build {(described.get('build') or {}).get('profile', '')}")
        items.append(("kernels", f"{described.get('path', '')} ({built})"))
        device = kernels.get("device") or {}
        if device:
            items.append(("device", str(device.get("name", ""))))
    if document["options"].get("mode"):
        items.append(("mode", document["options"]["mode"]))
    if document.get("control_run"):
        items.append(("control run", "yes: every stage ran on the host oracle"))
    rows = "".join(f"<tr><th>{escape(key)}</th><td>{escape(str(value))}</td></tr>" for key, value in items)
    return f"<table>{rows}</table>"


def _anchor(number: int, index: int) -> str:
    return f"run{number}-case{index}"


def explain_summary(explain: dict) -> str:
    """The explain tally of a document, one line above the failing cases."""
    return (f"<p class='why'>explain: {explain['divergences']} divergences: {explain['explained']} explained, "
            f"{explain['ambiguous']} ambiguous, {explain['inherited']} inherited, {explain['unexplained']} "
            f"unexplained{structural_note(explain)}, {explain['failed']} failed</p>")


def _summary(number: int, document: dict, failing: list[dict], found: dict[str, list[Block]]) -> str:
    """Per kernel module: the cases failing there, the stages their divergences start in, and each case's
    headline, linked to its detail."""
    modules: dict[str, list[tuple[int, dict, Block | None]]] = {}
    for index, case in enumerate(failing):
        reason = _invalid(case)
        if reason is not None:
            modules.setdefault("invalid cases (not judged)", []).append((index, case, None))
            continue
        fault = _fault(case)
        if fault is not None and not found[case["case"]]:
            module = (fault.get("kernel") or "no kernel named").split(".cu:")[0]
            modules.setdefault(module, []).append((index, case, None))
            continue
        made = found[case["case"]] or [None]
        for block in made[:1] if _chained(document) else made:
            modules.setdefault(block.module if block else "no stage compared", []).append((index, case, block))
    explain = (document.get("explain") or {}).get("summary")
    parts = [f"<h3>Summary: {len(failing)} of {len(document['cases'])} cases fail</h3>"]
    if explain:
        parts.append(explain_summary(explain))
    parts.append("<table><tr><th>kernel module</th><th>cases failing</th><th>first divergent stage</th>"
                 "<th>why (each failing case)</th></tr>")
    for module, entries in modules.items():
        stages: dict[str, int] = {}
        for _, _, block in entries:
            if block is not None:
                stages[block.stage["stage"]] = stages.get(block.stage["stage"], 0) + 1
        first = ", ".join(f"{escape(stage)} ({count})" for stage, count in
                          sorted(stages.items(), key=lambda item: ORDER.get(item[0], len(ORDER)))) or "—"
        lines = []
        for index, case, block in entries[:40]:
            where = f" step {block.step} {block.stage['stage']}" if block else ""
            text = _invalid(case) or headline(case, block)
            lines.append(f"<a href='#{_anchor(number, index)}'>{escape(case['case'])}</a>{escape(where)}: "
                         f"<span class='headline'>{escape(text)}</span>")
        if len(entries) > 40:
            lines.append(f"<span class='left-out'>… and {len(entries) - 40} more (below)</span>")
        count = len({case["case"] for _, case, _ in entries})
        parts.append(f"<tr><td><code>{escape(module)}</code></td><td>{count}</td><td>{first}</td>"
                     f"<td>{'<br>'.join(lines)}</td></tr>")
    parts.append("</table>")
    return "".join(parts)


def _rejected_line(rejected: list[dict]) -> str:
    if not rejected:
        return ""
    names = ", ".join(escape(case["case"]) for case in rejected)
    return (f"<details><summary>{len(rejected)} oracle-rejected cases: every step rejected as stored, nothing "
            f"compared</summary><p class='message'>{names}</p></details>")


def _bisect(found: dict) -> str:
    first = found.get("first_divergence") or {}
    where = ", ".join(f"{key} {value}" for key, value in first.items()) if first else "none"
    return (f"<h3>Bisect</h3><table><tr><th>first divergence</th><td>{escape(where)}</td></tr>"
            f"<tr><th>divergent stages, isolated</th><td>{escape(', '.join(found['isolated_divergent_stages']))}"
            f"</td></tr><tr><th>origin</th><td>{escape(str(found.get('origin')))}</td></tr></table>")


# --- verdict matrix --------------------------------------------------------------------------


def case_verdicts(document: dict, case: dict) -> dict[str, str]:
    """Stage -> status of one case: the device verdicts, or what a verify case's failures say."""
    if case.get("verdicts"):
        return {stage: entry["status"] if isinstance(entry, dict) else str(entry)
                for stage, entry in case["verdicts"].items()}
    if _invalid(case) is not None:
        return {stage: INVALID for stage in STAGE_NAMES}
    failing = {stage["stage"] for step in case.get("steps", []) for stage in step.get("stages", [])}
    if case.get("failure") or (not case["passed"] and not failing):
        return {stage: "failed" for stage in STAGE_NAMES}
    if not case.get("steps_compared") and case.get("rejected_steps"):
        return {stage: NOT_COMPARED for stage in STAGE_NAMES}
    return {stage: DIVERGED if stage in failing else IDENTICAL for stage in STAGE_NAMES}


def verdict_matrix(document: dict, cases: list[dict], found: dict[str, list[Block]] | None = None) -> str:
    """Cases × stages, coloured by verdict; a stage folded under another is drawn as inherited."""
    found = found or {}
    left = len(cases) - MAX_MATRIX_ROWS
    cases = cases[:MAX_MATRIX_ROWS]
    label_width = max(len(case["case"]) for case in cases) * 7 + 8
    header = 130
    width, height = label_width + CELL * len(STAGE_NAMES) + 4, header + CELL * len(cases) + 4
    svg = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' font-size='11'"
           " font-family='monospace'>"]
    for column, stage in enumerate(STAGE_NAMES):
        x = label_width + column * CELL + CELL // 2
        svg.append(f"<text transform='translate({x + 4},{header - 4}) rotate(-90)'>{escape(stage)}</text>")
    seen = set()
    for row, case in enumerate(cases):
        y = header + row * CELL
        folded = {entry.stage["stage"] for block in found.get(case["case"], []) for entry in block.folded}
        starts = {block.stage["stage"] for block in found.get(case["case"], [])}
        svg.append(f"<text x='0' y='{y + CELL - 3}'>{escape(case['case'])}</text>")
        verdicts = case_verdicts(document, case)
        for column, stage in enumerate(STAGE_NAMES):
            status = verdicts.get(stage, NOT_APPLICABLE)
            if status == DIVERGED and stage in folded and stage not in starts:
                status = INHERITED
            seen.add(status)
            colour = STATUS_COLOURS.get(status, ODD_COLOUR)
            svg.append(f"<rect x='{label_width + column * CELL}' y='{y}' width='{CELL - 1}' height='{CELL - 1}' "
                       f"fill='{colour}'><title>{escape(case['case'])} {escape(stage)}: {escape(status)}</title></rect>")
    svg.append("</svg>")
    legend = "".join(f"<span><i style='background:{STATUS_COLOURS.get(status, ODD_COLOUR)}'></i>{escape(status)}</span>"
                     for status in sorted(seen))
    more = f"<p class='left-out'>… and {left} more cases not drawn.</p>" if left > 0 else ""
    return f"<div class='legend'>{legend}</div>" + "".join(svg) + more


# --- one failing case -------------------------------------------------------------------------


def reduce_command(document: dict, case: dict) -> str | None:
    """The `reduce` command line of a device run's case (its reproduce command without what diff alone
    takes), None for a command with nothing to reduce."""
    words = shlex.split(case["reproduce"])
    if document["command"] not in ("diff", "explain", "bisect") or len(words) < 2 or words[1] not in (
            "diff", "explain", "bisect"):
        return None
    kept, skip = [words[0], "reduce"], False
    for word in words[2:]:
        if skip:
            skip = False
        elif word in ("--stage", "--mode", "--tolerance", "--repeat", "--replay", "--invariance", "--shard"):
            skip = True
        elif word not in ("--explain",):
            kept.append(word)
    return shlex.join(kept)


def _case_detail(number: int, index: int, document: dict, case: dict, made: list[Block]) -> str:
    parts = [f"<section class='case' id='{_anchor(number, index)}'><h3>{escape(case['case'])}</h3>",
             f"<p class='why'>reproduce the case: <code>{escape(case['reproduce'])}</code></p>"]
    reason = _invalid(case)
    if reason is not None:
        parts.append(f"<p class='why'><b>invalid</b>: {escape(reason)}</p></section>")
        return "".join(parts)
    if case.get("failure"):
        parts.append(f"<p class='why'><b>{escape(case['failure']['type'])}</b>: "
                     f"{escape(case['failure']['message'])}</p>")
    for step in case.get("steps", []):
        for failure in ([step["failure"]] if step.get("failure") else []) + step.get("findings", []):
            parts.append(f"<p class='why'>step {step['step']}: <b>{escape(failure['type'])}</b>: "
                         f"{escape(failure['message'])}<br>reproduce: <code>{escape(failure['reproduce'])}</code></p>")
    reduce = reduce_command(document, case)
    for block in made:
        parts.append(_block(block, reduce))
    parts.append("</section>")
    return "".join(parts)


def _block(block: Block, reduce: str | None) -> str:
    stage = block.stage
    kernel = f" [{stage['kernel']}]" if stage.get("kernel") else " (host oracle)"
    parts = [f"<div class='block'><h4>{escape(stage['stage'])} step {block.step}{escape(kernel)}</h4>"]
    if block.explanation is not None:
        parts.append(_explanation(block.explanation))
    if stage.get("diagnosis"):
        parts.append(_diagnosis(stage["diagnosis"]))
    parts.append(f"<p class='why'>reproduce: <code>{escape(stage['reproduce'])}</code>")
    if reduce:
        parts.append(f"<br>reduce to a minimal case: <code>{escape(reduce)}</code>")
    parts.append("</p>")
    for tensor in stage["tensors"][:MAX_TENSORS]:
        parts.append(_tensor_card(stage["stage"], tensor))
    if len(stage["tensors"]) > MAX_TENSORS:
        parts.append(f"<p class='left-out'>… and {len(stage['tensors']) - MAX_TENSORS} more tensors.</p>")
    if block.folded:
        names = ", ".join(f"{entry.stage['stage']} (step {entry.step})" for entry in block.folded)
        several = len(block.folded) > 1
        parts.append(f"<details><summary>{len(block.folded)} stage{'s' if several else ''} only "
                     f"inherit{'' if several else 's'} this divergence: {escape(names)}</summary>")
        for entry in block.folded:
            messages = "<br>".join(escape(tensor["message"]) for tensor in entry.stage["tensors"])
            parts.append(f"<p class='why'><b>{escape(entry.stage['stage'])}</b> step {entry.step}: "
                         f"{escape(entry.why)}<br><span class='message'>{messages}</span><br>reproduce: "
                         f"<code>{escape(entry.stage['reproduce'])}</code></p>")
        parts.append("</details>")
    parts.append("</div>")
    return "".join(parts)


def _explanation(entry: dict) -> str:
    rows = [("verdict", entry["verdict"]), ("headline", entry["headline"])]
    cause = entry.get("cause")
    if cause:
        rows.append(("cause", f"{cause['name']}: reproduces the device payload bit for bit "
                              f"({cause['elements']} elements)"))
    closest = entry.get("closest")
    if closest and not cause:
        rows.append(("closest trial", f"{closest['name']}: {closest['mismatches']} of {closest['elements']} "
                                      f"elements still differ (the reference's own: {entry.get('baseline')})"))
    if entry.get("note"):
        rows.append(("note", entry["note"]))
    if entry.get("first_element"):
        rows.append(("evidence (first element)", _flat(entry["first_element"])))
    search = entry.get("search")
    if search:
        rows.append(("search", f"{search['singles']} single ingredients, {search['combinations']} combinations"
                               + (f" (capped at {search['cap']}, {search['untried']} untried)" if search["capped"] else "")))
    for name, why in (entry.get("skipped") or {}).items():
        rows.append((f"not tried: {name}", why))
    rows.append(("kernel", entry.get("kernel") or "host oracle"))
    body = "".join(f"<tr><th>{escape(key)}</th><td>{escape(str(value))}</td></tr>" for key, value in rows)
    return f"<table><tr><th colspan='2'>explanation</th></tr>{body}</table>"


def _diagnosis(findings: list[dict]) -> str:
    rows = ["<table><tr><th>diagnosis</th><th>tensor</th><th>covers</th><th>finding</th><th>where (evidence)</th></tr>"]
    for finding in findings:
        rows.append(f"<tr><td><b>{escape(finding['kind'])}</b></td><td>{escape(finding['tensor'])}</td>"
                    f"<td>{finding['covered']}/{finding['differing']}</td><td>{escape(finding['headline'])}</td>"
                    f"<td class='message'>{escape(_flat(finding['evidence']))}</td></tr>")
    rows.append("</table>")
    return "".join(rows)


def _flat(value, depth: int = 0) -> str:
    """A small JSON value in one readable line (nested dicts as key: value, lists shortened)."""
    if isinstance(value, dict):
        return "; ".join(f"{key}: {_flat(item, depth + 1)}" for key, item in value.items() if item not in (None, [], {}))
    if isinstance(value, list):
        shown = ", ".join(_flat(item, depth + 1) for item in value[:8])
        return f"[{shown}{', …' if len(value) > 8 else ''}]"
    if isinstance(value, float):
        return f"{value:.8g}"
    return str(value)


def _tensor_card(stage: str, tensor: dict) -> str:
    parts = [f"<div class='card'><b>{escape(stage)}/{escape(tensor['tensor'])}</b> "
             f"{escape(tensor['dtype'])}{escape(str(tensor['shape']))} over "
             f"{escape(' × '.join(tensor['axes']))}<div class='message'>{escape(tensor['message'])}</div>"]
    if tensor.get("histogram"):
        parts.append(power_histogram(tensor["histogram"], "ULP distance of the differing elements"))
    if tensor.get("heatmap"):
        parts.append(heatmap(tensor["heatmap"], f"mismatches over {' × '.join(tensor['heatmap']['axes'])}",
                             tensor.get("first")))
    parts.append("</div>")
    return "".join(parts)


def power_histogram(histogram: dict, title: str, unit: str = "2^") -> str:
    """Bars of counts per power of two (and zero), log-scaled heights, as inline SVG."""
    labels = (["0"] if histogram["zero"] else []) + [
        f"{unit}{histogram['first_power'] + index}" for index in range(len(histogram["counts"]))]
    counts = ([histogram["zero"]] if histogram["zero"] else []) + list(histogram["counts"])
    if not counts:
        return ""
    bar, gap, plot_height, top, bottom = 18, 4, 120, 20, 40
    width = max(7 * len(title) + 140, len(counts) * (bar + gap) + 50)
    peak = math.log10(max(counts) + 1)
    svg = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{top + plot_height + bottom}' "
           "font-size='10' font-family='sans-serif'>",
           f"<text x='0' y='12' font-size='12'>{escape(title)} (count, log scale)</text>",
           f"<line x1='40' y1='{top + plot_height}' x2='{width}' y2='{top + plot_height}' stroke='#444'/>"]
    for index, (label, count) in enumerate(zip(labels, counts)):
        height = 0 if count == 0 else max(2, plot_height * math.log10(count + 1) / peak)
        x = 44 + index * (bar + gap)
        svg.append(f"<rect x='{x}' y='{top + plot_height - height:.1f}' width='{bar}' height='{height:.1f}' "
                   f"fill='#1f77b4'><title>{escape(label)}: {count}</title></rect>")
        svg.append(f"<text transform='translate({x + 12},{top + plot_height + 6}) rotate(60)'>{escape(label)}</text>")
    svg.append(f"<text x='0' y='{top + 10}'>{max(counts)}</text></svg>")
    return "".join(svg)


MIN_CELL, MAX_CELL = 12, 28  # heatmap cells in pixels, whatever the extent


def _bin_range(index: int, extent: int, bins: int) -> tuple[int, int]:
    """The positions bin ``index`` pools (placement.mismatch_heatmap: position p goes to p * bins // extent)."""
    return -(-index * extent // bins), -(-(index + 1) * extent // bins) - 1


def _span(axis: str, low: int, high: int) -> str:
    return f"{axis}={low}" if low == high else f"{axis}={low}..{high}"


def heatmap(grid: dict, title: str, first: dict | None = None) -> str:
    """Mismatch counts on a grid, white to red, rows the first axis, as inline SVG: cells of at least
    MIN_CELL pixels, both axes named and ticked with the positions they pool, every cell's span and count
    (and the first differing element's values and bits) in its hover title."""
    counts = grid["counts"]
    rows, columns = len(counts), len(counts[0]) if counts else 0
    (row_axis, column_axis), (row_extent, column_extent) = grid["axes"], grid["extent"]
    cell = max(MIN_CELL, min(MAX_CELL, 576 // max(1, columns), 384 // max(1, rows)))
    left, top = 12 + 7 * max(len(str(row_extent - 1)), len(row_axis) + 2), 46
    width, height = left + columns * cell + 40, top + rows * cell + 34
    peak = max((max(row) for row in counts if row), default=0)
    svg = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{max(width, 320)}' height='{height}' font-size='10' "
           "font-family='sans-serif'>",
           f"<text x='0' y='12' font-size='12'>{escape(title)} (extent {row_extent} × {column_extent})</text>",
           f"<text x='{left}' y='28' font-size='11'>{escape(column_axis)} →</text>",
           f"<text x='0' y='{top - 4}' font-size='11'>{escape(row_axis)} ↓</text>",
           f"<rect x='{left}' y='{top}' width='{columns * cell}' height='{rows * cell}' fill='#ffffff' stroke='#999'/>"]
    for index in sorted({0, columns - 1}):
        low, high = _bin_range(index, column_extent, columns)
        svg.append(f"<text x='{left + index * cell + 1}' y='{top - 4}'>{low if index == 0 else high}</text>")
    for index in sorted({0, rows - 1}):
        low, high = _bin_range(index, row_extent, rows)
        svg.append(f"<text x='{left - 4}' y='{top + index * cell + cell - 2}' text-anchor='end'>"
                   f"{low if index == 0 else high}</text>")
    for r, row in enumerate(counts):
        for c, count in enumerate(row):
            if count:
                shade = int(220 * (1 - count / peak))
                where = f"{_span(row_axis, *_bin_range(r, row_extent, rows))} {_span(column_axis, *_bin_range(c, column_extent, columns))}"
                svg.append(f"<rect x='{left + c * cell}' y='{top + r * cell}' width='{cell}' height='{cell}' "
                           f"fill='rgb(214,{shade},{shade})'><title>{escape(where)}: {count} differing</title></rect>")
    marker = _first_marker(grid, first, left, top, cell)
    if marker:
        svg.append(marker)
    svg.append(f"<text x='{left}' y='{top + rows * cell + 14}'>max {peak} per cell; "
               "outlined: the first difference</text></svg>")
    return "".join(svg)


def _first_marker(grid: dict, first: dict | None, left: int, top: int, cell: int) -> str:
    """An outline on the cell of the first differing element, its values and bit patterns as its title."""
    if not first or not first.get("coords"):
        return ""
    coords = dict(part.split("=", 1) for part in first["coords"].split() if "=" in part)
    try:
        spots = [int(coords[axis]) * bins // extent
                 for axis, bins, extent in zip(grid["axes"], grid["bins"], grid["extent"])]
    except (KeyError, ValueError, ZeroDivisionError):
        return ""
    ulp = f", {first['ulp']} ulp" if first.get("ulp") is not None else ""
    text = (f"first difference at {first['coords']}: expected {first['expected']} [{first['expected_bits']}], "
            f"actual {first['actual']} [{first['actual_bits']}]{ulp}")
    return (f"<rect x='{left + spots[1] * cell}' y='{top + spots[0] * cell}' width='{cell}' height='{cell}' "
            f"fill='none' stroke='#000' stroke-width='2'><title>{escape(text)}</title></rect>")


# --- tolerance and gap -----------------------------------------------------------------------


def _tolerance(judged: dict) -> str:
    verdict = "<span class='pass'>within</span>" if judged["within"] else "<span class='fail'>OUTSIDE</span>"
    rows = [f"<h3>Dual verdict against {escape(judged['file'])}: {verdict} the envelope</h3>",
            "<table><tr><th>stage/tensor</th><th>bit-exact</th><th>within envelope</th><th>statistics</th></tr>"]
    for stage in judged["stages"]:
        bounds = "<br>".join(
            f"{escape(bound['statistic'])} {bound['measured']:.3g} {'≤' if bound['within'] else '>'} {bound['limit']:.3g}"
            for bound in stage["bounds"])
        exact = "<span class='pass'>yes</span>" if stage["bit_exact"] else "<span class='fail'>no</span>"
        within = "<span class='pass'>yes</span>" if stage["within"] else "<span class='fail'>no</span>"
        rows.append(f"<tr><td>{escape(stage['stage'])}/{escape(stage['tensor'])}</td><td>{exact}</td>"
                    f"<td>{within}</td><td>{bounds}</td></tr>")
    rows.append("</table>")
    refused = judged.get("rejected_by_reference", [])
    if refused:
        steps = "; ".join(f"{escape(entry['case'])} step {entry['step']} ({escape(entry['stage'])})"
                          for entry in refused)
        rows.append(f"<p>Not compared: {len(refused)} step{'s' if len(refused) > 1 else ''} the reference refuses "
                    f"and the golden file's profile accepts (calibrate compares none): {steps}</p>")
    return "".join(rows)


def _mutation_rows(title: str, groups: dict) -> str:
    rows = [f"<table><tr><th>{escape(title)}</th><th>mutants</th><th>killed</th><th>faults</th><th>hangs</th>"
            "<th>survived</th><th>did not build</th><th>score</th></tr>"]
    for name, counts in groups.items():
        score = "n/a" if counts["score"] is None else f"{100 * counts['score']:.1f}%"
        rows.append(f"<tr><td><code>{escape(name)}</code></td><td>{counts['mutants']}</td><td>{counts['killed']}</td>"
                    f"<td>{counts['faults']}</td><td>{counts['hangs']}</td><td>{counts['survived']}</td>"
                    f"<td>{counts['build_failures']}</td><td>{score}</td></tr>")
    rows.append("</table>")
    return "".join(rows)


def _mutation(section: dict) -> str:
    """The mutation score, its tables, and every survivor as its source line before and after the change."""
    summary = section["summary"]
    score = "n/a" if summary["score"] is None else f"{100 * summary['score']:.1f}%"
    killing = summary["killed"] + summary["faults"] + summary["hangs"]
    parts = [f"<h3>Mutation score {score}: {killing} killed of {summary['judged']} judged "
             f"({summary['faults']} faults, {summary['hangs']} hangs), {summary['survived']} survived, "
             f"{summary['build_failures']} did not build; kernels {escape(section['kernels'])}, backend "
             f"{escape(section['backend'])}</h3>",
             _mutation_rows("operator", section["by_operator"]), _mutation_rows("file", section["by_file"])]
    survivors = [mutant for mutant in section["mutants"] if mutant["verdict"] == "survived"]
    augmented = {entry["mutant"]: entry for entry in (section.get("augment") or {}).get("survivors", [])}
    if survivors:
        parts.append(f"<h3>Survivors ({len(survivors)}): changes the suite passes</h3><table><tr><th>where</th>"
                     "<th>operator</th><th>line before / after</th><th>augment</th></tr>")
        for mutant in survivors:
            found = augmented.get(mutant["id"])
            note = "" if found is None else escape(
                f"killed by {found['case']} at {found['divergence']}" if found["outcome"] == "killed"
                else f"{found['outcome']} ({found['valid']} valid cases, {found['seconds']:.0f} s)")
            parts.append(f"<tr><td><code>{escape(mutant['file'])}:{mutant['line']}</code></td>"
                         f"<td>{escape(mutant['operator'])}</td><td><pre class='fail'>- {escape(mutant['before'])}</pre>"
                         f"<pre class='pass'>+ {escape(mutant['after'])}</pre></td><td>{note}</td></tr>")
        parts.append("</table>")
    return "".join(parts)


def _gap(gap: dict) -> str:
    parts = [f"<h3>Gap {escape(gap['expected_profile'])} → {escape(gap['actual_profile'])} "
             f"({escape(gap.get('mode', 'chained'))}): {gap['compared_steps']}/{gap['steps']} steps compared</h3>",
             "<table><tr>" + "".join(f"<th>{escape(column)}</th>" for column in COLUMNS) + "</tr>"]
    for cells in table_rows(gap):
        parts.append("<tr>" + "".join(f"<td>{escape(cell)}</td>" for cell in cells) + "</tr>")
    parts.append("</table><h3>Absolute error per tensor (powers of two)</h3>")
    for tensor in gap["tensors"]:
        if tensor.get("histogram") and tensor["histogram"]["counts"]:
            parts.append(f"<div class='card'><b>{escape(tensor['stage'])}/{escape(tensor['tensor'])}</b>"
                         + power_histogram(tensor["histogram"], "absolute error") + "</div>")
    return "".join(parts)
