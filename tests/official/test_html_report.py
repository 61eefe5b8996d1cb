"""report --html: one self-contained page with the verdict matrix, histograms, heatmaps and gap tables,
and a bench run's roofline bars, baseline vs new and samples plots, rendered in headless Chromium
(skipped, with the reason, where there is none; `make browser` installs it as root). The screenshots
must show the plots' colours: red diverged cells and heatmap cells, green identical cells, blue
histogram bars; the bench's blue or orange roofline bars, grey baseline bars and cyan sample dots."""

from __future__ import annotations

import json
import re
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import pytest
from click.testing import CliRunner
from golden_edits import rewrite

from csa_conform.cli import main
from csa_conform.device.host import GXX
from csa_conform.exitcodes import ExitCode
from csa_conform.report.bench_plots import MAX_POINTS, samples_plot

CASES = "random.r*-bias-[1B]*"  # ratio 128 and ratio 4, four cases each pattern
Y = "cases/random.r128-bias-BNSC/steps/0000/stages/sparse_sink_softmax_attention/Y"
RECORDS = "cases/random.r4-bias-B111/steps/0000/stages/compression_update/present_compressed_kv"
CHROMIUM = next((path for path in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if path), None)
RED, GREEN, BLUE = (214, 39, 40), (44, 160, 44), (31, 119, 180)
ORANGE, GREY, CYAN = (255, 127, 14), (127, 127, 127), (23, 190, 207)
KERNELS = Path(__file__).resolve().parents[2] / "kernels"
BENCH_CASE = "random.r4-5out-i4-k3"  # one step, ratio 4: all five launches


def invoke(*args):
    return CliRunner().invoke(main, [str(arg) for arg in args])


@pytest.fixture(scope="module")
def page(tmp_path_factory) -> Path:
    """The page of a failing verify run (Y and record bytes altered, resealed), a gap run and a
    diff --tolerance control run (its dual verdicts)."""
    folder = tmp_path_factory.mktemp("html")
    golden = folder / "bad.h5"
    assert invoke("generate", "--case", CASES, "-o", golden, "-q").exit_code == ExitCode.OK

    def bump(array):
        array.reshape(-1)[::7] += 0.001

    def flip(array):
        array[0, 0, 3:60] ^= 1

    rewrite(golden, Y, bump)
    rewrite(golden, RECORDS, flip)
    verify = invoke("verify", golden, "--json")
    assert verify.exit_code == ExitCode.DIVERGED
    gap = invoke("gap", golden, "--case", "random.r128-*", "--json")
    assert gap.exit_code == ExitCode.OK
    tolerances = folder / "tolerances.toml"
    assert invoke("calibrate", golden, "-o", tolerances).exit_code == ExitCode.OK
    dual = invoke("diff", golden, "--force-host", "all", "--tolerance", tolerances, "--json")
    (folder / "verify.json").write_text(verify.stdout)
    (folder / "gap.json").write_text(gap.stdout)
    (folder / "diff.json").write_text(dual.stdout)
    html = folder / "report.html"
    result = invoke("report", folder / "verify.json", folder / "gap.json", folder / "diff.json", "--html", html)
    assert result.exit_code == ExitCode.OK, result.output
    return html


def test_the_page_is_self_contained(page):
    text = page.read_text()
    assert "<script" not in text and "<link" not in text and "src=" not in text and "url(" not in text
    assert set(re.findall(r"https?://[^'\" ]+", text)) == {"http://www.w3.org/2000/svg"}  # the SVG namespace only


def test_the_page_holds_matrix_histograms_heatmaps_and_gap_table(page):
    text = page.read_text()
    assert "Verdicts: case × stage" in text and "random.r128-bias-BNSC sparse_sink_softmax_attention: diverged" in text
    assert "ULP distance of the differing elements" in text
    assert "mismatches over s × h" in text and "mismatches over r × byte" in text
    assert "Gap reference → official" in text and "absolute error" in text
    assert "Dual verdict against" in text and "sparse_sink_softmax_attention/Y" in text


def test_the_heatmap_puts_the_record_mismatches_where_they_are(page):
    document = json.loads((page.parent / "verify.json").read_text())
    tensors = [tensor for case in document["cases"] for step in case["steps"] for stage in step["stages"]
               for tensor in stage["tensors"]]
    records = next(tensor for tensor in tensors if tensor["tensor"] == "present_compressed_kv")
    grid = records["heatmap"]
    assert grid["axes"] == ["r", "byte"] and grid["extent"][1] == 583
    counts = grid["counts"]
    assert sum(map(sum, counts)) == records["mismatches"] == 57
    assert sum(counts[0]) == 57  # every altered byte is in record 0
    y = next(tensor for tensor in tensors if tensor["tensor"] == "Y")
    assert sum(y["histogram"]["counts"]) + y["histogram"]["zero"] == y["mismatches"]


def png_pixels(path: Path) -> list[tuple[int, int, int]]:
    """RGB pixels of an 8-bit RGB or RGBA PNG (what Chromium writes), filters undone."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    chunks, offset = {}, 8
    while offset < len(data):
        length, kind = struct.unpack(">I4s", data[offset:offset + 8])
        chunks.setdefault(kind, []).append(data[offset + 8:offset + 8 + length])
        offset += 12 + length
    width, height, depth, colour = struct.unpack(">IIBB", chunks[b"IHDR"][0][:10])
    assert depth == 8 and colour in (2, 6)
    channels = 3 if colour == 2 else 4
    raw = zlib.decompress(b"".join(chunks[b"IDAT"]))
    stride = width * channels
    previous = bytearray(stride)
    pixels = []
    for row in range(height):
        start = row * (stride + 1)
        kind, line = raw[start], bytearray(raw[start + 1:start + 1 + stride])
        for i in range(stride):
            left = line[i - channels] if i >= channels else 0
            up, corner = previous[i], previous[i - channels] if i >= channels else 0
            if kind == 1:
                line[i] = (line[i] + left) & 255
            elif kind == 2:
                line[i] = (line[i] + up) & 255
            elif kind == 3:
                line[i] = (line[i] + (left + up) // 2) & 255
            elif kind == 4:
                p = left + up - corner
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
                line[i] = (line[i] + (left if pa <= pb and pa <= pc else up if pb <= pc else corner)) & 255
        pixels.extend(tuple(line[i:i + 3]) for i in range(0, stride, channels))
        previous = line
    return pixels


def screenshot(page: Path, shot: Path, height: int) -> list[tuple[int, int, int]]:
    if CHROMIUM is None:
        pytest.skip("no headless Chromium (chromium) on PATH: `make browser` installs it as root (apt-get install chromium)")
    subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    f"--window-size=1200,{height}", f"--screenshot={shot}", page.as_uri()],
                   check=True, capture_output=True, timeout=120)
    pixels = png_pixels(shot)
    assert len(pixels) == 1200 * height
    return pixels


def test_chromium_renders_the_plots(page, tmp_path):
    pixels = screenshot(page, tmp_path / "report.png", 1800)
    counts = {colour: pixels.count(colour) for colour in (RED, GREEN, BLUE)}
    assert counts[GREEN] > 2000, counts  # identical cells of the matrix
    assert counts[RED] > 100, counts  # the diverged cells and the heatmaps
    assert counts[BLUE] > 500, counts  # histogram bars


@pytest.fixture(scope="module")
def bench_page(tmp_path_factory) -> Path:
    """The page of a host bench run of the built-in kernels against themselves, its samples kept."""
    if GXX is None:
        pytest.skip("the host backend needs g++")
    folder = tmp_path_factory.mktemp("bench-html")
    result = invoke("bench", "--backend", "host", "--case", BENCH_CASE, "--time-cap", "0.3", "--baseline-kernels",
                    KERNELS, "--samples", folder / "samples.json", "--json")
    assert result.exit_code in (ExitCode.OK, ExitCode.SLOW), result.output  # host timings are noisy
    (folder / "bench.json").write_text(result.stdout)
    html = folder / "bench.html"
    assert invoke("report", folder / "bench.json", "--html", html).exit_code == ExitCode.OK
    return html


def test_the_bench_page_draws_roofline_baseline_and_samples(bench_page):
    text = bench_page.read_text()
    assert "<script" not in text and "src=" not in text
    document = json.loads((bench_page.parent / "bench.json").read_text())
    (case,) = document["bench"]["cases"]
    assert "host timings: not a device measurement" in text
    for row in case["rows"]:
        roof = row["roofline"]["measured"]
        assert f"{row['row']}: {roof['percent']:.1f}% of the measured {roof['bound']} peak" in text
        gate = row["gate"]
        assert f"{gate['verdict']} ×{gate['ratio']:.3f} [{gate['ci'][0]:.3f}, {gate['ci'][1]:.3f}]" in text
    kept = json.loads((bench_page.parent / "samples.json").read_text())["rows"]
    dots = sum(min(len(series["times_s"]), MAX_POINTS) for row in kept for series in (row, row["baseline"]))
    assert dots > len(case["rows"]) and text.count("<circle ") == dots
    assert text.count("sample order (no SM clock read)") == len(kept)  # the host reads no clock


def test_a_bench_page_whose_samples_file_is_gone_or_bad_says_so(bench_page, tmp_path):
    samples = bench_page.parent / "samples.json"
    moved = tmp_path / "samples.json"
    shutil.copy(samples, moved)
    samples.unlink()
    try:
        html = tmp_path / "bench.html"
        assert invoke("report", bench_page.parent / "bench.json", "--html", html).exit_code == ExitCode.OK
        text = html.read_text()
        assert f"the samples file {samples} is not there" in text and "<circle " not in text
        assert "% of peak per row" in text
        samples.write_text("{\"format\": \"something else\"}")
        result = invoke("report", bench_page.parent / "bench.json", "--html", html)
        assert result.exit_code == ExitCode.USAGE
        assert "not a csa-conform bench samples file" in result.output and "Traceback" not in result.output
    finally:
        shutil.copy(moved, samples)


def test_chromium_renders_the_bench_plots(bench_page, tmp_path):
    pixels = screenshot(bench_page, tmp_path / "bench.png", 2600)
    counts = {colour: pixels.count(colour) for colour in (BLUE, ORANGE, GREY, CYAN)}
    assert counts[BLUE] + counts[ORANGE] > 300, counts  # roofline bars (and SAME bars)
    assert counts[GREY] > 1000, counts  # baseline bars and the baseline's dots
    assert counts[CYAN] > 200, counts  # the new kernels' sample dots


def test_samples_are_placed_by_their_sm_clock_on_a_log_time_scale():
    """Three samples at 1500, 1750, 1980 MHz taking 1, 2, 4 ms: x in clock order, 2 ms half-way up."""
    plot = samples_plot("step", {"times_s": [4e-3, 1e-3, 2e-3], "clocks_mhz": [1980.0, 1500.0, 1750.0],
                                 "baseline": {"times_s": [3e-3], "clocks_mhz": [1600.0]}})
    dots = [(float(x), float(y), colour) for x, y, colour in
            re.findall(r"<circle cx='([0-9.]+)' cy='([0-9.]+)' r='[0-9.]+' fill='(#[0-9a-f]+)'/>", plot)]
    assert len(dots) == 4 and "SM clock (MHz): 3 samples" in plot
    (low_x, low_y, _), (mid_x, mid_y, _), (high_x, high_y, _) = sorted(dot for dot in dots if dot[2] == "#17becf")
    assert low_x < mid_x < high_x  # 1500, 1750, 1980 MHz from left to right
    assert low_y > mid_y > high_y  # 1, 2, 4 ms from bottom to top (SVG's y grows downwards)
    assert abs(mid_y - (low_y + high_y) / 2) < 0.1  # log10(2 ms) is half-way between log10(1) and log10(4)
    same = samples_plot("step", {"times_s": [1e-3, 2e-3], "clocks_mhz": [1980.0, 1980.0], "baseline": None})
    assert "every sample at 1980" in same
