"""``report --html``: one self-contained HTML page of one or more results documents.

Per document: what ran (command, golden file, kernels, device, verdict), a
case × stage verdict matrix, then per failing tensor its ULP histogram and a
heatmap of where its mismatches sit (csa_conform.compare.placement), the dual verdict
of ``diff --tolerance`` and the tables and error histograms of ``gap``. Every
plot is inline SVG written here; the page loads nothing at view time (no
script, no font, no network).
"""

from __future__ import annotations

from html import escape

from csa_conform._base.statuses import DIVERGED, IDENTICAL, NOT_APPLICABLE, NOT_COMPARED
from csa_conform.check.gap import COLUMNS, table_rows
from csa_conform.spec import STAGE_NAMES

MAX_TENSORS = 24  # failing tensors drawn per document; the rest are counted
STATUS_COLOURS = {
    IDENTICAL: "#2ca02c", DIVERGED: "#d62728", NOT_APPLICABLE: "#d9d9d9", NOT_COMPARED: "#f2f2f2",
    "rejected": "#aec7e8", "failed": "#8c1c13",
}
ODD_COLOUR = "#9467bd"  # non-deterministic, replay-mismatch and other findings of one mode
CELL = 14

STYLE = """
body { font-family: sans-serif; margin: 24px; color: #222; }
h1 { font-size: 22px; } h2 { font-size: 18px; margin-top: 32px; border-bottom: 1px solid #ccc; }
h3 { font-size: 15px; margin-bottom: 4px; }
table { border-collapse: collapse; font-size: 12px; margin: 8px 0; }
td, th { border: 1px solid #ccc; padding: 2px 6px; text-align: left; vertical-align: top; }
th { background: #f4f4f4; }
.pass { color: #2ca02c; font-weight: bold; } .fail { color: #d62728; font-weight: bold; }
.card { display: inline-block; vertical-align: top; margin: 8px 16px 8px 0; padding: 8px;
        border: 1px solid #ddd; border-radius: 4px; max-width: 760px; }
svg { display: block; margin: 4px 0; }
.message { font-family: monospace; font-size: 11px; white-space: pre-wrap; }
.legend span { display: inline-block; margin-right: 12px; font-size: 12px; }
.legend i { display: inline-block; width: 12px; height: 12px; margin-right: 4px; vertical-align: middle; }
"""


def render_html(documents: list[dict], title: str = "csa-conform report") -> str:
    parts = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{escape(title)}</title>",
             f"<style>{STYLE}</style></head><body><h1>{escape(title)}</h1>"]
    parts.append(_overview(documents))
    for number, document in enumerate(documents, 1):
        parts.append(_document(number, document))
    parts.append("</body></html>")
    return "\n".join(parts)


def _overview(documents: list[dict]) -> str:
    rows = ["<table><tr><th>#</th><th>command</th><th>golden file</th><th>verdict</th><th>cases</th>"
            "<th>failed</th><th>steps</th></tr>"]
    for number, document in enumerate(documents, 1):
        summary = document["summary"]
        verdict = "<span class='pass'>passed</span>" if document["passed"] else "<span class='fail'>FAILED</span>"
        golden = (document.get("golden") or {}).get("path", "")
        rows.append(f"<tr><td><a href='#run{number}'>{number}</a></td><td>{escape(document['command'])}</td>"
                    f"<td>{escape(str(golden))}</td><td>{verdict} (exit {document['exit_code']})</td>"
                    f"<td>{summary['cases']}</td><td>{summary['failed']}</td><td>{summary['steps']}</td></tr>")
    rows.append("</table>")
    return "".join(rows)


def _document(number: int, document: dict) -> str:
    parts = [f"<h2 id='run{number}'>{number}. {escape(document['command'])} "
             f"{escape(str((document.get('golden') or {}).get('path', '')))}</h2>", _provenance(document)]
    if document.get("error"):
        parts.append(f"<p class='fail'>{escape(document['error']['type'])}: {escape(document['error']['message'])}</p>")
    if document["command"] != "gap" and document["cases"]:
        parts.append("<h3>Verdicts: case × stage</h3>" + verdict_matrix(document))
    failing = list(_failing_tensors(document))
    if failing:
        parts.append(f"<h3>Failing tensors ({len(failing)}; ULP histogram and where the mismatches sit)</h3>")
        for where, tensor in failing[:MAX_TENSORS]:
            parts.append(_tensor_card(where, tensor))
        if len(failing) > MAX_TENSORS:
            parts.append(f"<p>… and {len(failing) - MAX_TENSORS} more failing tensors (see the JSON document).</p>")
    if document.get("tolerance"):
        parts.append(_tolerance(document["tolerance"]))
    if document.get("gap"):
        parts.append(_gap(document["gap"]))
    return "\n".join(parts)


def _provenance(document: dict) -> str:
    items = [("argv", " ".join(document.get("argv", [])))]
    golden = document.get("golden") or {}
    if golden.get("sha256"):
        items.append(("golden sha256", golden["sha256"]))
    kernels = document.get("kernels") or {}
    if kernels:
        described = kernels.get("kernels") or {}
        items.append(("kernels", f"{described.get('path', '')} (build {(described.get('build') or {}).get('profile', '')})"))
        device = kernels.get("device") or {}
        if device:
            items.append(("device", str(device.get("name", ""))))
    if document.get("control_run"):
        items.append(("control run", "yes: every stage ran on the host oracle"))
    rows = "".join(f"<tr><th>{escape(key)}</th><td>{escape(str(value))}</td></tr>" for key, value in items)
    return f"<table>{rows}</table>"


# --- verdict matrix --------------------------------------------------------------------------


def case_verdicts(document: dict, case: dict) -> dict[str, str]:
    """Stage -> status of one case: the device verdicts, or what a verify case's failures say."""
    if case.get("verdicts"):
        return {stage: entry["status"] if isinstance(entry, dict) else str(entry)
                for stage, entry in case["verdicts"].items()}
    failing = {stage["stage"] for step in case.get("steps", []) for stage in step.get("stages", [])}
    if case.get("failure") or (not case["passed"] and not failing):
        return {stage: "failed" for stage in STAGE_NAMES}
    if not case.get("steps_compared") and case.get("rejected_steps"):
        return {stage: "rejected" for stage in STAGE_NAMES}
    return {stage: DIVERGED if stage in failing else IDENTICAL for stage in STAGE_NAMES}


def verdict_matrix(document: dict) -> str:
    cases = document["cases"]
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
        svg.append(f"<text x='0' y='{y + CELL - 3}'>{escape(case['case'])}</text>")
        for column, stage in enumerate(STAGE_NAMES):
            status = case_verdicts(document, case).get(stage, "n/a")
            seen.add(status)
            colour = STATUS_COLOURS.get(status, ODD_COLOUR)
            svg.append(f"<rect x='{label_width + column * CELL}' y='{y}' width='{CELL - 1}' height='{CELL - 1}' "
                       f"fill='{colour}'><title>{escape(case['case'])} {escape(stage)}: {escape(status)}</title></rect>")
    svg.append("</svg>")
    legend = "".join(f"<span><i style='background:{STATUS_COLOURS.get(status, ODD_COLOUR)}'></i>{escape(status)}</span>"
                     for status in sorted(seen))
    return f"<div class='legend'>{legend}</div>" + "".join(svg)


# --- failing tensors -------------------------------------------------------------------------


def _failing_tensors(document: dict):
    for case in document["cases"]:
        for step in case.get("steps", []):
            for stage in step.get("stages", []):
                for tensor in stage.get("tensors", []):
                    yield f"{case['case']} step {step['step']} {stage['stage']}/{tensor['tensor']}", tensor


def _tensor_card(where: str, tensor: dict) -> str:
    parts = [f"<div class='card'><b>{escape(where)}</b><div class='message'>{escape(tensor['message'])}</div>"]
    if tensor.get("histogram"):
        parts.append(power_histogram(tensor["histogram"], "ULP distance of the differing elements"))
    if tensor.get("heatmap"):
        parts.append(heatmap(tensor["heatmap"], f"mismatches over {' × '.join(tensor['heatmap']['axes'])}"))
    parts.append("</div>")
    return "".join(parts)


def power_histogram(histogram: dict, title: str, unit: str = "2^") -> str:
    """Bars of counts per power of two (and zero), log-scaled heights, as inline SVG."""
    import math

    labels = (["0"] if histogram["zero"] else []) + [
        f"{unit}{histogram['first_power'] + index}" for index in range(len(histogram["counts"]))]
    counts = ([histogram["zero"]] if histogram["zero"] else []) + list(histogram["counts"])
    if not counts:
        return ""
    bar, gap, plot_height, top, bottom = 18, 4, 120, 20, 40
    width = max(240, len(counts) * (bar + gap) + 50)
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


def heatmap(grid: dict, title: str) -> str:
    """Mismatch counts on a grid, white to red, rows the first axis, as inline SVG."""
    counts = grid["counts"]
    rows, columns = len(counts), len(counts[0]) if counts else 0
    cell = max(4, min(12, 480 // max(1, columns)))
    left, top = 40, 30
    width, height = left + columns * cell + 10, top + rows * cell + 30
    peak = max(max(row) for row in counts) if rows and columns else 0
    svg = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{max(width, 260)}' height='{height}' font-size='10' "
           "font-family='sans-serif'>",
           f"<text x='0' y='12' font-size='12'>{escape(title)} (extent {grid['extent'][0]} × {grid['extent'][1]})</text>",
           f"<text x='0' y='{top + 10}'>{escape(grid['axes'][0])}↓</text>",
           f"<text x='{left}' y='{top - 4}'>{escape(grid['axes'][1])}→</text>",
           f"<rect x='{left}' y='{top}' width='{columns * cell}' height='{rows * cell}' fill='#ffffff' stroke='#999'/>"]
    for r, row in enumerate(counts):
        for c, count in enumerate(row):
            if count:
                shade = int(220 * (1 - count / peak))
                svg.append(f"<rect x='{left + c * cell}' y='{top + r * cell}' width='{cell}' height='{cell}' "
                           f"fill='rgb(214,{shade},{shade})'><title>{count}</title></rect>")
    svg.append(f"<text x='{left}' y='{top + rows * cell + 14}'>max {peak} per cell</text></svg>")
    return "".join(svg)


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
    return "".join(rows)


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
