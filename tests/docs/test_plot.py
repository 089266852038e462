"""benchmarks/plot.py: the SVG bar charts of the benchmarks (docs/figures/bench-*.svg)."""

from __future__ import annotations

import importlib.util
import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SVG = "{http://www.w3.org/2000/svg}"


@pytest.fixture(scope="module")
def plot():
    spec = importlib.util.spec_from_file_location("bench_plot", ROOT / "benchmarks" / "plot.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


SAMPLE = {
    "charts": [
        {
            "name": "sample",
            "title": "Sample <chart> & co",
            "scale": "pair",
            "pairs": [
                {"label": "scan", "source": "table_scan.py", "unit": "s", "plaintext": 2.0, "encrypted": 2.5},
                {"label": "memory", "unit": "MiB", "plaintext": 400, "encrypted": 100},
                {"label": "throughput", "unit": "MB/s", "higher_is_better": True, "plaintext": 80.0, "encrypted": 60.0},
                {"label": "relative", "ratio": [0.8, 0.9]},
            ],
        }
    ]
}


def bars(root: ET.Element) -> list[tuple[str, float, float]]:
    """(plaintext|encrypted, value, drawn width) of every bar, in document order."""
    found = []
    for rect in root.iter(f"{SVG}rect"):
        classes = (rect.get("class") or "").split()
        if "bar" in classes:
            kind = "plaintext" if "plaintext" in classes else "encrypted"
            found.append((kind, float(rect.get("data-value")), float(rect.get("width"))))
    return found


def render(plot, document) -> ET.Element:
    (chart,) = plot.load_charts(document)
    text = plot.chart_svg(chart["title"], chart["pairs"], subtitle=chart["subtitle"], scale=chart["scale"])
    return ET.fromstring(text)


def test_valid_svg_with_title_and_text(plot):
    root = render(plot, SAMPLE)
    assert root.tag == f"{SVG}svg"
    assert float(root.get("width")) > 0 and float(root.get("height")) > 0
    assert root.find(f"{SVG}title").text == "Sample <chart> & co"
    texts = [t.text for t in root.iter(f"{SVG}text")]
    assert "scan" in texts and "table_scan.py" in texts and "2.5 s" in texts


def test_bars_proportional_within_each_pair(plot):
    found = bars(render(plot, SAMPLE))
    assert len(found) == 8
    for (k1, v1, w1), (k2, v2, w2) in zip(found[::2], found[1::2]):
        assert (k1, k2) == ("plaintext", "encrypted")
        assert w1 / w2 == pytest.approx(v1 / v2, rel=1e-3)
        assert max(w1, w2) == pytest.approx(330, abs=0.01)  # the longer bar of a pair fills its axis


def test_shared_scale_is_one_axis(plot):
    document = json.loads(json.dumps(SAMPLE))
    document["charts"][0]["scale"] = "shared"
    found = bars(render(plot, document))
    widest = max(v for _, v, _ in found)
    for _, value, width in found:
        assert width == pytest.approx(330 * value / widest, abs=0.006)  # drawn to 1/100 px


def test_ratio_labels(plot):
    root = render(plot, SAMPLE)
    ratios = [t.text for t in root.iter(f"{SVG}text") if t.get("class") == "ratio"]
    # time: plaintext / encrypted; size likewise; throughput: encrypted / plaintext; a range as given
    assert ratios == ["0.80", "4.00", "0.75", "0.80\u20130.90"]
    relative = bars(root)[-2:]
    assert [v for _, v, _ in relative] == [1.0, pytest.approx(1 / 0.8)]  # drawn at the least favourable end


@pytest.mark.parametrize(
    "pair, words",
    [
        ({"source": "x.py", "plaintext": 1, "encrypted": 2}, "without a label"),
        ({"label": "scan", "plaintext": 0, "encrypted": 2}, "scan: plaintext and encrypted must be positive"),
        ({"label": "scan", "plaintext": 1}, "scan: plaintext and encrypted must be positive"),
        ({"label": "scan", "ratio": [0.9, 0.8]}, "scan: ratio"),
        ({"label": "scan", "ratio": -1}, "scan: ratio"),
    ],
)
def test_bad_pairs_named(plot, pair, words):
    with pytest.raises(ValueError, match=words):
        plot.load_charts({"charts": [{"name": "c", "pairs": [pair]}]})


def test_bad_chart_name_refused(plot):
    with pytest.raises(ValueError, match="plain file name"):
        plot.load_charts({"charts": [{"name": "../x", "pairs": [{"label": "a", "ratio": 1}]}]})


def test_from_dataplane_json(plot, tmp_path):
    report = {
        "rows": {
            "parquet": {"bytes": 1, "plain_s": 0.5, "enc_s": 0.4, "ratio": 1.25},
            "avro": {"bytes": 1, "plain_s": 2.0, "enc_s": 2.0, "ratio": 1.0},
        },
        "presentations": {},
    }
    source = tmp_path / "run.json"
    source.write_text(json.dumps(report))
    assert plot.main([str(source), "--from", "dataplane", "--out", str(tmp_path / "out")]) == 0
    root = ET.parse(tmp_path / "out" / "bench-dataplane.svg").getroot()
    found = bars(root)
    expected = [("plaintext", 0.5), ("encrypted", 0.4), ("plaintext", 2.0), ("encrypted", 2.0)]
    assert [(k, v) for k, v, _ in found] == expected
    assert found[0][2] / found[2][2] == pytest.approx(0.25, rel=1e-3)  # shared axis


def test_committed_charts_match_results(plot, tmp_path):
    """docs/figures/bench-*.svg are what plot.py draws from benchmarks/results.json."""
    assert plot.main([str(ROOT / "benchmarks" / "results.json"), "--out", str(tmp_path)]) == 0
    made = sorted(p.name for p in tmp_path.glob("bench-*.svg"))
    assert made, "no charts drawn"
    for name in made:
        committed = ROOT / "docs" / "figures" / name
        assert committed.read_text() == (tmp_path / name).read_text(), f"{committed} is stale: rerun benchmarks/plot.py"


FIGURES = sorted((ROOT / "docs" / "figures").glob("*.svg"))


@pytest.mark.parametrize("figure", FIGURES, ids=[f.name for f in FIGURES])
def test_docs_figure_is_plain_svg_with_alt_text(figure):
    """Every figure of the docs: well-formed SVG with a title, text as text, an opaque
    white background (legible on a dark theme), small; shown by a page with alt text."""
    assert figure.stat().st_size < 20_000
    root = ET.parse(figure).getroot()
    assert root.tag == f"{SVG}svg" and root.get("viewBox")
    assert (root.find(f"{SVG}title").text or "").strip()
    background = root.find(f"{SVG}rect")
    assert background.get("fill") == "#ffffff" and background.get("width") == root.get("width")
    assert len(list(root.iter(f"{SVG}text"))) > 5
    assert not list(root.iter(f"{SVG}image")) and "<script" not in figure.read_text()
    shown = [
        page for page in (ROOT / "docs").rglob("*.md")
        if f"figures/{figure.name}" in (text := page.read_text())
        and "```{figure}" in text and "\nalt: >-\n" in text
    ]
    assert shown, f"{figure.name} is on no docs page (with alt text)"


REPORTS = {
    # the keys each benchmark's --json output has (see its main())
    "table_scan": ({"scans": {"full": {"encrypted": {"median_s": 2.0}, "plaintext": {"median_s": 1.0}}},
                    "planning": {"encrypted": {"per_manifest_ms": 0.6}, "plaintext": {"per_manifest_ms": 0.3}}},
                   [("plaintext", 1.0), ("encrypted", 2.0), ("plaintext", 0.3), ("encrypted", 0.6)]),
    "table_append": ({"partitioned": False, "plaintext_s": 3.0, "encrypted_s": 3.3,
                      "plaintext_cpu_s": 2.0, "encrypted_cpu_s": 2.1},
                     [("plaintext", 3.0), ("encrypted", 3.3), ("plaintext", 2.0), ("encrypted", 2.1)]),
    "bench_avro": ({"seconds": {"read/plain": 1.0, "read/enc": 1.1, "split/enc": 1.2,
                                "write/plain": 2.0, "write/enc": 2.2}},
                   [("plaintext", 1.0), ("encrypted", 1.1), ("plaintext", 1.0), ("encrypted", 1.2),
                    ("plaintext", 2.0), ("encrypted", 2.2)]),
}


@pytest.mark.parametrize("script", sorted(REPORTS))  # not "benchmark": pytest-benchmark's fixture
def test_from_benchmark_json(plot, script):
    report, expected = REPORTS[script]
    (chart,) = plot.load_charts(plot.charts_from(script, report))
    root = ET.fromstring(plot.chart_svg(chart["title"], chart["pairs"], scale=chart["scale"]))
    assert [(k, v) for k, v, _ in bars(root)] == expected


def test_from_unknown_benchmark_refused(plot, tmp_path):
    source = tmp_path / "run.json"
    source.write_text("{}")
    with pytest.raises(SystemExit):
        plot.main([str(source), "--from", "spark_files", "--out", str(tmp_path)])
    assert not list(tmp_path.glob("*.svg"))
