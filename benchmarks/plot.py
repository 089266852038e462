"""Bar charts (SVG) of the benchmarks' figures: encrypted against plaintext, ratio labelled.

    python benchmarks/plot.py benchmarks/results.json --out docs/figures
    python benchmarks/plot.py --from dataplane run.json --out /tmp/charts

No dependency beyond the standard library; the output is plain SVG (text as text, a
white background, so it reads the same on a light or a dark page).

Input.  A JSON file of charts, as ``benchmarks/results.json`` (the figures the
README's performance tables quote, each with the benchmark that printed it)::

    {"charts": [{"name": "table-scale",                 # the file: table-scale.svg
                 "title": "...", "subtitle": "...",
                 "scale": "pair",                       # or "shared" (one axis for all)
                 "pairs": [{"label": "full scan, 100,000 files",
                            "source": "table_scale.py",
                            "unit": "s",                # shown after each value
                            "higher_is_better": false,  # true for throughput (MB/s)
                            "plaintext": 3.90, "encrypted": 4.02}]}]}

A pair may instead give only the benchmark's ratio, ``"ratio": 0.87`` or a range
``"ratio": [0.86, 0.90]``: it is drawn as time relative to plaintext (plaintext 1.00,
encrypted 1 / ratio; for a range, the least favourable end).

Or, with ``--from NAME``, the ``--json`` output of one of the benchmarks that print one
(``dataplane``, ``table_scan``, ``table_append``, ``bench_avro``)::

    python benchmarks/dataplane.py --json > run.json
    python benchmarks/plot.py --from dataplane run.json --out /tmp/charts

Every label says ``ratio`` = plaintext performance / encrypted performance, as the
README's tables do: plaintext time / encrypted time for times and sizes, encrypted /
plaintext for throughput; 1.00 means encryption is free.

To regenerate the charts of the documentation after a new run, put the new figures in
``benchmarks/results.json`` and run the first command above (``make docs`` then shows
them on the Performance page).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape

__all__ = ["Pair", "chart_svg", "charts_from", "load_charts", "main"]

# layout (px)
WIDTH = 760
LABEL_W = 250  # pair labels, right-aligned before the bars
BAR_X = LABEL_W + 16
BAR_MAX = 330  # the longest bar
RATIO_X = WIDTH - 20  # ratio labels, right-aligned
BAR_H = 13
PAIR_GAP = 14
TOP = 78
FONT = "DejaVu Sans, Helvetica, Arial, sans-serif"
COLOURS = {"plaintext": "#a3a9b1", "encrypted": "#2f6db5", "text": "#1f2328", "muted": "#59636e",
           "rule": "#d0d7de", "background": "#ffffff", "worse": "#b35900"}


class Pair:
    """One benchmark case: its plaintext and encrypted figures (same unit)."""

    def __init__(self, spec: Mapping[str, Any]):
        try:
            self.label = str(spec["label"])
        except KeyError:
            raise ValueError(f"a pair without a label: {dict(spec)!r}") from None
        self.source = str(spec.get("source", ""))
        self.unit = str(spec.get("unit", ""))
        self.higher_is_better = bool(spec.get("higher_is_better", False))
        ratio = spec.get("ratio")
        if ratio is not None:
            low, high = (ratio, ratio) if isinstance(ratio, (int, float)) else tuple(ratio)
            if not (_positive(low) and _positive(high)) or low > high:
                raise ValueError(f"{self.label}: ratio {ratio!r} is not a positive number or [low, high]")
            self.plaintext, self.encrypted = 1.0, 1.0 / low  # relative time, least favourable end
            self.ratio_text = f"{low:.2f}" if low == high else f"{low:.2f}\u2013{high:.2f}"
            self.ratio = low
            self.unit = self.unit or "\u00d7"
            self.relative = True
        else:
            self.plaintext, self.encrypted = spec.get("plaintext"), spec.get("encrypted")
            if not (_positive(self.plaintext) and _positive(self.encrypted)):
                raise ValueError(f"{self.label}: plaintext and encrypted must be positive numbers (or give a ratio)")
            # plaintext performance / encrypted performance
            if self.higher_is_better:
                self.ratio = self.encrypted / self.plaintext
            else:
                self.ratio = self.plaintext / self.encrypted
            self.ratio_text = f"{self.ratio:.2f}"
            self.relative = False


def _positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def _number(value: float) -> str:
    """A value as the README writes it: at most four significant figures, thousands
    separated, no padding zeros (1.4 MiB, 22.3 ms, 1,031 MiB)."""
    return f"{value:,.4g}" if value < 10_000 else f"{value:,.0f}"


def _text(x: float, y: float, content: str, *, size: int = 12, anchor: str = "start", fill: str = "text",
          weight: str | None = None, cls: str | None = None) -> str:
    attrs = f'x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}" fill="{COLOURS[fill]}"'
    if weight:
        attrs += f' font-weight="{weight}"'
    if cls:
        attrs += f' class="{cls}"'
    return f"<text {attrs}>{escape(content)}</text>"


def chart_svg(title: str, pairs: Sequence[Pair], *, subtitle: str = "", scale: str = "pair") -> str:
    """The SVG document of one chart: for each pair a plaintext bar over an encrypted
    bar, proportional to the values (one axis for the chart with ``scale="shared"``,
    one per pair with ``"pair"``, for pairs of different units), the value at each
    bar's end and the ratio on the right."""
    if not pairs:
        raise ValueError(f"chart {title!r} has no pairs")
    if scale not in ("pair", "shared"):
        raise ValueError(f"chart {title!r}: scale must be 'pair' or 'shared', not {scale!r}")
    pair_h = 2 * BAR_H + 4 + PAIR_GAP
    height = TOP + len(pairs) * pair_h + 46
    top_all = max(max(p.plaintext, p.encrypted) for p in pairs)
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
        f'viewBox="0 0 {WIDTH} {height}" font-family="{FONT}" role="img" aria-labelledby="title">',
        f"<title id=\"title\">{escape(title)}</title>",
        f'<rect width="{WIDTH}" height="{height}" rx="6" fill="{COLOURS["background"]}"/>',
        _text(20, 28, title, size=16, weight="bold"),
    ]
    if subtitle:
        out.append(_text(20, 48, subtitle, size=12, fill="muted"))
    # legend
    lx = BAR_X
    for key in ("plaintext", "encrypted"):
        out.append(f'<rect x="{lx}" y="{TOP - 20}" width="12" height="12" fill="{COLOURS[key]}"/>')
        out.append(_text(lx + 17, TOP - 10, key, size=12))
        lx += 100
    out.append(_text(RATIO_X, TOP - 10, "ratio", size=12, anchor="end", weight="bold"))
    y = TOP
    for index, pair in enumerate(pairs):
        if index:
            out.append(f'<line x1="20" y1="{y - PAIR_GAP / 2:.1f}" x2="{WIDTH - 20}" y2="{y - PAIR_GAP / 2:.1f}" '
                       f'stroke="{COLOURS["rule"]}" stroke-width="1"/>')
        top = top_all if scale == "shared" else max(pair.plaintext, pair.encrypted)
        mid = y + BAR_H + 2
        if pair.source:
            out.append(_text(LABEL_W, mid - 3, pair.label, size=12, anchor="end"))
            out.append(_text(LABEL_W, mid + 12, pair.source, size=10, anchor="end", fill="muted"))
        else:
            out.append(_text(LABEL_W, mid + 4, pair.label, size=12, anchor="end"))
        for row, key in enumerate(("plaintext", "encrypted")):
            value = getattr(pair, key)
            width = BAR_MAX * value / top
            by = y + row * (BAR_H + 4)
            out.append(f'<rect class="bar {key}" data-value="{value!r}" x="{BAR_X}" y="{by}" '
                       f'width="{width:.2f}" height="{BAR_H}" fill="{COLOURS[key]}"/>')
            shown = f"{_number(value)} {pair.unit}".rstrip() if not pair.relative else f"{value:.2f}{pair.unit}"
            out.append(_text(BAR_X + width + 5, by + BAR_H - 2, shown, size=11, fill="muted"))
        fill = "text" if pair.ratio >= 0.95 else "worse"
        out.append(_text(RATIO_X, mid + 5, pair.ratio_text, size=13, anchor="end", fill=fill, weight="bold",
                         cls="ratio"))
        y += pair_h
    note = ("ratio = plaintext / encrypted performance (time: plaintext time / encrypted time); "
            "1.00 = encryption is free")
    out.append(_text(20, height - 26, note, size=11, fill="muted"))
    axis = "bars share one axis" if scale == "shared" else "each pair has its own axis (units differ)"
    axis += "; a range is drawn at its least favourable end; orange: ratio below 0.95"
    out.append(_text(20, height - 11, axis, size=11, fill="muted"))
    out.append("</svg>")
    return "\n".join(out) + "\n"


def load_charts(document: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The charts of a results document (``{"charts": [...]}``), each checked: a name,
    a title and its pairs (:class:`Pair`)."""
    charts = document.get("charts") if isinstance(document, Mapping) else None
    if not isinstance(charts, list) or not charts:
        raise ValueError('expected {"charts": [...]} with at least one chart')
    result = []
    for chart in charts:
        name = chart.get("name")
        if not isinstance(name, str) or not name or "/" in name or name.startswith("."):
            raise ValueError(f"chart name {name!r} is not a plain file name")
        result.append({
            "name": name,
            "title": str(chart.get("title", name)),
            "subtitle": str(chart.get("subtitle", "")),
            "scale": chart.get("scale", "pair"),
            "pairs": [Pair(p) for p in chart.get("pairs") or []],
        })
    return result


def charts_from(benchmark: str, report: Mapping[str, Any]) -> dict[str, Any]:
    """A results document of one chart from the ``--json`` output of ``benchmark``."""
    pairs: list[dict[str, Any]] = []
    if benchmark == "dataplane":
        for name, row in report["rows"].items():
            pairs.append({"label": f"{name} read", "unit": "s", "plaintext": row["plain_s"], "encrypted": row["enc_s"]})
    elif benchmark == "table_scan":
        for name, entry in report["scans"].items():
            pairs.append({"label": f"{name} scan", "unit": "s", "plaintext": entry["plaintext"]["median_s"],
                          "encrypted": entry["encrypted"]["median_s"]})
        planning = report.get("planning")
        if planning:
            pairs.append({"label": "planning, per manifest", "unit": "ms",
                          "plaintext": planning["plaintext"]["per_manifest_ms"],
                          "encrypted": planning["encrypted"]["per_manifest_ms"]})
    elif benchmark == "table_append":
        kind = "partitioned" if report.get("partitioned") else "unpartitioned"
        pairs.append({"label": f"append, {kind}", "unit": "s", "plaintext": report["plaintext_s"],
                      "encrypted": report["encrypted_s"]})
        pairs.append({"label": f"append CPU, {kind}", "unit": "s", "plaintext": report["plaintext_cpu_s"],
                      "encrypted": report["encrypted_cpu_s"]})
    elif benchmark == "bench_avro":
        seconds = report["seconds"]
        for label, plain, enc in (("read", "read/plain", "read/enc"), ("read in 4 splits", "read/plain", "split/enc"),
                                  ("write", "write/plain", "write/enc")):
            pairs.append({"label": label, "unit": "s", "plaintext": seconds[plain], "encrypted": seconds[enc]})
    else:
        raise ValueError(f"--from {benchmark!r}: expected one of dataplane, table_scan, table_append, bench_avro")
    for pair in pairs:
        pair["source"] = f"{benchmark}.py"
    return {"charts": [{"name": benchmark.replace("_", "-"), "title": f"{benchmark}.py: encrypted vs plaintext",
                        "subtitle": "medians of the run; shorter is faster", "scale": "shared", "pairs": pairs}]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("input", type=Path, help="a results document, or a benchmark's --json output with --from")
    parser.add_argument("--from", dest="benchmark", default=None,
                        help="the benchmark whose --json output INPUT is "
                        "(dataplane, table_scan, table_append, bench_avro)")
    parser.add_argument("--out", type=Path, default=Path("."), help="directory of the SVG files (default: .)")
    args = parser.parse_args(argv)
    try:
        document = json.loads(args.input.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        parser.error(f"{args.input}: {exc}")
    try:
        if args.benchmark:
            document = charts_from(args.benchmark, document)
        charts = load_charts(document)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        parser.error(f"{args.input}: {exc}")
    args.out.mkdir(parents=True, exist_ok=True)
    for chart in charts:
        path = args.out / f"bench-{chart['name']}.svg"
        path.write_text(chart_svg(chart["title"], chart["pairs"], subtitle=chart["subtitle"], scale=chart["scale"]))
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
