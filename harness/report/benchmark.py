"""The strategy benchmark's tables and figure, from its run directories (harness/benchmark.py runs
them): one row per run and prompt length, each median with its 95% bootstrap interval, the
transfer against the ceiling measured in the same benchmark, the TTFT overhead and its parts
(the columns: MEDIANS, results/README.md). Writes table.md, rows.csv and figure.png."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pandas as pd

from harness.records.fields import Field
from harness.records.schema import CRITICAL_PATH, OVERHEAD_PARTS, shown_in
from harness.records.stats import Column, format_table, mean_interval, p50_with_interval, percentile
from harness.records.summary import format_overhead, overhead_means
from harness.report.load import load_requests


def write_tables(out: Path, labels: list[str], ceiling: float, title: str) -> str:
    """table.md, rows.csv and figure.png in out from the records of its runs (one per label)."""
    requests = load_requests(*(out / s for s in labels if (out / s).is_dir()))
    rows = strategy_rows(requests, labels, ceiling)
    starts = max((r["starts"] for r in rows), default=1)
    sections = [title, strategy_table(rows), STARTS_NOTE.format(starts=starts) if starts > 1 else INTERVAL_NOTE,
                FIRST_NOTE, first_request_table(requests, labels)]
    if starts > 1:
        sections += [STARTS_TABLE_NOTE, start_table(requests, labels)]
    table = "\n\n".join(sections)
    (out / "table.md").write_text(table + "\n")
    pd.DataFrame(rows, columns=csv_columns()).to_csv(out / "rows.csv", index=False)
    plot(out, title=title)
    return table


def medians() -> list[str]:
    """Per strategy and prompt length, the median of each metric the benchmark shows (fields.py's
    "bench" view), with its bootstrap interval."""
    return [f.name for f in shown_in("bench")]


def csv_columns() -> list[str]:
    """rows.csv: the cell and its engine starts, the medians, their share of the ceiling, outputs and
    digests, the means of the TTFT overhead's parts (they add up to the mean overhead), each
    median's interval over the requests, then across engine starts: each start's median, their
    mean and its t-interval (empty with one start)."""
    across = [f"{k}_{end}" for k in medians() for end in ("across", "across_lo", "across_hi", "starts")] + [
        f"ceiling_share_{end}" for end in ("across", "across_lo", "across_hi")]
    return (["strategy", "prompt_len", "starts", *medians(), "ceiling_share", "match_rate", "digest_ok",
             "overhead_mean_ms", *OVERHEAD_PARTS]
            + [f"{k}_{end}" for k in [*medians(), "ceiling_share"] for end in ("lo", "hi")] + across)


INTERVAL_NOTE = ("Each value is the median of that strategy's requests of that length; [lo, hi] is its 95% bootstrap "
                 "interval (1000 resamples, harness/records/stats.py), shown where the requests differ. That interval "
                 "covers the prompts of one engine start only: starts differ by more (bench.engine_starts).")
STARTS_NOTE = ("Each value is the mean of the {starts} engine starts' medians of that strategy's requests of that "
               "length; [lo, hi] is its 95% t-interval over the starts (harness/records/stats.py mean_interval): "
               "where a rerun's start is expected. Each start's medians are in rows.csv (<metric>_starts), the "
               "medians over every request with their bootstrap interval (over the prompts alone) beside them.")


def strategy_rows(requests: pd.DataFrame, labels: list[str], ceiling: float) -> list[dict]:
    """One row per run (named by its directory: the strategy, or <strategy>-<decode_submit>) and
    prompt length of the runs' requests (harness.report.load.load_requests)."""
    rows = []
    for label, n, g in cells(requests, labels):
        row = {"strategy": label, "prompt_len": n, "starts": int(g["start"].nunique())}
        for k in medians():
            row.update(p50_with_interval(g[k] if k in g else [None] * len(g), k))
            row.update(across_starts(g, k))
        mean, parts = overhead_means(g.to_dict("records")) or (None, {})
        row["overhead_mean_ms"] = mean
        row.update({f"overhead_{part}_ms": parts.get(part) for part, _ in CRITICAL_PATH})
        for end in ("", "_lo", "_hi", "_across", "_across_lo", "_across_hi"):
            gbps = row.get(f"gbps{end}")
            row[f"ceiling_share{end}"] = gbps / ceiling if gbps else None
        row["match_rate"] = float(g["match"].map(_true).mean())
        checked = g["digest_match"].dropna()  # no value: digests off (check.digests=false)
        row["digest_ok"] = bool(checked.map(_true).all()) if len(checked) else None
        rows.append(row)
    return rows


def across_starts(g: pd.DataFrame, metric: str) -> dict:
    """A cell's metric between engine starts: each start's median (`_starts`, ";"-joined), their mean
    (`_across`) and its 95% t-interval over the starts (`_across_lo`, `_across_hi`); None with one
    start (no spread between starts measured)."""
    per_start = [percentile(s[metric], 50) if metric in s else None for _, s in g.groupby("start")]
    per_start = [v for v in per_start if v is not None]
    if len(per_start) < 2:
        return dict.fromkeys((f"{metric}_across", f"{metric}_across_lo", f"{metric}_across_hi", f"{metric}_starts"))
    mean, lo, hi = mean_interval(per_start)
    return {f"{metric}_across": mean, f"{metric}_across_lo": lo, f"{metric}_across_hi": hi,
            f"{metric}_starts": ";".join(f"{v:.9g}" for v in per_start)}


def run_label(run_dir: str | Path) -> tuple[str, int]:
    """(label, engine start) of a benchmark's run directory: <label>/ with one start,
    <label>/start<k>/ with bench.engine_starts above 1."""
    p = Path(run_dir)
    return (p.parent.name, int(p.name[5:])) if re.fullmatch(r"start\d+", p.name) else (p.name, 1)


def cells(requests: pd.DataFrame, labels: list[str]) -> Iterator[tuple[str, int, pd.DataFrame]]:
    """The benchmark's cells, as its table has them: (run label, prompt length, those requests, every
    engine start's, `start` telling them apart) for each label in order (a run is named by its
    directory: the strategy, or <strategy>-<decode_submit>), each length in increasing order.
    scripts/compare_bench.py compares two benchmarks cell by cell through it."""
    if not len(requests):
        return
    named = requests["run_dir"].map(run_label)
    requests = requests.assign(start=named.map(lambda ls: ls[1]))
    run_names = named.map(lambda ls: ls[0])
    for label in labels:
        for n, g in requests[run_names == label].groupby("prompt_len"):
            if "prefill_ttft_overhead_ms" not in g or g["prefill_ttft_overhead_ms"].isna().all():  # before version 3
                g = g.assign(prefill_ttft_overhead_ms=g["prefill_ms"] - g["base_ttft_ms"])
            yield label, int(n), g


FIRST_NOTE = ("The first measured request of each length against the rest (is the warm-up enough? "
              "run.warmup_requests): its TTFT overhead and the baseline's TTFT in each engine start, beside the "
              "median and range of the other requests of all starts.")


def first_request_table(requests: pd.DataFrame, labels: list[str]) -> str:
    """Per cell, the first measured request's TTFT overhead and baseline TTFT in each engine start
    (the benchmark sends one request at a time: the first is a batch of its own) against the rest."""
    rows = []
    for label, n, g in cells(requests, labels):
        first = g.loc[g.groupby("start")["prompt_idx"].idxmin()]
        rest = g.drop(first.index)
        row = {"strategy": label, "prompt_len": n}
        for k, name in (("ttft_overhead_ms", "overhead"), ("base_ttft_ms", "base")):
            values = pd.to_numeric(rest[k], errors="coerce").dropna()
            row[f"{name}_first"] = ", ".join(f"{v:.1f}" for v in first.sort_values("start")[k])
            row[f"{name}_rest"] = (f"{values.median():.1f} [{values.min():.1f}, {values.max():.1f}]"
                                   if len(values) else "")
        rows.append(row)
    columns = [Column("strategy"), Column("prompt", "prompt_len"),
               Column("first: TTFT overhead ms", "overhead_first"), Column("rest: median [min, max]", "overhead_rest"),
               Column("first: base TTFT ms", "base_first"), Column("rest: median [min, max]", "base_rest")]
    return format_table(rows, columns, markdown=True)


STARTS_TABLE_NOTE = ("Each engine start apart (where the spread between starts comes from): the TTFT overhead's "
                     "median and its mean cut into parts, the GPU's SM clock (MHz) and temperature (C) as the run "
                     "began (meta.json), and the CUDA graphs the decode engine captured (its log).")
GRAPHS = re.compile(r"Capturing CUDA graphs \((\w+)\):\s+100%\|[^|]*\|\s*(\d+)/\d+")


def start_table(requests: pd.DataFrame, labels: list[str]) -> str:
    """Per cell and engine start: the TTFT overhead's median and the means of its parts, the GPU's
    clock and temperature at the run's start, the decode engine's CUDA graph captures."""
    rows = []
    for label, n, g in cells(requests, labels):
        for start, s in g.groupby("start"):
            run = Path(s["run_dir"].iloc[0])
            gpu = (json.loads((run / "meta.json").read_text()).get("versions", {}).get("gpu") or [{}])[0]
            log = run / "decode.log"
            graphs = dict(GRAPHS.findall(log.read_text(errors="replace"))) if log.exists() else {}
            mean, parts = overhead_means(s.to_dict("records")) or (None, {})
            rows.append({"strategy": label, "prompt_len": n, "start": start,
                         "overhead": percentile(s["ttft_overhead_ms"], 50),
                         "parts": format_overhead(mean, parts) if mean is not None else "-",
                         "clock": gpu.get("clocks_sm", ""), "temp": gpu.get("temperature_gpu", ""),
                         "graphs": ", ".join(f"{k} {v}" for k, v in graphs.items())})
    columns = [Column("strategy"), Column("prompt", "prompt_len"), Column("start"),
               Column("TTFT overhead ms", "overhead", ".1f"), Column("overhead parts, mean ms", "parts"),
               Column("SM MHz", "clock"), Column("C", "temp"), Column("decode CUDA graphs", "graphs")]
    return format_table(rows, columns, markdown=True)


def _true(v) -> bool:
    return v is not None and v == v and bool(v)  # NaN (no value in a pandas column) != NaN


def strategy_table(rows: list[dict]) -> str:
    """The Markdown table of strategy_rows: each median with its interval (a throughput also as a
    share of the ceiling, an overhead as a share of what its declaration names); with several
    engine starts, the mean of the starts' medians with its interval over the starts."""
    starts = max((r.get("starts") or 1 for r in rows), default=1) > 1
    columns = [Column("strategy"), Column("prompt", "prompt_len"), *([Column("starts")] if starts else [])]
    for f in shown_in("bench"):
        key = f"{f.name}_across" if starts else f.name
        columns.append(Column(f.header, share_cell(f, key) if f.share_of else key, f.spec, interval=True))
        if f.unit == "GB/s":
            columns.append(Column("of ceiling", "ceiling_share_across" if starts else "ceiling_share", ".2f", True))
    columns += [Column("overhead parts, mean ms", overhead_parts), Column("match", lambda r: f"{r['match_rate']:.0%}"),
                Column("digests", digests_cell)]
    return format_table(rows, columns, markdown=True)


def share_cell(f: Field, key: str):
    """A median with its interval, and as a share of another median (a TTFT overhead of the baseline's TTFT)."""
    median = Column(key, spec=f.spec, interval=True)
    other = key.replace(f.name, f.share_of)
    return lambda r: median.cell(r) + (f" ({r[key] / r[other]:+.0%})" if r.get(key) is not None
                                       and r.get(other) else "")


def digests_cell(r: dict) -> str:
    ok = r.get("digest_ok")
    if ok is None or ok != ok:  # None, or NaN read back from rows.csv
        return "off"
    return "ok" if ok else "FAIL"


def overhead_parts(r: dict) -> str:
    if r.get("overhead_mean_ms") is None:
        return "-"
    return format_overhead(r["overhead_mean_ms"], {part: r[f"overhead_{part}_ms"] for part, _ in CRITICAL_PATH})


def replot(out: Path) -> None:
    """Every figure of a benchmark directory again: figure<X>.png from rows<X>.csv, titled by
    table<X>.md's first line (as when the benchmark wrote them)."""
    for rows in sorted(out.glob("rows*.csv")):
        suffix = rows.name.removeprefix("rows").removesuffix(".csv")
        table = out / f"table{suffix}.md"
        title = table.read_text().splitlines()[0] if table.exists() else None
        plot(out, title=title, suffix=suffix)


def plot(out: Path, title: str | None = None, suffix: str = "") -> None:
    """figure.png from rows.csv (figure<suffix>.png from rows<suffix>.csv): GB/s against KV bytes
    per strategy (with the ceiling), and the TTFT overheads against prompt length."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd

    df = pd.read_csv(out / f"rows{suffix}.csv")
    ceiling = (df["gbps"] / df["ceiling_share"]).dropna().median()
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.5))
    for name, g in df.groupby("strategy", sort=False):
        if g["gbps"].gt(0).any():  # vLLM's connectors: bytes and times not seen from outside
            a.plot(g["bytes"] / 2**20, g["gbps"], "o-", label=name)
        base = g["base_ttft_ms"]
        line, = b.plot(g["prompt_len"], 100 * g["ttft_overhead_ms"] / base, "o-", label=f"{name}: decode's first token")
        b.plot(g["prompt_len"], 100 * g["prefill_ttft_overhead_ms"] / base, "s--", color=line.get_color(),
               label=f"{name}: prefill's token")
    if ceiling == ceiling:  # NaN where no strategy's bandwidth was seen
        a.axhline(ceiling, color="k", ls=":", label=f"ceiling {ceiling:.0f} GB/s")
        a.set(xscale="log", yscale="log")
    a.set(xlabel="KV bytes moved per request (MiB)", ylabel="GB/s (bytes / transfer ms)")
    b.axhline(0, color="k", lw=0.5)
    b.set(xscale="log", xlabel="prompt tokens", ylabel="TTFT overhead vs colocated baseline (%)")
    if a.get_legend_handles_labels()[0]:
        a.legend(fontsize=8)
    b.legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(out / f"figure{suffix}.png", dpi=110)
    plt.close(fig)
