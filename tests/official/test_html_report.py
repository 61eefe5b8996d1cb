"""report --html: one self-contained page with the verdict matrix, histograms, heatmaps and gap tables,
rendered in headless Chromium (skipped, with the reason, where there is none; `make test` installs it
as root). The screenshot must show the plots' colours: red diverged cells and heatmap cells, green
identical cells, blue histogram bars."""

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
from csa_conform.exitcodes import ExitCode

CASES = "random.r*-bias-[1B]*"  # ratio 128 and ratio 4, four cases each pattern
Y = "cases/random.r128-bias-BNSC/steps/0000/stages/sparse_sink_softmax_attention/Y"
RECORDS = "cases/random.r4-bias-B111/steps/0000/stages/compression_update/present_compressed_kv"
CHROMIUM = next((path for path in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if path), None)
RED, GREEN, BLUE = (214, 39, 40), (44, 160, 44), (31, 119, 180)


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


def test_chromium_renders_the_plots(page, tmp_path):
    if CHROMIUM is None:
        pytest.skip("no headless Chromium (chromium) on PATH: `make browser` installs it as root (apt-get install chromium)")
    shot = tmp_path / "report.png"
    subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    "--window-size=1200,1800", f"--screenshot={shot}", page.as_uri()],
                   check=True, capture_output=True, timeout=120)
    pixels = png_pixels(shot)
    assert len(pixels) == 1200 * 1800
    counts = {colour: pixels.count(colour) for colour in (RED, GREEN, BLUE)}
    assert counts[GREEN] > 2000, counts  # identical cells of the matrix
    assert counts[RED] > 100, counts  # the diverged cells and the heatmaps
    assert counts[BLUE] > 500, counts  # histogram bars
