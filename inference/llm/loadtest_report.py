"""Statistics and reports for `inference.llm.loadtest`: pure functions over recorded samples, no traffic.

Kept apart from the load generator so the numbers can be tested on known timings and so `--compare` can redraw
saved runs without importing boto3 or sending anything.

Definitions (the same for every target):
- A step's wall time runs from the moment every client has finished its warm-up to the moment the last
  measured request has returned. Warm-up requests are counted separately and never enter the statistics.
- `requests` are the measured requests sent; `ok` those that succeeded; `errors` the rest, by kind
  (`throttled`, `4xx`, `5xx`, `timeout`, `connection`, `other`); `error_rate` = errors / requests.
- `requests_per_s` = ok / wall time; `output_per_s` = output units of the successful requests / wall time.
  The unit is tokens for `--kind llm`, labels returned for `--kind sentiment`. Each answer's tokens are counted by
  one method (`inference.llm.stream` token_count): `details` (LMI's details.generated_tokens), `usage` (a chat
  answer's), `tokenizer`, or the larger of `ids` and `words`, both lower bounds; `token_methods` counts the
  successful answers per method, per step and for the run, and `output_lower_bound` is true when any answer was
  counted by ids or words.
- Latency and time to first byte are over successful requests only, so fast failures do not flatter them.
- Streamed answers (`--stream`) add, over successful streamed requests: `ttft_s`, time to first token (sending
  to the first line carrying text); `itl_s`, inter-token latency: per request (last text arrival - first) /
  (tokens - 1), once per gap, pooled over the step's requests. Their output is counted like any answer's, never
  one per line: vLLM merges tokens into one line under load.
- `client_output_per_s`: per successful request, its output / its latency, the rate one user sees;
  `output_per_s` is the rate of all clients together.
- Percentiles use linear interpolation between closest ranks, numpy's default method ("linear", Hyndman and
  Fan type 7): the q-th percentile of sorted x[0..n-1] sits at rank h = (n - 1) q / 100.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ERROR_KINDS = ("throttled", "4xx", "5xx", "timeout", "connection", "other")
PERCENTILES = (50, 90, 99)
REPORT_VERSION = 1


@dataclass
class Sample:
    """One request's outcome: `error` is None on success, else one of ERROR_KINDS with a short `detail`."""

    latency: float
    error: str | None = None
    ttfb: float | None = None
    output: int = 0
    detail: str = ""
    ttft: float | None = None  # time to first token of a streamed answer
    itl: list[float] = field(default_factory=list)  # gaps between its consecutive tokens
    method: str | None = None  # how `output` was counted (llm): details, usage, tokenizer, ids or words
    retries: int = 0  # times it was sent again after a throttled answer (--retries); latency counts them all


def percentile(values: Iterable[float], q: float) -> float | None:
    """The q-th percentile (0-100) by linear interpolation, as numpy.percentile's default; None when empty."""
    ordered = sorted(values)
    if not ordered:
        return None
    if not 0 <= q <= 100:
        raise ValueError(f"percentile must be between 0 and 100, got {q}")
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (rank - low) * (ordered[high] - ordered[low])


def mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def distribution(values: Sequence[float]) -> dict[str, float | None] | None:
    """p50/p90/p99, mean, min and max of `values`; None when there are none (e.g. no TTFB from SageMaker)."""
    if not values:
        return None
    summary: dict[str, float | None] = {f"p{q}": percentile(values, q) for q in PERCENTILES}
    summary.update(mean=mean(values), min=min(values), max=max(values))
    return summary


def summarize(samples: Sequence[Sample], wall_s: float, concurrency: int,
              warmup: Sequence[Sample] = ()) -> dict:
    """One step's report entry from its measured samples and wall time (seconds)."""
    ok = [sample for sample in samples if sample.error is None]
    errors = dict.fromkeys(ERROR_KINDS, 0)
    examples: dict[str, str] = {}
    for sample in samples:
        if sample.error is not None:
            kind = sample.error if sample.error in errors else "other"
            errors[kind] += 1
            examples.setdefault(kind, sample.detail)
    output = sum(sample.output for sample in ok)
    ttfbs = [sample.ttfb for sample in ok if sample.ttfb is not None]
    ttfts = [sample.ttft for sample in ok if sample.ttft is not None]
    gaps = [gap for sample in ok for gap in sample.itl]
    client_rates = [sample.output / sample.latency for sample in ok if sample.latency > 0]
    return {
        "concurrency": concurrency,
        "requests": len(samples),
        "ok": len(ok),
        "errors": errors,
        "error_count": len(samples) - len(ok),
        "error_rate": (len(samples) - len(ok)) / len(samples) if samples else 0.0,
        "error_examples": examples,
        "wall_s": wall_s,
        "requests_per_s": len(ok) / wall_s if wall_s > 0 else None,
        "output_total": output,
        "output_per_s": output / wall_s if wall_s > 0 else None,
        "latency_s": distribution([sample.latency for sample in ok]),
        "ttfb_s": distribution(ttfbs),
        "ttft_s": distribution(ttfts),
        "itl_s": distribution(gaps),
        "client_output_per_s": distribution(client_rates),
        "streamed_requests": len(ttfts),
        "token_methods": _count_methods(ok),
        "warmup_requests": len(warmup),
        "warmup_errors": sum(1 for sample in warmup if sample.error is not None),
        "retries": sum(sample.retries for sample in samples),
    }


def _count_methods(samples: Sequence[Sample]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for sample in samples:
        if sample.method is not None:
            counts[sample.method] = counts.get(sample.method, 0) + 1
    return counts


def methods(steps: Iterable[dict]) -> dict[str, int]:
    """Successful answers per counting method over all steps."""
    total: dict[str, int] = {}
    for step in steps:
        for method, count in (step.get("token_methods") or {}).items():
            total[method] = total.get(method, 0) + count
    return total


METHOD_NAMES = {"details": "LMI's details.generated_tokens", "usage": "the chat answer's usage.completion_tokens",
                "tokenizer": "the tokenizer", "ids": "token ids (one per streamed line)",
                "words": "whitespace words"}
LOWER_BOUND = ("ids", "words")


def methods_text(report: dict) -> str | None:
    """One line: how the output was counted, per method, and whether the figure is a lower bound."""
    counts = report.get("token_methods")
    if not counts:
        return None
    parts = ", ".join(f"{METHOD_NAMES.get(method, method)} for {count}" for method, count in counts.items())
    line = f"tokens counted by {parts} answer{'s' if sum(counts.values()) > 1 else ''}"
    if any(counts.get(method) for method in LOWER_BOUND):
        line += ("; a LOWER BOUND where counted by ids or words (no details from LMI, no --tokenizer): "
                 "pass --lmi-version/--batching for LMI's own count, or --tokenizer")
    return line


def passed(steps: Iterable[dict], max_error_rate: float) -> bool:
    return all(step["error_rate"] <= max_error_rate for step in steps)


# ---------------------------------------------------------------------------------------------- rendering


def _number(value: float | None, digits: int = 3) -> str:
    if value is None:
        return "n/a"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    if abs(value) >= 100:
        return f"{value:.1f}"
    return f"{value:.{digits}f}"


def _stat(step: dict, key: str, field: str) -> float | None:
    block = step.get(key)
    return block.get(field) if block else None


def _errors_text(step: dict) -> str:
    parts = [f"{kind} {count}" for kind, count in step["errors"].items() if count]
    return ", ".join(parts) or "-"


def rate_header(report: dict) -> str:
    return {"tokens": "tok/s", "words": "words/s", "labels": "labels/s"}.get(report.get("unit"), "out/s")


def format_table(report: dict) -> str:
    """The console table: one aligned row per step, then where the numbers come from."""
    streamed = report.get("stream", False)
    first = ["ttft p50 s", "ttft p90 s", "itl p50 ms", "itl p90 ms", "itl p99 ms"] if streamed else \
        ["ttfb p50 s", "ttfb p90 s"]
    headers = ["clients", "requests", "errors", "err %", "req/s", rate_header(report), f"{rate_header(report)}/client",
               "p50 s", "p90 s", "p99 s", "mean s", *first, "errors by kind"]
    rows = []
    for step in report["steps"]:
        if streamed:
            timing = [_number(_stat(step, "ttft_s", "p50")), _number(_stat(step, "ttft_s", "p90")),
                      *(_number(_milli(_stat(step, "itl_s", q)), 1) for q in ("p50", "p90", "p99"))]
        else:
            timing = [_number(_stat(step, "ttfb_s", "p50")), _number(_stat(step, "ttfb_s", "p90"))]
        rows.append([
            str(step["concurrency"]), str(step["requests"]), str(step["error_count"]),
            f"{100 * step['error_rate']:.1f}", _number(step["requests_per_s"], 2), _number(step["output_per_s"], 1),
            _number(_stat(step, "client_output_per_s", "p50"), 1),
            _number(_stat(step, "latency_s", "p50")), _number(_stat(step, "latency_s", "p90")),
            _number(_stat(step, "latency_s", "p99")), _number(_stat(step, "latency_s", "mean")),
            *timing, _errors_text(step),
        ])
    widths = [max(len(header), *(len(row[i]) for row in rows)) if rows else len(header)
              for i, header in enumerate(headers)]

    def line(cells: list[str]) -> str:
        # Numbers right-aligned, the free-text last column left-aligned.
        body = [cell.rjust(width) for cell, width in zip(cells[:-1], widths[:-1], strict=True)]
        return "  ".join([*body, cells[-1].ljust(widths[-1])]).rstrip()

    out = [f"{report.get('label', 'run')}: {report['kind']} {_shape_text(report)} -> {_target_text(report)}",
           line(headers), line(["-" * width for width in widths])]
    out += [line(row) for row in rows]
    counted = methods_text(report)
    if counted:
        out.append(counted)
    out.append(("" if counted else f"output counted as {report['token_counter']}; ") +
               "latency and TTFB over successful requests; "
               f"ttfb: {report.get('ttfb_note', 'time to the first response byte')}; "
               "/client: median of each request's output / latency")
    if streamed:
        out.append("streamed: ttft = time to first token; itl = time per token after the first, per request (ms)")
        unstreamed = sum(step["ok"] - step.get("streamed_requests", 0) for step in report["steps"])
        if unstreamed:
            out.append(f"{unstreamed} successful answers came whole, not as a token stream (no TTFT for them)")
    examples: dict[str, str] = {}
    for step in report["steps"]:
        for kind, detail in step.get("error_examples", {}).items():
            examples.setdefault(kind, detail)
    out += [f"first {kind} error: {examples[kind]}" for kind in ERROR_KINDS if kind in examples]
    return "\n".join(out)


def _milli(value: float | None) -> float | None:
    return None if value is None else 1000 * value


def _shape_text(report: dict) -> str:
    shape = report.get("shape") or {}
    if report["kind"] == "llm":
        return f"{shape.get('input_tokens')} in / {shape.get('output_tokens')} out"
    return f"batch {shape.get('batch_size')}"


def _target_text(report: dict) -> str:
    target = report.get("target") or {}
    if target.get("type") == "sagemaker":
        return f"SageMaker endpoint {target.get('endpoint')} ({target.get('region')})"
    return str(target.get("url"))


CSV_FIELDS = ("label", "kind", "concurrency", "requests", "ok", "error_count", "error_rate",
              *(f"errors_{kind}" for kind in ERROR_KINDS), "wall_s", "requests_per_s", "output_total",
              "output_per_s", "unit", "latency_p50_s", "latency_p90_s", "latency_p99_s", "latency_mean_s",
              "ttfb_p50_s", "ttfb_p90_s", "ttfb_p99_s", "warmup_requests", "warmup_errors",
              "streamed_requests", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "itl_p50_s", "itl_p90_s", "itl_p99_s",
              "client_output_per_s_p50", "client_output_per_s_mean")


def to_csv(report: dict) -> str:
    """One row per step; empty cells where a statistic does not exist (no successes, no TTFB)."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=CSV_FIELDS, lineterminator="\n")
    writer.writeheader()
    for step in report["steps"]:
        row = {key: step[key] for key in ("concurrency", "requests", "ok", "error_count", "error_rate", "wall_s",
                                          "requests_per_s", "output_total", "output_per_s", "warmup_requests",
                                          "warmup_errors")}
        row.update({f"errors_{kind}": step["errors"].get(kind, 0) for kind in ERROR_KINDS})
        for stat in ("p50", "p90", "p99", "mean"):
            row[f"latency_{stat}_s"] = _stat(step, "latency_s", stat)
        for stat in ("p50", "p90", "p99"):
            row[f"ttfb_{stat}_s"] = _stat(step, "ttfb_s", stat)
            row[f"ttft_{stat}_s"] = _stat(step, "ttft_s", stat)
            row[f"itl_{stat}_s"] = _stat(step, "itl_s", stat)
        row["streamed_requests"] = step.get("streamed_requests", 0)
        row["client_output_per_s_p50"] = _stat(step, "client_output_per_s", "p50")
        row["client_output_per_s_mean"] = _stat(step, "client_output_per_s", "mean")
        row.update(label=report.get("label"), kind=report["kind"], unit=report.get("unit"))
        writer.writerow({key: "" if value is None else value for key, value in row.items()})
    return buffer.getvalue()


def write_reports(report: dict, out_dir: Path) -> list[Path]:
    """report.json and report.csv in `out_dir` (created); returns the paths written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, csv_path = out_dir / "report.json", out_dir / "report.csv"
    json_path.write_text(json.dumps(report, indent=2) + "\n")
    csv_path.write_text(to_csv(report))
    return [json_path, csv_path]


def load_report(path: Path) -> dict:
    """A report.json written by this tool; ValueError with the file's name when it is not one."""
    try:
        report = json.loads(Path(path).read_text())
    except (OSError, ValueError) as error:
        raise ValueError(f"{path}: cannot read a report: {error}") from None
    if not isinstance(report, dict) or not isinstance(report.get("steps"), list) or "kind" not in report:
        raise ValueError(f"{path}: not a report.json from python -m inference.llm.loadtest")
    return report


def draw(reports: Sequence[dict], path: Path) -> Path:
    """Two panels, output/s and p90 latency against concurrency, one line per run; needs matplotlib."""
    import matplotlib

    matplotlib.use("Agg")  # files only; never open a window
    import matplotlib.pyplot as plt

    units = {report.get("unit", "output") for report in reports}
    unit = units.pop() if len(units) == 1 else "output units"
    streamed = any(step.get("ttft_s") for report in reports for step in report["steps"])
    panels = [("Throughput", f"{unit} per second", lambda step: step["output_per_s"]),
              ("p90 latency", "seconds", lambda step: _stat(step, "latency_s", "p90"))]
    if streamed:  # the figures LLM users judge by, next to the recipe's two
        panels += [("p90 time to first token", "seconds", lambda step: _stat(step, "ttft_s", "p90")),
                   ("p90 inter-token latency", "milliseconds", lambda step: _milli(_stat(step, "itl_s", "p90")))]
    rows = 2 if streamed else 1
    figure, axes = plt.subplots(rows, 2, figsize=(11, 4.2 * rows), constrained_layout=True, squeeze=False)
    axes = [axis for row in axes for axis in row]
    concurrencies: set[int] = set()
    for index, report in enumerate(reports):
        label = report.get("label") or f"run {index + 1}"
        steps = sorted(report["steps"], key=lambda step: step["concurrency"])
        xs = [step["concurrency"] for step in steps]
        concurrencies.update(xs)
        for axis, (_title, _ylabel, value) in zip(axes, panels, strict=True):
            axis.plot(xs, [_nan(value(step)) for step in steps], marker="o", label=label)
    for axis, (title, ylabel, _value) in zip(axes, panels, strict=True):
        axis.set_title(title)
        axis.set_xlabel("concurrent clients")
        axis.set_ylabel(ylabel)
        axis.grid(True, alpha=0.3)
        if concurrencies and max(concurrencies) >= 4 * min(concurrencies):
            axis.set_xscale("log", base=2)
        axis.set_xticks(sorted(concurrencies), [str(c) for c in sorted(concurrencies)])
        axis.set_ylim(bottom=0)
        axis.legend(fontsize="small")
    workloads = {f"{report['kind']}, {_shape_text(report)}" for report in reports}
    figure.suptitle(workloads.pop() if len(workloads) == 1 else "several workloads")
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def _nan(value: float | None) -> float:
    return math.nan if value is None else value
