"""Every strategy over a range of prompt lengths, against the machine's copy bandwidth measured
in the same run.

    python scripts/bench_strategies.py [--experiment cpu_bench] [--two-gpus] [--out DIR]
        [-- harness overrides ...]

(This module is the benchmark; scripts/bench_strategies.py runs its main.)

An experiment (conf/experiment/) says what to run: its model, device and engine settings, and
bench.lengths, bench.per_length and bench.strategies; harness overrides after -- change any of
them (-- bench.lengths=[32,2048] bench.strategies=[fused]). A strategy's own engine settings
(full_cache's smaller cache) come from its config, or from the experiment's
conf/experiment/<experiment>/<strategy>.yaml.

One harness run per strategy (its prompts cover every length, one request in flight at a
time), then one table per strategy and prompt length (medians, each with its 95% bootstrap
interval where the requests differ):
  transfer ms     the sender starts gathering -> the last byte is in the decode engine's memory
                  (on a GPU: on the GPU's clock, CUDA events)
  host clock ms   the same on the host's clock
  GB/s, of ceiling  KV bytes / transfer ms, and that as a share of the ceiling
  notify ms       -> the decode worker has been told (doorbell latency; not in transfer ms)
  KV ready ms     the sender starts -> the KV is in the decode engine's own blocks
  KV e2e ms       the prefill's forward pass done -> the KV in the decode engine's own blocks
  TTFT overhead   the first token from the decode engine, against the colocated baseline
  prefill TTFT overhead  the first token as the prefill engine returns it (the KV has left by
                  then): what a client sees when a router streams the prefill's token
  overhead parts  the mean TTFT overhead cut into its parts (prefill, send, delivery, pickup,
                  scatter, check, decode: results/README.md), which add up to the mean overhead
bench.decode_submit lists when the decode request goes (early, after_prefill; default: the
harness's default): each strategy runs once per entry, as <strategy>-<entry>.
The ceiling: a large tensor copy (bytes copied / time) on the same device, or from GPU 0 to
GPU 1 with --two-gpus, measured before and after the runs; the higher one is used. Writes
table.md and rows.csv next to the runs.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pandas as pd

from harness.ceiling import copy_ceiling_gbps
from harness.records import PROJECT_ROOT, format_overhead, overhead_means
from harness.results import load_requests
from harness.schema import CRITICAL_PATH, OVERHEAD_PARTS
from harness.stats import Column, format_table, p50_with_interval
from harness.workload import bench_prompts

ROOT = PROJECT_ROOT


def argument_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--experiment", default="cpu_bench", help="a conf/experiment/ config with a bench section")
    ap.add_argument("--two-gpus", action="store_true",
                    help="prefill on GPU 0, decode on GPU 1; the ceiling is a GPU 0 -> GPU 1 peer copy")
    ap.add_argument("--out", default=None)
    ap.add_argument("--replot", default=None, metavar="DIR",
                    help="only redraw DIR/figure.png from DIR/rows.csv (and figure-X.png from each rows-X.csv), "
                         "titled by the table's first line: committed benchmarks keep rows.csv, not the figure")
    ap.add_argument("--retable", default=None, metavar="DIR",
                    help="only write DIR's table.md, rows.csv and figure.png again from its runs' records "
                         "(after the table gained a column), with the ceiling measured when it ran")
    ap.add_argument("overrides", nargs="*", help="harness overrides, after --")
    return ap


def main() -> int:
    args = argument_parser().parse_args()
    if args.replot:
        replot(Path(args.replot))
        return 0
    if args.retable:
        out = Path(args.retable)
        before = pd.read_csv(out / "rows.csv")
        labels = [s for s in dict.fromkeys(before["strategy"]) if (out / s).is_dir()]
        ceiling = float((before["gbps"] / before["ceiling_share"]).dropna().median())
        print(write_tables(out, labels, ceiling, (out / "table.md").read_text().splitlines()[0]))
        return 0
    plan = Plan.compose(args.experiment, args.overrides, args.two_gpus)  # bad input stops here, before any run
    lengths = plan.lengths
    out = Path(args.out or ROOT / "results" / "bench" / time.strftime("strategies_%Y-%m-%d_%H-%M-%S"))
    if out.exists() and any(out.iterdir()):  # the harness appends to its records: never mix two benchmarks
        sys.exit(f"error: {out} already holds results; give a new --out directory")
    out.mkdir(parents=True, exist_ok=True)

    (out / "prompts.jsonl").write_text(bench_prompts(lengths, plan.per_length))
    ceiling_of = "GPU 0 -> GPU 1 peer copy" if args.two_gpus else f"{plan.device} copy"

    def ceiling_now() -> float:
        if args.two_gpus:
            return copy_ceiling_gbps("cuda:0", to_device="cuda:1")
        return copy_ceiling_gbps(plan.device)

    ceiling_before = ceiling_now()
    print(f"copy ceiling before: {ceiling_before:.2f} GB/s", flush=True)

    codes = []
    for label, strategy, submit in plan.runs:
        run_dir = out / label
        cmd = [sys.executable, "-m", "harness", f"hydra.run.dir={run_dir}",
               *plan.harness_overrides(strategy, out / "prompts.jsonl", submit)]
        print(f"--- {label}: {' '.join(cmd[2:])}", flush=True)
        codes.append(subprocess.run(cmd, cwd=ROOT).returncode)

    ceiling_after = ceiling_now()
    ceiling = max(ceiling_before, ceiling_after)
    print(f"copy ceiling after: {ceiling_after:.2f} GB/s", flush=True)

    title = (f"ceiling ({ceiling_of}, same run): {ceiling:.2f} GB/s "
             f"(before {ceiling_before:.2f}, after {ceiling_after:.2f})")
    print(write_tables(out, [label for label, _, _ in plan.runs], ceiling, title))
    print(f"\nwritten: {out / 'table.md'}, {out / 'rows.csv'}, {out / 'figure.png'}")
    return 0 if all(c == 0 for c in codes) else 1


def write_tables(out: Path, labels: list[str], ceiling: float, title: str) -> str:
    """table.md, rows.csv and figure.png in out from the records of its runs (one per label)."""
    rows = strategy_rows(load_requests(*(out / s for s in labels if (out / s).is_dir())), labels, ceiling)
    table = f"{title}\n\n{strategy_table(rows)}\n\n{INTERVAL_NOTE}"
    (out / "table.md").write_text(table + "\n")
    pd.DataFrame(rows, columns=CSV_COLUMNS).to_csv(out / "rows.csv", index=False)
    plot(out, title=title)
    return table


class Plan:
    """What one benchmark runs: the experiment, the overrides after --, and what its config
    (composed as the harness composes it) says about lengths, strategies and device."""

    def __init__(self, experiment: str, overrides: list[str], lengths: list[int], per_length: int,
                 strategies: list[str], device: str, submits: list[str | None] | None = None):
        self.experiment, self.overrides = experiment, overrides
        self.lengths, self.per_length, self.strategies, self.device = lengths, per_length, strategies, device
        self.submits = submits or [None]

    @property
    def runs(self) -> list[tuple[str, str, str | None]]:
        """(run directory name, strategy, run.decode_submit) of each harness run."""
        return [(s if m is None or len(self.submits) == 1 else f"{s}-{m}", s, m)
                for s in self.strategies for m in self.submits]

    @classmethod
    def compose(cls, experiment: str, overrides: list[str], two_gpus: bool = False) -> Plan:
        from hydra import compose, initialize_config_dir
        from hydra.errors import HydraException
        from omegaconf.errors import OmegaConfBaseException

        from harness import resolvers

        resolvers.register()
        if two_gpus:
            overrides = ["device=cuda", "device.prefill_gpu=0", "device.decode_gpu=1", "device.baseline_gpu=0",
                         *overrides]
        try:
            with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
                cfg = compose("config", overrides=[f"experiment={experiment}", *overrides])
            bench = cfg.get("bench")
            if bench is None:
                raise ValueError(f"experiment {experiment!r} has no bench section (lengths, per_length, strategies)")
            plan = cls(experiment, list(overrides), [int(n) for n in bench.lengths], int(bench.per_length),
                       list(bench.strategies), cfg.device.type, list(bench.get("decode_submit") or []))
        except (HydraException, OmegaConfBaseException, ValueError, TypeError) as e:
            print(f"error: --experiment {experiment} -- {' '.join(overrides)}: {str(e).splitlines()[0]}",
                  file=sys.stderr)
            sys.exit(2)
        if plan.device == "auto":
            import torch

            plan.device = "cuda" if torch.cuda.is_available() else "cpu"
        return plan

    def harness_overrides(self, strategy: str, prompts: Path, submit: str | None = None) -> list[str]:
        """One strategy's harness run: the experiment, the benchmark's prompts, then the overrides after --."""
        return [f"experiment={self.experiment}", f"strategy={strategy}", "workload=jsonl", f"workload.path={prompts}",
                f"engine.max_model_len={max(self.lengths) + 64}", "sampling.max_tokens=4",
                *([f"run.decode_submit={submit}"] if submit else []), *self.overrides]


# Per strategy and prompt length: the median of the requests, with its bootstrap interval
MEDIANS = ["bytes", "messages", "transfer_ms", "transfer_host_ms", "gbps", "notify_ms", "ready_ms", "kv_ms",
           "after_forward_ms", "ttft_ms", "base_ttft_ms", "ttft_overhead_ms", "prefill_ttft_overhead_ms"]
# ... and the means of the TTFT overhead's parts (they add up to the mean overhead)
CSV_COLUMNS = (["strategy", "prompt_len", "bytes", "messages", "transfer_ms", "transfer_host_ms", "gbps",
                "ceiling_share", "notify_ms", "ready_ms", "kv_ms", "after_forward_ms", "ttft_ms", "base_ttft_ms",
                "ttft_overhead_ms", "prefill_ttft_overhead_ms", "match_rate", "digest_ok", "overhead_mean_ms",
                *OVERHEAD_PARTS]
               + [f"{k}_{end}" for k in [*MEDIANS, "ceiling_share"] for end in ("lo", "hi")])
INTERVAL_NOTE = ("Each value is the median of that strategy's requests of that length; [lo, hi] is its 95% bootstrap "
                 "interval (1000 resamples, harness/stats.py), shown where the requests differ.")


def strategy_rows(requests: pd.DataFrame, labels: list[str], ceiling: float) -> list[dict]:
    """One row per run (named by its directory: the strategy, or <strategy>-<decode_submit>) and
    prompt length of the runs' requests (harness.results.load_requests)."""
    rows = []
    for label, n, g in cells(requests, labels):
        row = {"strategy": label, "prompt_len": n}
        for k in MEDIANS:
            row.update(p50_with_interval(g[k] if k in g else [None] * len(g), k))
        mean, parts = overhead_means(g.to_dict("records")) or (None, {})
        row["overhead_mean_ms"] = mean
        row.update({f"overhead_{part}_ms": parts.get(part) for part, _ in CRITICAL_PATH})
        for end in ("", "_lo", "_hi"):
            gbps = row[f"gbps{end}"]
            row[f"ceiling_share{end}"] = gbps / ceiling if gbps else None
        row["match_rate"] = float(g["match"].map(_true).mean())
        checked = g["digest_match"].dropna()  # no value: digests off (check.digests=false)
        row["digest_ok"] = bool(checked.map(_true).all()) if len(checked) else None
        rows.append(row)
    return rows


def cells(requests: pd.DataFrame, labels: list[str]) -> Iterator[tuple[str, int, pd.DataFrame]]:
    """The benchmark's cells, as its table has them: (run label, prompt length, those requests) for
    each label in order (a run is named by its directory: the strategy, or
    <strategy>-<decode_submit>), each length in increasing order. scripts/compare_bench.py
    compares two benchmarks cell by cell through it."""
    if not len(requests):
        return
    run_names = requests["run_dir"].map(lambda d: Path(d).name)
    for label in labels:
        for n, g in requests[run_names == label].groupby("prompt_len"):
            if "prefill_ttft_overhead_ms" not in g or g["prefill_ttft_overhead_ms"].isna().all():  # before version 3
                g = g.assign(prefill_ttft_overhead_ms=g["prefill_ms"] - g["base_ttft_ms"])
            yield label, int(n), g


def _true(v) -> bool:
    return v is not None and v == v and bool(v)  # NaN (no value in a pandas column) != NaN


def strategy_table(rows: list[dict]) -> str:
    """The Markdown table of strategy_rows: each median with its interval."""
    def overhead(key):  # also as a share of the baseline's TTFT
        median = Column(key, spec=".1f", interval=True)
        return lambda r: median.cell(r) + (f" ({r[key] / r['base_ttft_ms']:+.0%})" if r[key] is not None
                                           and r["base_ttft_ms"] else "")

    columns = [Column("strategy"), Column("prompt", "prompt_len"), Column("KV bytes moved", "bytes", ".0f", True),
               Column("messages", "messages", ".0f", True), Column("transfer ms", "transfer_ms", ".3f", True),
               Column("host clock ms", "transfer_host_ms", ".3f", True), Column("GB/s", "gbps", ".2f", True),
               Column("of ceiling", "ceiling_share", ".2f", True), Column("notify ms", "notify_ms", ".3f", True),
               Column("KV ready ms", "ready_ms", ".3f", True), Column("KV e2e ms", "kv_ms", ".3f", True),
               Column("after forward ms", "after_forward_ms", ".1f", True),
               Column("TTFT ms", "ttft_ms", ".1f", True),
               Column("baseline TTFT ms", "base_ttft_ms", ".1f", True),
               Column("TTFT overhead", overhead("ttft_overhead_ms")),
               Column("prefill TTFT overhead", overhead("prefill_ttft_overhead_ms")),
               Column("overhead parts, mean ms", overhead_parts),
               Column("match", lambda r: f"{r['match_rate']:.0%}"),
               Column("digests", digests_cell)]
    return format_table(rows, columns, markdown=True)


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
        a.plot(g["bytes"] / 2**20, g["gbps"], "o-", label=name)
        base = g["base_ttft_ms"]
        line, = b.plot(g["prompt_len"], 100 * g["ttft_overhead_ms"] / base, "o-", label=f"{name}: decode's first token")
        b.plot(g["prompt_len"], 100 * g["prefill_ttft_overhead_ms"] / base, "s--", color=line.get_color(),
               label=f"{name}: prefill's token")
    a.axhline(ceiling, color="k", ls=":", label=f"ceiling {ceiling:.0f} GB/s")
    a.set(xscale="log", yscale="log", xlabel="KV bytes moved per request (MiB)", ylabel="GB/s (bytes / transfer ms)")
    b.axhline(0, color="k", lw=0.5)
    b.set(xscale="log", xlabel="prompt tokens", ylabel="TTFT overhead vs colocated baseline (%)")
    a.legend(fontsize=8)
    b.legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(out / f"figure{suffix}.png", dpi=110)
    plt.close(fig)

