"""When disaggregation pays: a sweep of runner=serve over serve.pd_policy and its thresholds, on one
workload, as two markdown tables (docs/serving.md, "When disaggregation pays").

    python -m harness -m serve.seed=0,1,2 serve.selective.min_uncached_tokens=0,128,512,4096 \\
        runner=serve strategy=fused serve.pd_policy=selective serve.selective.min_prompt_tokens=0 \\
        workload=trace workload.path=$PWD/trace.jsonl workload.block_tokens=32 \\
        serve.baseline_instances=matched slo.ttft_ms=250 slo.tpot_ms=25 hydra.sweep.dir=OUT
    python scripts/selective_report.py OUT --out OUT

1. Per policy: the share of P/D-path requests sent to the decode instance alone, TTFT and TPOT
   (p50, p99), goodput and the interference factor; each the mean over the runs (every run its own
   engine starts: serve.seed repeats a cell) with its 95% t-interval across them. The colocated
   baseline, which every run also served (serve.baseline_instances=matched: the same number of
   instances), is its own row, over every run.
2. Per prompt length: each request's TTFT minus the colocated baseline's for the same request in
   the same run, its median per run and length bin, then the mean and interval over runs: for
   requests disaggregated (threshold 0) against the same requests sent to the decode instance alone
   (the largest threshold), only requests none of whose blocks the decode instance held (the
   disaggregated run's decode_hit_tokens 0: the whole prompt had to be computed somewhere). The
   crossover is the shortest length from which disaggregating is ahead in every longer bin by more
   than the spread between runs (the intervals apart); none where no bin is.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from harness.records.schema import DECODE_ONLY, DISAGG
from harness.records.stats import format_value, mean_interval
from harness.report.load import load_requests, load_runs

THRESHOLD = "serve.selective.min_uncached_tokens"
BINS = (0, 64, 128, 256, 512, 1024, 2048, 4096)
FIGURES = (("TTFT p50 ms", "ttft_ms_p50"), ("TTFT p99 ms", "ttft_ms_p99"), ("TPOT p50 ms", "tpot_ms_p50"),
           ("TPOT p99 ms", "tpot_ms_p99"), ("goodput req/s", "goodput"), ("interference", "interference"))


def policy(run: pd.Series) -> str:
    if run["serve.pd_policy"] == "always":
        return "always"
    prompt = run["serve.selective.min_prompt_tokens"]
    return f"min_uncached_tokens={run[THRESHOLD]}" + (f", min_prompt_tokens={prompt}" if prompt else "")


def with_interval(out: dict, name: str, values) -> None:
    out[name], out[f"{name}_lo"], out[f"{name}_hi"] = mean_interval(values)


def policies(runs: pd.DataFrame) -> pd.DataFrame:
    """A row per policy, the colocated baseline first: each figure's mean over the runs and its
    95% t-interval across them."""
    rows = []
    base = {"policy": "colocated baseline", "runs": len(runs)}
    for _, key in FIGURES:
        with_interval(base, key, runs[f"base_{key}"])
    rows.append(base)
    for name, group in runs.groupby("policy", sort=False):
        row = {"policy": name, "runs": len(group)}
        with_interval(row, "decode_only_share", group["decode_only_requests"] / group["requests"])
        for _, key in FIGURES:
            with_interval(row, key, group[key])
        rows.append(row)
    return pd.DataFrame(rows)


def lengths(requests: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """A row per prompt-length bin: TTFT minus the baseline's for the same request, the median per
    run, then the mean over runs with its interval and the requests counted, for the requests the
    smallest threshold disaggregated with nothing held by the decode instance and for the same
    requests sent to it alone by the largest."""
    low, high = runs[THRESHOLD].min(), runs[THRESHOLD].max()
    ran = requests[requests["run_dir"].isin(runs["run_dir"]) & (requests["status"] == "ok")].copy()
    first = ran[ran[THRESHOLD] == low]
    cold = set(first.loc[(first["decode_hit_tokens"] == 0) & (first["route"] == DISAGG), "request_idx"])
    sides = {"disagg": first[first["route"] == DISAGG],
             "alone": ran[(ran[THRESHOLD] == high) & (ran["route"] == DECODE_ONLY)]}
    out = {}
    for side, rows in sides.items():
        rows = rows[rows["request_idx"].isin(cold)].copy()
        rows["over"] = rows["ttft_ms"] - rows["base_ttft_ms"]
        rows["bin"] = pd.cut(rows["prompt_len"], BINS, right=False).map(lambda b: b.left)
        for b, group in rows.groupby("bin", observed=True):
            row = out.setdefault(int(b), {"prompt_from": int(b), "prompt_to": BINS[BINS.index(int(b)) + 1]})
            with_interval(row, f"{side}_ms", group.groupby("run_dir")["over"].median())
            row[f"{side}_requests"] = len(group)
    return pd.DataFrame([out[b] for b in sorted(out)])


def crossover(table: pd.DataFrame) -> int | None:
    """The shortest length from which disaggregating is ahead in every bin on, by more than the
    spread between runs (its interval's top under the other's bottom); None where no bin is."""
    if table.empty or "alone_ms_lo" not in table or "disagg_ms_hi" not in table:
        return None
    hi, lo = (pd.to_numeric(table[k], errors="coerce") for k in ("disagg_ms_hi", "alone_ms_lo"))
    ahead = list(hi < lo)  # NaN (one run: no interval) compares false
    for i in range(len(ahead)):
        if all(ahead[i:]):
            return int(table["prompt_from"].iloc[i])
    return None


def cell(row, key: str, spec: str = ".3g") -> str:
    v, lo, hi = row.get(key), row.get(f"{key}_lo"), row.get(f"{key}_hi")
    if v is None or v != v:
        return "-"
    return format_value(v, spec) + (f" [{format_value(lo, spec)}, {format_value(hi, spec)}]" if lo == lo and
                                    lo is not None else "")


def markdown(pol: pd.DataFrame, lens: pd.DataFrame, cross: int | None) -> str:
    lines = ["| policy | runs | decode-only share | " + " | ".join(n for n, _ in FIGURES) + " |",
             "| --- | ---: | ---: |" + " ---: |" * len(FIGURES)]
    for _, r in pol.iterrows():
        lines.append(f"| {r['policy']} | {r['runs']} | {cell(r, 'decode_only_share', '.2f')} | "
                     + " | ".join(cell(r, k) for _, k in FIGURES) + " |")
    lines += ["", "| prompt tokens | disaggregated: TTFT - baseline's, ms (requests) | decode instance alone: TTFT - "
                  "baseline's, ms (requests) |", "| --- | ---: | ---: |"]
    for _, r in lens.iterrows():
        lines.append(f"| {int(r['prompt_from'])}-{int(r['prompt_to']) - 1} | "
                     + " | ".join(f"{cell(r, f'{s}_ms', '+.1f')} ({int(r.get(f'{s}_requests') or 0)})"
                                  for s in ("disagg", "alone")) + " |")
    lines += ["", f"crossover: disaggregating a prompt none of whose blocks the decode instance holds is ahead on TTFT "
                  f"from {cross} tokens on" if cross is not None else
              "crossover: none resolved (in no length bin up to the longest is disaggregating ahead on TTFT by more "
              "than the spread between runs)"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sweeps", nargs="+", type=Path)
    ap.add_argument("--out", type=Path, default=None,
                    help="also write report.md, policies.csv and lengths.csv into this folder")
    a = ap.parse_args(argv)
    runs = load_runs(*a.sweeps)
    if not runs.empty and "serve.pd_policy" in runs:
        runs = runs[(runs["status"] == "ok") & (runs["runner"] == "serve")].copy()
    if runs.empty or "serve.pd_policy" not in runs:
        print("error: no finished runner=serve runs with serve.pd_policy under " + " ".join(map(str, a.sweeps)),
              file=sys.stderr)
        return 2
    runs["policy"] = runs.apply(policy, axis=1)
    runs = runs.sort_values(THRESHOLD, kind="stable")
    requests = load_requests(*a.sweeps)
    pol, lens = policies(runs), lengths(requests[requests["path"] == "disagg"], runs)
    text = markdown(pol, lens, crossover(lens))
    print(text)
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "report.md").write_text(text + "\n")
        pol.to_csv(a.out / "policies.csv", index=False)
        lens.to_csv(a.out / "lengths.csv", index=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
