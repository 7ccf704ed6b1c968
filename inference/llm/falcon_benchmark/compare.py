"""One table and one picture: every mode and shape of a run beside the recipe's published figures.

Reads the load test's report.json files (`inference.llm.loadtest_report` defines every statistic). The recipe gives
one tokens/s and one p90 figure per mode and shape without its client count, so each row shows ours at the
sweep's top concurrency, and our best throughput over the sweep with the concurrency that reached it.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Sequence
from pathlib import Path

from inference.llm.falcon_benchmark.recipe import MODE_NAMES, PUBLISHED

FIELDS = ("mode", "shape", "status", "unit", "published_tokens_per_s", "published_p90_s", "top_concurrency",
          "output_per_s", "vs_published", "p90_s", "best_output_per_s", "best_concurrency", "ttft_p50_s",
          "ttft_p90_s", "itl_p50_s", "itl_p90_s", "itl_p99_s", "client_output_per_s_p50", "error_rate")


def _stat(step: dict | None, key: str, field: str) -> float | None:
    block = (step or {}).get(key)
    return block.get(field) if block else None


def row(mode: str, shape: str, report: dict | None) -> dict:
    published = PUBLISHED.get((mode, shape))
    entry: dict = dict.fromkeys(FIELDS)
    entry.update(mode=mode, shape=shape, status="not run",
                 published_tokens_per_s=published.tokens_per_s if published else None,
                 published_p90_s=published.p90_s if published else None)
    steps = [step for step in (report or {}).get("steps", []) if step.get("requests")]
    if not steps:
        return entry
    top = max(steps, key=lambda step: step["concurrency"])
    best = max(steps, key=lambda step: step["output_per_s"] or 0)
    entry.update(
        status="interrupted" if report.get("interrupted") else "ok" if report.get("passed") else "errors",
        unit=f"{report.get('unit')}, lower bound" if report.get("output_lower_bound") else report.get("unit"),
        top_concurrency=top["concurrency"], output_per_s=top["output_per_s"],
        p90_s=_stat(top, "latency_s", "p90"), best_output_per_s=best["output_per_s"],
        best_concurrency=best["concurrency"], ttft_p50_s=_stat(top, "ttft_s", "p50"),
        ttft_p90_s=_stat(top, "ttft_s", "p90"), itl_p50_s=_stat(top, "itl_s", "p50"),
        itl_p90_s=_stat(top, "itl_s", "p90"), itl_p99_s=_stat(top, "itl_s", "p99"),
        client_output_per_s_p50=_stat(top, "client_output_per_s", "p50"), error_rate=top["error_rate"])
    if published and top["output_per_s"] is not None and entry["unit"] == "tokens":
        entry["vs_published"] = top["output_per_s"] / published.tokens_per_s
    return entry


def rows(modes: Sequence[str], shapes: Sequence[str], reports: dict[tuple[str, str], dict]) -> list[dict]:
    return [row(mode, shape, reports.get((mode, shape))) for shape in shapes for mode in modes]


def _n(value, digits: int = 2, scale: float = 1.0) -> str:
    if value is None:
        return "-"
    value = value * scale
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.{digits}f}"


def format_table(entries: list[dict]) -> str:
    headers = ["shape", "mode", "recipe tok/s", "recipe p90 s", "clients", "ours out/s", "x recipe", "ours p90 s",
               "best out/s @", "ttft p50 s", "ttft p90 s", "itl p50 ms", "itl p90 ms", "itl p99 ms",
               "out/s/client", "err %", "unit", "status"]
    body = []
    for e in entries:
        best = f"{_n(e['best_output_per_s'], 1)} @{e['best_concurrency']}" if e["best_concurrency"] else "-"
        body.append([e["shape"], MODE_NAMES.get(e["mode"], e["mode"]), _n(e["published_tokens_per_s"]),
                     _n(e["published_p90_s"]), str(e["top_concurrency"] or "-"), _n(e["output_per_s"], 1),
                     _n(e["vs_published"]), _n(e["p90_s"]), best, _n(e["ttft_p50_s"], 3), _n(e["ttft_p90_s"], 3),
                     _n(e["itl_p50_s"], 1, 1000), _n(e["itl_p90_s"], 1, 1000), _n(e["itl_p99_s"], 1, 1000),
                     _n(e["client_output_per_s_p50"], 1), _n(e["error_rate"], 1, 100), e["unit"] or "-",
                     e["status"]])
    widths = [max(len(h), *(len(r[i]) for r in body)) if body else len(h) for i, h in enumerate(headers)]

    def line(cells):
        return "  ".join(c.ljust(w) if i < 2 or i >= len(cells) - 2 else c.rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths, strict=True))).rstrip()

    out = [line(headers), line(["-" * w for w in widths]), *(line(r) for r in body)]
    out.append("recipe: Falcon-40B fp16, ml.g5.48xlarge, TP 8, its client count unpublished; ours at the sweep's top "
               "concurrency ('clients'); 'x recipe' only where ours is counted in tokens")
    out.append("ttft: time to first token; itl: gaps between consecutive tokens (streamed modes only; dynamic "
               "batching answers whole)")
    return "\n".join(out)


def to_csv(entries: list[dict]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=FIELDS, lineterminator="\n")
    writer.writeheader()
    for entry in entries:
        writer.writerow({key: "" if entry[key] is None else entry[key] for key in FIELDS})
    return buffer.getvalue()


def write(entries: list[dict], summary: dict, out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, csv_path = out_dir / "compare.json", out_dir / "compare.csv"
    json_path.write_text(json.dumps({**summary, "rows": entries}, indent=2) + "\n")
    csv_path.write_text(to_csv(entries))
    return [json_path, csv_path]


def draw(modes: Sequence[str], shapes: Sequence[str], reports: dict[tuple[str, str], dict], path: Path) -> Path:
    """Rows: shapes; columns: throughput, p90 latency, p90 TTFT against clients; the recipe's as dashed lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(len(shapes), 3, figsize=(15, 4.2 * len(shapes)), constrained_layout=True,
                                squeeze=False)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    panels = (("output per second", lambda s: s["output_per_s"], "tokens_per_s"),
              ("p90 latency, s", lambda s: _stat(s, "latency_s", "p90"), "p90_s"),
              ("p90 time to first token, s", lambda s: _stat(s, "ttft_s", "p90"), None))
    for r, shape in enumerate(shapes):
        for c, (title, value, published_field) in enumerate(panels):
            axis = axes[r][c]
            for index, mode in enumerate(modes):
                colour = colours[index % len(colours)]
                steps = sorted((reports.get((mode, shape)) or {}).get("steps", []), key=lambda s: s["concurrency"])
                if steps:
                    axis.plot([s["concurrency"] for s in steps], [_nan(value(s)) for s in steps], marker="o",
                              color=colour, label=MODE_NAMES.get(mode, mode))
                published = PUBLISHED.get((mode, shape))
                if published and published_field:
                    axis.axhline(getattr(published, published_field), color=colour, linestyle="--", linewidth=1,
                                 label=f"recipe: {MODE_NAMES.get(mode, mode)}")
            axis.set_title(f"{shape} (in x out tokens): {title}")
            axis.set_xlabel("concurrent clients")
            axis.set_ylim(bottom=0)
            axis.grid(True, alpha=0.3)
            axis.legend(fontsize="x-small")
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def _nan(value: float | None) -> float:
    return math.nan if value is None else value
