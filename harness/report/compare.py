"""The regression guard of the GPU TTFT benchmark: a new benchmark directory against a reference.

    python scripts/compare_bench.py NEW_DIR [REF_DIR] [--metrics M ...] [--slack-ms X] [--any-gpu]

(This module is the guard; scripts/compare_bench.py runs its main.)

Both are directories scripts/bench_strategies.py wrote (one run directory per
strategy[-decode_submit], or per engine start below it: <label>/start<k>/). Their requests are cut
into the benchmark table's cells (harness/report/benchmark.py cells), each named by its run's
strategy, its decode_submit as it applied and the prompt length, so that a run named `fused` and
one named `fused-early` meet. For each cell in both and each metric, each side's value and 95%
interval: where both sides started their engines more than once, the mean of the starts' medians
and its t-interval over the starts (what a rerun's start falls in: the interval a change is judged
by); else the median of the requests and its bootstrap interval (harness/records/stats.py), which
covers one start's prompts only (the report says which, `interval over`):
  slower  the new interval's low end lies above the reference's high end plus the slack
  faster  the new interval's high end lies below the reference's low end less the slack
  same    otherwise: the intervals overlap, or miss each other by less than the slack
  n/a     a side has no value of that metric in that cell
Cells on one side only are listed, not failed (a new run of fewer lengths than the reference).
Without REF_DIR, the committed reference of the GPU NEW_DIR ran on (REFERENCES); two benchmarks of
different GPUs are refused (the same commit measures slower on one kind than another) unless
--any-gpu.
Exit status: 1 when any cell is slower in any metric, 0 otherwise, 2 on bad input (a directory
that is not a benchmark, no cell in common, a metric that is not a time).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from harness import PROJECT_ROOT
from harness.records.schema import RequestRow, shown_in
from harness.records.stats import Column, format_table, p50_with_interval
from harness.report.benchmark import across_starts, cells, run_label
from harness.report.load import RUN_FILES, load_requests, load_runs


def metrics() -> list[str]:
    """The metrics judged by default: those fields.py shows in the "gate" view."""
    return [f.name for f in shown_in("gate")]

# An interval is the spread within one engine start, not between two: runs of the same code in
# other engine starts missed each other's intervals by 0.25 ms (2026-11-30-s4/ab-per_request_blocks,
# old-0 and old-2, transfer_ms at 8k) and 0.34 ms (2026-11-30-s6/ttft-nodigests against ttft-early,
# overhead_decode_ms at 8k); 1 ms keeps such noise from failing the guard
SLACK_MS = 1.0
# The gate's reference for each GPU (meta.json's device_name), relative to the project root: runs on
# another kind of machine measure otherwise (docs/gpu.md, machine kinds). The H200's is one engine
# start of each strategy; the H100's three (bench.engine_starts), judged over the starts.
REFERENCES = {"NVIDIA H200": "results/gpu/2026-12-02-s14/ttft-early",
              "NVIDIA H100 80GB HBM3": "results/gpu/2026-12-06-s32/ttft"}
# A cell: (strategy, decode_submit, prompt_len)
Cell = tuple[str, str | None, int]


class BadInput(Exception):
    """Said in one line, exit 2."""


def argument_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("new", type=Path, metavar="NEW_DIR", help="the benchmark under test")
    ap.add_argument("ref", type=Path, metavar="REF_DIR", nargs="?", default=None,
                    help="the reference benchmark (default: the committed one of NEW_DIR's GPU, REFERENCES)")
    ap.add_argument("--any-gpu", action="store_true", help="compare benchmarks of different GPUs all the same")
    ap.add_argument("--metrics", nargs="+", default=metrics(),
                    help=f"requests.jsonl times to compare (spaces or commas; default: {' '.join(metrics())})")
    ap.add_argument("--slack-ms", type=float, default=SLACK_MS,
                    help=f"how far the intervals may miss each other before a cell is slower or faster "
                         f"(default {SLACK_MS:g})")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = argument_parser().parse_args(argv)
    try:
        metrics = checked_metrics(args.metrics)
        new = load_cells(args.new)
        args.ref = args.ref or reference_for(gpus(new), args.new)
        ref = load_cells(args.ref)
        if gpus(new) != gpus(ref) and not args.any_gpu:
            raise BadInput(f"{args.new} ran on {', '.join(gpus(new))} and {args.ref} on {', '.join(gpus(ref))}: "
                           f"compare benchmarks of one GPU (--any-gpu to compare them anyway)")
        common = [c for c in ref if c in new]
        if not common:
            raise BadInput(f"{args.new} and {args.ref} have no cell (strategy, decode_submit, prompt length) in common")
    except BadInput as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    rows = [compare_cell(new[c], ref[c], c, m, args.slack_ms) for c in common for m in metrics]
    print(f"new: {args.new}\nref: {args.ref}\nslack: {args.slack_ms:g} ms\n")
    print(report(rows, only_new=[c for c in new if c not in ref], only_ref=[c for c in ref if c not in new]))
    return 1 if any(r["verdict"] == "slower" for r in rows) else 0


def gpus(cells: dict[Cell, pd.DataFrame]) -> list[str]:
    """The devices a benchmark's runs ran on (meta.json's device_name)."""
    return sorted({str(n) for g in cells.values() for n in g["device_name"].dropna()})


def reference_for(devices: list[str], bench: Path) -> Path:
    if len(devices) == 1 and devices[0] in REFERENCES:
        return PROJECT_ROOT / REFERENCES[devices[0]]
    raise BadInput(f"{bench} ran on {', '.join(devices) or 'an unknown device'}: no committed reference for it "
                   f"({', '.join(REFERENCES)} have one); give REF_DIR")


def checked_metrics(given: list[str]) -> list[str]:
    # slower/faster and the slack are in ms: a metric where more is better (gbps) would read backwards
    times = [f.name for f in RequestRow.fields if f.unit == "ms" and f.better == "lower"]
    metrics = [m for arg in given for m in arg.split(",") if m]
    for m in metrics:
        if m not in times:
            raise BadInput(f"--metrics: {m!r} is not a time of requests.jsonl (one of {', '.join(times)})")
    return metrics


def load_cells(bench: Path) -> dict[Cell, pd.DataFrame]:
    """A benchmark directory's requests by cell, through the project's loader."""
    if not bench.is_dir():
        raise BadInput(f"{bench} is not a directory")
    if any((bench / name).exists() for name in RUN_FILES):
        raise BadInput(f"{bench} is one run directory, not a benchmark: give the directory that holds its runs")
    # only its runs: right under it, or <label>/start<k>/ (bench.engine_starts); a session directory
    # holds several benchmarks, which must not mix
    def is_run(p: Path) -> bool:
        return any((p / name).exists() for name in RUN_FILES)
    runs = sorted(p for p in bench.iterdir() if is_run(p))
    runs += sorted(s for p in bench.iterdir() if p.is_dir() and not is_run(p) for s in p.glob("start*")
                   if is_run(s) and run_label(s)[1] > 0)
    requests = load_requests(*runs)
    if not len(requests):
        raise BadInput(f"{bench} holds no run directory with requests: not a benchmark of scripts/bench_strategies.py")
    if "path" in requests and requests["path"].notna().any():
        raise BadInput(f"{bench} holds runner=serve runs, not a benchmark of scripts/bench_strategies.py")
    submits = applied_submits(load_runs(*runs))
    out: dict[Cell, pd.DataFrame] = {}
    named: dict[tuple[str, str | None], str] = {}
    for label, n, g in cells(requests, list(dict.fromkeys(run_label(p)[0] for p in runs))):
        run = (str(g["strategy"].iloc[0]), submits.get(g["run_dir"].iloc[0]))
        if named.setdefault(run, label) != label:
            raise BadInput(f"{bench}: runs {named[run]} and {label} are both {cell_name(run + (n,))}: "
                           "not a benchmark of scripts/bench_strategies.py")
        out[run + (n,)] = g
    return out


def applied_submits(runs: pd.DataFrame) -> dict[str, str | None]:
    """run_dir -> decode_submit as it applied: summary.json's, else the config's (a run killed
    before its summary; null there means the harness's default, which only the summary names)."""
    out = {}
    for r in runs.to_dict("records"):
        said = [r.get("decode_submit"), r.get("run.decode_submit")]
        out[r["run_dir"]] = next((v for v in said if isinstance(v, str)), None)  # NaN: the column, not this run
    return out


def cell_name(cell: Cell) -> str:
    strategy, submit, n = cell
    return f"{strategy} {submit or '?'} {n}"


def compare_cell(new: pd.DataFrame, ref: pd.DataFrame, cell: Cell, metric: str, slack: float) -> dict:
    """Where both sides started their engines more than once, each side's value is the mean of its
    starts' medians with the t-interval over the starts (what a rerun's start falls in); else the
    median of the requests with its bootstrap interval, which covers one start's prompts only."""
    starts = min(new["start"].nunique(), ref["start"].nunique())
    row = {"cell": cell_name(cell), "metric": metric, "interval": "starts" if starts > 1 else "requests"}
    for side, g in (("ref", ref), ("new", new)):
        if starts > 1:
            across = across_starts(g, metric)
            row.update({side: across[f"{metric}_across"], f"{side}_lo": across[f"{metric}_across_lo"],
                        f"{side}_hi": across[f"{metric}_across_hi"]})
        else:
            row.update(p50_with_interval(g[metric], side))
    row["verdict"] = verdict(row, slack)
    return row


def verdict(row: dict, slack: float) -> str:
    """Judged on the intervals, not the medians: a median moves by chance, and the interval says how much."""
    if row["new"] is None or row["ref"] is None:
        return "n/a"
    if row["new_lo"] > row["ref_hi"] + slack:
        return "slower"
    if row["new_hi"] < row["ref_lo"] - slack:
        return "faster"
    return "same"


def report(rows: list[dict], only_new: list[Cell], only_ref: list[Cell]) -> str:
    columns = [Column("cell"), Column("metric"), Column("interval over", "interval"),
               Column("ref [95%]", "ref", ".3f", True), Column("new [95%]", "new", ".3f", True), Column("verdict")]
    lines = [format_table(rows, columns, align="left"), ""]
    for side, only in (("new", only_new), ("ref", only_ref)):
        if only:
            lines.append(f"only in {side} (not compared): {', '.join(map(cell_name, only))}")
    counts = pd.Series([r["verdict"] for r in rows]).value_counts()
    lines.append(", ".join(f"{k} {counts.get(k, 0)}" for k in ("slower", "faster", "same", "n/a")))
    slower = [f"{r['cell']} {r['metric']}" for r in rows if r["verdict"] == "slower"]
    lines.append(f"SLOWER: {'; '.join(slower)}" if slower else "no cell slower")
    return "\n".join(lines)

