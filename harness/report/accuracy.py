"""The accuracy-cost report of lossy strategies: from run directories (harness.report.load.load_runs),
one row per strategy and prompt length with what each moved, what it cost in outputs beside the
baseline's own noise, and its time beside fused's at the same length; and the figure of accuracy
cost against bytes saved. scripts/lossy_report.py and notebooks/analysis.ipynb draw it.

Bytes saved and time are against `fused` at the same prompt length in the same runs, so a report
is only as good as the runs it reads: give it a sweep of fused and the lossy strategies run
together (docs/strategies.md, lossy strategies).
"""

from __future__ import annotations

import pandas as pd

from harness.records.fields import FIELDS, Field
from harness.records.figures import figures_in
from harness.records.stats import Column, format_table

KEYS = ["model", "device", "prompt_len"]  # what a strategy is compared with fused within


def metrics() -> list[Field]:
    """The per-request metrics the report shows (fields.py's "accuracy" and "vs_fused" views): their
    runs' p50, and for "vs_fused" that as a share of fused's at the same length."""
    return [f for f in FIELDS if {"accuracy", "vs_fused"} & set(f.shown)]


def columns() -> list[str]:
    per_request = [c for f in metrics() for c in (f"{f.name}_p50", *([f"{f.name}_vs_fused"] if "vs_fused" in f.shown
                                                                      else []))]
    return ["model", "kv_bytes_per_token", "device", "strategy", "prompt_len", "runs",
            *(g.key for g in figures_in("accuracy")), *per_request, "status"]


def accuracy_table(runs: pd.DataFrame) -> pd.DataFrame:
    """runs: load_runs' frame. Runs of one model, device, strategy, codec (its scales: a strategy
    run with other strategy.params is a row of its own) and prompt length are pooled (each
    figure as figures.py says: means, counts summed; the worst status); only the model, device
    and prompt lengths where a lossy strategy ran are kept, with fused's rows there (its bytes
    and time are the reference). Each model's KV bytes per token (meta.json's geometry) is
    beside its name, so that rows of different KV geometries compare per byte."""
    df = runs.copy()
    df["prompt_len"] = df.get("workload.prompt_len")
    # a run of several lengths (a benchmark's prompts file, workload=jsonl) has none to compare at
    df = df[pd.to_numeric(df["prompt_len"], errors="coerce").notna()]
    for col in columns():
        if col not in df:
            df[col] = None
    df["runs"] = 1
    # the other way users shrink KV: both engines storing it in FP8 (vLLM's kv_cache_dtype), any strategy
    stored = df.get("engines.decode.kv_cache_dtype", pd.Series(None, index=df.index))
    stored = stored.where(stored.map(lambda v: isinstance(v, str) and v != "auto"))
    df["strategy"] = df["strategy"] + stored.map(lambda v: f" (kv_cache_dtype={v})" if isinstance(v, str) else "")
    lossy = df["codec"].notna() | stored.notna()
    cells = set(map(tuple, df.loc[lossy, KEYS].astype(str).values))
    in_cell = pd.Series([tuple(k) in cells for k in df[KEYS].astype(str).values], index=df.index, dtype=bool)
    df = df[in_cell & (lossy | (df["strategy"] == "fused"))]
    df["codec"] = df["codec"].fillna("-")
    agg = {"runs": "sum", "kv_bytes_per_token": "first",
           **{g.key: g.pooled for g in figures_in("accuracy") if g.key != "codec"},
           **{f"{f.name}_p50": "mean" for f in metrics()},
           "status": lambda s: "ok" if (s == "ok").all() else ",".join(sorted(set(map(str, s)) - {"ok"}))}
    for c in agg:
        if agg[c] == "mean":
            df[c] = pd.to_numeric(df[c], errors="coerce")
    out = df.groupby([*KEYS, "strategy", "codec"], dropna=False).agg(agg).reset_index()
    fused = out[out["strategy"] == "fused"].set_index(KEYS)
    at = pd.MultiIndex.from_frame(out[KEYS])
    for f in metrics():
        if "vs_fused" in f.shown:
            base = f"{f.name}_p50"
            ref = fused[base].reindex(at).to_numpy() if len(fused) else float("nan")
            out[f"{f.name}_vs_fused"] = out[base] / ref
    return out[columns()].sort_values([*KEYS, "bytes_vs_fused"], ascending=[True, True, True, False],
                                      ignore_index=True)


def to_markdown(table: pd.DataFrame) -> str:
    """The table in Markdown, each figure and metric with its declared header and format."""
    per_request = []
    for f in metrics():
        per_request.append(Column(f"{f.header} p50", f"{f.name}_p50", f.spec))
        if "vs_fused" in f.shown:
            per_request.append(Column(f"{f.header} / fused's", f"{f.name}_vs_fused", ".3g"))
    columns = [Column("model"), Column("KV B/token", "kv_bytes_per_token", ".0f"), Column("device"),
               Column("strategy"), Column("prompt", "prompt_len"), Column("runs"),
               *(Column(g.label, g.key, g.spec) for g in figures_in("accuracy")), *per_request, Column("status")]
    return format_table(table.to_dict("records"), columns, markdown=True)


def plot_cost_against_bytes(table: pd.DataFrame, ax=None):
    """Accuracy drop (and the task score's, where there is one) against the share of fused's bytes
    each strategy moved, one marker per strategy and prompt length."""
    import matplotlib.pyplot as plt

    ax = ax or plt.subplots(figsize=(6, 4))[1]
    for (model, device, strategy), g in table.groupby(["model", "device", "strategy"]):
        ax.plot(g["bytes_vs_fused"], g["accuracy_drop"], "o-", label=f"{strategy} ({model}, {device})")
        for _, r in g.iterrows():
            ax.annotate(f"{int(r['prompt_len'])}", (r["bytes_vs_fused"], r["accuracy_drop"]), fontsize=7,
                        textcoords="offset points", xytext=(4, 2))
    ax.axhline(0, color="grey", lw=0.5)
    ax.set_xlabel("bytes moved / fused's (same prompt length)")
    ax.set_ylabel("exact-match drop against the baseline's own rerun")
    ax.set_title("accuracy cost against bytes saved (labels: prompt tokens)")
    ax.legend(fontsize=8)
    return ax
