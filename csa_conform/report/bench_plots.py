"""``report --html`` of a ``bench`` run: per case a table of its rows, the roofline bars, baseline vs new
and every timed row's samples against the SM clock they ran at.

The table, the roofline bars and the baseline bars come from the results
document's ``bench`` section; the samples from the raw-samples sidecar the
section names (``samples_file``), which ``report`` reads when it is there and
the page says is missing otherwise. A roofline bar is the % of the peak of
the bound that applies (memory or compute), the measured peak's and the
data sheet's each; baseline vs new draws both medians with their 95% CIs,
the new one coloured by the gate's verdict; a samples plot is one dot per
kept sample (time against SM clock; against the sample's order where no
clock was read, as under ``--backend host``), the interleaved baseline's in
grey. Plots are inline SVG, as every plot of the page.
"""

from __future__ import annotations

import math
from html import escape
from pathlib import Path

from csa_conform.bench.section import read_samples

MEMORY_COLOUR, COMPUTE_COLOUR = "#1f77b4", "#ff7f0e"
BASELINE_COLOUR, SAMPLE_COLOUR = "#7f7f7f", "#17becf"
VERDICT_COLOURS = {"SLOW": "#d62728", "FAST": "#2ca02c", "SAME": "#1f77b4", "AMBG": "#e6ab02"}
MAX_POINTS = 300  # dots per samples plot: longer rows are thinned evenly (the sidecar keeps them all)
LABEL, BAR, PLOT = 260, 14, 360  # row labels, bar height and plot width, in pixels


def bench_samples(document: dict) -> tuple[dict | None, str | None]:
    """A bench document's sidecar, or why the page has none (a malformed sidecar is a UsageError)."""
    section = document.get("bench")
    if section is None:
        return None, None
    name = section["samples_file"]
    if not name:
        return None, "no samples were kept (bench --samples FILE keeps them): the samples plots are left out"
    if not Path(name).is_file():
        return None, f"the samples file {name} is not there: the samples plots are left out"
    return read_samples(Path(name)), None


def bench_html(section: dict, sidecar: dict | None, missing: str | None) -> str:
    """The bench part of one document's page; ``missing`` says why there are no samples, if there are none."""
    parts = ["<h3>Bench</h3>"]
    if section["caveat"]:
        parts.append(f"<p class='fail'>{escape(section['caveat'])}</p>")
    baseline = section["baseline"]
    parts.append(f"<p class='why'>timer <code>{escape(str(section['timer']))}</code>, mode "
                 f"<code>{escape(section['mode'])}</code>"
                 + (f", baseline {escape(baseline['kind'])} <code>{escape(baseline['path'])}</code>" if baseline else "")
                 + ", " + _counts(section["summary"]) + "</p>")
    if section.get("persisting_l2"):
        parts.append(f"<p class='why'>persisting L2: {escape(section['persisting_l2'])}</p>")
    if section.get("devices"):
        parts.append(_devices(section["devices"]))
    if missing:
        parts.append(f"<p class='left-out'>{escape(missing)}</p>")
    kept = {(row["case"], row["row"]): row for row in (sidecar or {}).get("rows", [])}
    for case in section["cases"]:
        parts.append(_case(case, kept))
    return "".join(parts)


def _counts(summary: dict) -> str:
    return ", ".join(f"{count} {escape(name.replace('_', ' '))}" for name, count in summary.items())


def _devices(devices: dict) -> str:
    """The devices of a --devices run, each with the cases it stands out on; the rows below are the first's."""
    flagged: dict[int, list[str]] = {}
    for outlier in devices["outliers"]:
        flagged.setdefault(outlier["device"], []).append(outlier["reason"])
    rows = "".join(f"<tr><td>{run['device']}</td><td>{escape(str(run['name']))}</td>"
                   f"<td>{_counts(run['summary'])}</td>"
                   f"<td class='fail'>{'<br>'.join(map(escape, flagged.get(run['device'], [])))}</td></tr>"
                   for run in devices["runs"])
    return (f"<table><tr><th>device</th><th>name</th><th>rows</th><th>outlier on</th></tr>{rows}</table>"
            f"<p class='why'>outlier rule: {escape(devices['rule'])}; the rows below are device "
            f"{devices['runs'][0]['device']}'s</p>")


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.4f}"


def _peak(row: dict) -> str:
    roof = row.get("roofline") or {}
    cells = [f"{roof[label]['percent']:.1f}% of {label} ({roof[label]['bound']})"
             for label in ("measured", "nominal") if roof.get(label)]
    return "<br>".join(cells) or "-"


def _case(case: dict, kept: dict) -> str:
    ratio = case["step_vs_sum"]
    parts = [f"<div class='block'><h4>{escape(case['case'])} step {case['step']}</h4>",
             f"<p class='why'>conformance check {case['conformance_s']:.2f} s (compile, load and first launches)"
             + (f"; step / sum of its launches: {ratio:.3f}" if ratio is not None else "") + "</p>",
             "<table><tr><th>row</th><th>status</th><th>median ms</th><th>95% CI ms</th><th>n</th>"
             "<th>% of peak (bound)</th><th>gate</th></tr>"]
    for row in case["rows"]:
        ci = f"{_ms(row['ci_s'][0])} – {_ms(row['ci_s'][1])}" if "ci_s" in row else "-"
        gate = row.get("gate")
        verdict = f"<b>{escape(gate['verdict'])}</b> ×{gate['ratio']:.3f}: {escape(gate['reason'])}" if gate else "-"
        message = f"<br><span class='message'>{escape(row['message'])}</span>" if row.get("message") else ""
        parts.append(f"<tr><td>{escape(row['row'])}</td><td>{escape(row['status'])}{message}</td>"
                     f"<td>{_ms(row.get('median_s'))}</td><td>{ci}</td><td>{row.get('samples', 0)}</td>"
                     f"<td>{_peak(row)}</td><td class='message'>{verdict}</td></tr>")
    parts.append("</table>")
    roofed = [row for row in case["rows"] if row.get("roofline")]
    if roofed:
        parts.append(roofline_bars(roofed))
    gated = [row for row in case["rows"] if row.get("gate") and row.get("baseline")]
    if gated:
        parts.append(baseline_bars(gated))
    for row in case["rows"]:
        samples = kept.get((case["case"], row["row"]))
        if samples is not None and samples["times_s"]:
            parts.append(f"<div class='card'>{samples_plot(row['row'], samples)}</div>")
    parts.append("</div>")
    return "".join(parts)


def _svg(width: int, height: int, title: str) -> list[str]:
    return [f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' font-size='10' "
            "font-family='sans-serif'>", f"<text x='0' y='12' font-size='12'>{escape(title)}</text>"]


def roofline_bars(rows: list[dict]) -> str:
    """Per row a bar for each peak it was held against: the % of that peak of the bound that applies."""
    bars = [(row["row"], label, row["roofline"][label]) for row in rows for label in ("measured", "nominal")
            if row["roofline"].get(label)]
    top = 22
    svg = _svg(LABEL + PLOT + 190, top + len(bars) * (BAR + 4) + 30,
               "% of peak per row (blue: memory-bound, orange: compute-bound; the line is 100%)")
    for index, (name, label, roof) in enumerate(bars):
        y = top + index * (BAR + 4)
        width = PLOT * min(roof["percent"], 100.0) / 100
        colour = MEMORY_COLOUR if roof["bound"] == "memory" else COMPUTE_COLOUR
        text = f"{name}: {roof['percent']:.1f}% of the {label} {roof['bound']} peak"
        svg.append(f"<text x='{LABEL - 4}' y='{y + BAR - 3}' text-anchor='end'>{escape(name)} ({label})</text>")
        svg.append(f"<rect x='{LABEL}' y='{y}' width='{max(width, 1):.1f}' height='{BAR}' fill='{colour}'>"
                   f"<title>{escape(text)}</title></rect>")
        svg.append(f"<text x='{LABEL + PLOT + 6}' y='{y + BAR - 3}'>{roof['percent']:.1f}% {roof['bound']}</text>")
    bottom = top + len(bars) * (BAR + 4)
    svg.append(f"<line x1='{LABEL + PLOT}' y1='{top - 2}' x2='{LABEL + PLOT}' y2='{bottom}' stroke='#444'/>")
    svg.append(f"<text x='{LABEL}' y='{bottom + 14}'>0%</text>"
               f"<text x='{LABEL + PLOT}' y='{bottom + 14}' text-anchor='middle'>100%</text></svg>")
    return "".join(svg)


def baseline_bars(rows: list[dict]) -> str:
    """Per row the baseline's median (grey) above the new one's (the verdict's colour), CI whiskers on both."""
    top, pair = 22, 2 * BAR + 10
    scale = PLOT / max(max(row["ci_s"][1], row["baseline"]["ci_s"][1], row["median_s"],
                           row["baseline"]["median_s"]) for row in rows)
    svg = _svg(LABEL + PLOT + 260, top + len(rows) * pair + 30,
               "baseline (grey) vs new median per row, 95% CI whiskers (new: red SLOW, green FAST, blue SAME, "
               "yellow AMBG)")
    for index, row in enumerate(rows):
        y = top + index * pair
        gate = row["gate"]
        svg.append(f"<text x='{LABEL - 4}' y='{y + BAR + 3}' text-anchor='end'>{escape(row['row'])}</text>")
        for offset, median, (low, high), colour, who in (
                (0, row["baseline"]["median_s"], row["baseline"]["ci_s"], BASELINE_COLOUR, "baseline"),
                (BAR + 2, row["median_s"], row["ci_s"], VERDICT_COLOURS.get(gate["verdict"], BASELINE_COLOUR), "new")):
            middle = y + offset + BAR / 2
            svg.append(f"<rect x='{LABEL}' y='{y + offset}' width='{max(median * scale, 1):.1f}' height='{BAR}' "
                       f"fill='{colour}'><title>{who}: median {_ms(median)} ms, CI {_ms(low)} – {_ms(high)} ms"
                       "</title></rect>")
            svg.append(f"<line x1='{LABEL + low * scale:.1f}' y1='{middle}' x2='{LABEL + high * scale:.1f}' "
                       f"y2='{middle}' stroke='#000'/>")
        svg.append(f"<text x='{LABEL + PLOT + 6}' y='{y + BAR + 3}'>{escape(gate['verdict'])} ×{gate['ratio']:.3f} "
                   f"[{gate['ci'][0]:.3f}, {gate['ci'][1]:.3f}] band ±{gate['threshold']:.1%}</text>")
    bottom = top + len(rows) * pair
    svg.append(f"<text x='{LABEL}' y='{bottom + 14}'>0 ms</text><text x='{LABEL + PLOT}' y='{bottom + 14}' "
               f"text-anchor='end'>{_ms(PLOT / scale)} ms</text></svg>")
    return "".join(svg)


def _thinned(count: int) -> list[int]:
    """At most MAX_POINTS positions of ``count``, evenly spread, the first and last included."""
    if count <= MAX_POINTS:
        return list(range(count))
    return sorted({round(index * (count - 1) / (MAX_POINTS - 1)) for index in range(MAX_POINTS)})


def samples_plot(name: str, samples: dict) -> str:
    """One dot per kept sample: its time (us, log scale) against its SM clock (MHz), or its order without
    clocks."""
    series = [(samples, SAMPLE_COLOUR)] + ([(samples["baseline"], BASELINE_COLOUR)] if samples.get("baseline") else [])
    clocked = all(clock is not None for entry, _ in series for clock in entry["clocks_mhz"])
    xs = [entry["clocks_mhz"] if clocked else list(range(len(entry["times_s"]))) for entry, _ in series]
    ys = [[math.log10(max(time, 1e-12) * 1e6) for time in entry["times_s"]] for entry, _ in series]
    x_low, x_high = min(map(min, xs)), max(map(max, xs))
    y_low, y_high = min(map(min, ys)), max(map(max, ys))
    x_span, y_span = x_high - x_low, (y_high - y_low) or 1.0
    left, top, width, height = 56, 34, 280, 150
    svg = _svg(left + width + 20, top + height + 48, name)
    svg.append("<text x='0' y='26'>time (us, log scale) of each kept sample"
               + (", the baseline's in grey" if len(series) > 1 else "") + "</text>")
    svg.append(f"<rect x='{left}' y='{top}' width='{width}' height='{height}' fill='#ffffff' stroke='#999'/>")
    for (entry, colour), x_values, y_values in zip(series, xs, ys):
        for index in _thinned(len(x_values)):
            x = left + 3 + (width - 6) * ((x_values[index] - x_low) / x_span if x_high > x_low else 0.5)
            y = top + height - 3 - (height - 6) * (y_values[index] - y_low) / y_span
            svg.append(f"<circle cx='{x:.1f}' cy='{y:.1f}' r='2.5' fill='{colour}'/>")
    axis = "sample order (no SM clock read)" if not clocked else "SM clock (MHz)" if x_high > x_low else \
        f"SM clock (MHz): every sample at {x_low:g}"
    thinned = f"; {MAX_POINTS} dots a series at most, evenly spread" if max(map(len, ys)) > MAX_POINTS else ""
    svg.append(f"<text x='{left - 4}' y='{top + 8}' text-anchor='end'>{10 ** y_high:.4g}</text>"
               f"<text x='{left - 4}' y='{top + height}' text-anchor='end'>{10 ** y_low:.4g}</text>"
               f"<text x='{left}' y='{top + height + 14}'>{x_low:.5g}</text>"
               f"<text x='{left + width}' y='{top + height + 14}' text-anchor='end'>{x_high:.5g}</text>"
               f"<text x='{left}' y='{top + height + 28}'>{escape(axis)}: {len(ys[0])} samples{thinned}</text></svg>")
    return "".join(svg)
