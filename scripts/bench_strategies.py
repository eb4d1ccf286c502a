"""Every strategy over a range of prompt lengths, against the machine's copy bandwidth measured
in the same run.

    python scripts/bench_strategies.py [--lengths 32,128,256,512,1024,2048] [--per-length 5]
        [--strategies full_cache,per_request_blocks,fused,layerwise] [--device cpu|cuda]
        [--two-gpus] [--set STRATEGY:KEY=VALUE ...] [-- harness overrides ...]

One harness run per strategy (its prompts cover every length, one request in flight at a
time), then one table per strategy and prompt length (medians):
  transfer ms     the sender starts gathering -> the last byte is in the decode engine's memory
                  (on a GPU: on the GPU's clock, CUDA events)
  host clock ms   the same on the host's clock
  GB/s, of ceiling  KV bytes / transfer ms, and that as a share of the ceiling
  notify ms       -> the decode worker has been told (doorbell latency; not in transfer ms)
  KV ready ms     the sender starts -> the KV is in the decode engine's own blocks
  TTFT overhead   the first token from the decode engine, against the colocated baseline
  prefill TTFT overhead  the first token as the prefill engine returns it (the KV has left by
                  then): what a client sees when a router streams the prefill's token
The ceiling: a large tensor copy (bytes copied / time) on the same device, or from GPU 0 to
GPU 1 with --two-gpus, measured before and after the runs; the higher one is used. Writes
table.md and rows.csv next to the runs.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from harness.ceiling import copy_ceiling_gbps

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lengths", default="32,128,256,512,1024,2048")
    ap.add_argument("--per-length", type=int, default=5)
    ap.add_argument("--strategies", default="full_cache,per_request_blocks,fused,layerwise")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--two-gpus", action="store_true",
                    help="prefill on GPU 0, decode on GPU 1; the ceiling is a GPU 0 -> GPU 1 peer copy")
    ap.add_argument("--set", action="append", default=[], metavar="STRATEGY:KEY=VALUE",
                    help="a harness override for one strategy only, e.g. full_cache:engine.kv_cache_gib=2.5 "
                         "(replaces the same key among the overrides after --)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--replot", default=None, metavar="DIR", help="only redraw DIR/figure.png from DIR/rows.csv")
    ap.add_argument("overrides", nargs="*", help="harness overrides, after --")
    args = ap.parse_args()
    if args.replot:
        plot(Path(args.replot))
        return 0
    lengths = [int(x) for x in args.lengths.split(",")]
    for strategy in args.strategies.split(","):
        overrides_for(strategy, args.overrides, args.set)  # bad --set stops here, before any run
    out = Path(args.out or ROOT / "results" / "bench" / time.strftime("strategies_%Y-%m-%d_%H-%M-%S"))
    if out.exists() and any(out.iterdir()):  # the harness appends to its records: never mix two benchmarks
        sys.exit(f"error: {out} already holds results; give a new --out directory")
    out.mkdir(parents=True, exist_ok=True)

    rng = random.Random(0)
    prompts = [[rng.randrange(10, 3400) for _ in range(n)] for n in lengths for _ in range(args.per_length)]
    (out / "prompts.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    if args.two_gpus:
        args.device = "cuda"
        args.overrides = ["device.prefill_gpu=0", "device.decode_gpu=1", "device.baseline_gpu=0", *args.overrides]
    ceiling_of = "GPU 0 -> GPU 1 peer copy" if args.two_gpus else f"{args.device} copy"

    def ceiling_now() -> float:
        if args.two_gpus:
            return copy_ceiling_gbps("cuda:0", to_device="cuda:1")
        return copy_ceiling_gbps(args.device)

    ceiling_before = ceiling_now()
    print(f"copy ceiling before: {ceiling_before:.2f} GB/s", flush=True)

    rows = []
    for strategy in args.strategies.split(","):
        run_dir = out / strategy
        cmd = [sys.executable, "-m", "harness", f"hydra.run.dir={run_dir}", f"strategy={strategy}",
               f"device={args.device}", "workload=jsonl", f"workload.path={out / 'prompts.jsonl'}",
               f"engine.max_model_len={max(lengths) + 64}", "sampling.max_tokens=4",
               *overrides_for(strategy, args.overrides, args.set)]
        print(f"--- {strategy}: {' '.join(cmd[2:])}", flush=True)
        code = subprocess.run(cmd, cwd=ROOT).returncode
        got = [json.loads(x) for x in (run_dir / "requests.jsonl").read_text().splitlines() if x.strip()]
        for r in got:
            r["exit_code"] = code
        rows += got

    ceiling_after = ceiling_now()
    ceiling = max(ceiling_before, ceiling_after)
    print(f"copy ceiling after: {ceiling_after:.2f} GB/s", flush=True)

    def med(rs, k):
        vals = [r[k] for r in rs if r.get(k) is not None]
        return statistics.median(vals) if vals else None

    lines = [f"ceiling ({ceiling_of}, same run): {ceiling:.2f} GB/s "
             f"(before {ceiling_before:.2f}, after {ceiling_after:.2f})", "",
             "| strategy | prompt | KV bytes moved | messages | transfer ms | host clock ms | GB/s | of ceiling | notify ms "
             "| KV ready ms | TTFT ms (baseline) | TTFT overhead | prefill TTFT overhead | match | digests |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    csv = ["strategy,prompt_len,bytes,messages,transfer_ms,transfer_host_ms,gbps,ceiling_share,notify_ms,ready_ms,ttft_ms,"
           "base_ttft_ms,ttft_overhead_ms,prefill_ttft_overhead_ms,match_rate,digest_ok"]
    for strategy in args.strategies.split(","):
        for n in lengths:
            rs = [r for r in rows if r["strategy"] == strategy and r["prompt_len"] == n]
            if not rs:
                continue
            gbps = med(rs, "gbps")
            share = gbps / ceiling if gbps else None
            match = sum(bool(r["match"]) for r in rs) / len(rs)
            digest = all(r["digest_match"] for r in rs)
            for r in rs:
                r["prefill_ttft_overhead_ms"] = r["prefill_ms"] - r["base_ttft_ms"]
            ttft, base = med(rs, "ttft_ms"), med(rs, "base_ttft_ms")
            vals = [med(rs, "bytes"), med(rs, "messages"), med(rs, "transfer_ms"), med(rs, "transfer_host_ms"), gbps, share,
                    med(rs, "notify_ms"), med(rs, "ready_ms"), ttft, base, med(rs, "ttft_overhead_ms"),
                    med(rs, "prefill_ttft_overhead_ms")]
            fmt = ["{:.0f}", "{:.0f}", "{:.3f}", "{:.3f}", "{:.2f}", "{:.2f}", "{:.3f}", "{:.3f}", "{:.1f}", "{:.1f}",
                   "{:.1f}", "{:.1f}"]
            cells = [f.format(v) if v is not None else "-" for f, v in zip(fmt, vals)]
            cells[8:10] = [f"{cells[8]} ({cells[9]})"]
            for i in (9, 10):  # the overheads also as a share of the baseline's TTFT
                v = vals[i + 1]
                cells[i] += f" ({v / base:+.0%})" if v is not None and base else ""
            lines.append(f"| {strategy} | {n} | " + " | ".join(cells) + f" | {match:.0%} | {'ok' if digest else 'FAIL'} |")
            csv.append(",".join([strategy, str(n), *[str(v) for v in vals], str(match), str(digest)]))
    table = "\n".join(lines)
    (out / "table.md").write_text(table + "\n")
    (out / "rows.csv").write_text("\n".join(csv) + "\n")
    print(table)
    plot(out, title=lines[0])
    print(f"\nwritten: {out / 'table.md'}, {out / 'rows.csv'}, {out / 'figure.png'}")
    return 0 if all(r["exit_code"] == 0 for r in rows) else 1


def overrides_for(strategy: str, overrides: list[str], sets: list[str]) -> list[str]:
    """The harness overrides for one strategy's run: the common ones, with the keys that this
    strategy's --set STRATEGY:KEY=VALUE items give replaced by theirs."""
    mine = []
    for item in sets:
        name, sep, override = item.partition(":")
        if not sep or "=" not in override or not name:
            sys.exit(f"error: --set {item!r}: expected STRATEGY:KEY=VALUE, e.g. full_cache:engine.kv_cache_gib=2.5")
        if name == strategy:
            mine.append(override)
    keys = {o.split("=", 1)[0] for o in mine}
    return [o for o in overrides if o.split("=", 1)[0] not in keys] + mine


def plot(out: Path, title: str | None = None) -> None:
    """figure.png from rows.csv: GB/s against KV bytes per strategy (with the ceiling), and the
    TTFT overheads against prompt length."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd

    df = pd.read_csv(out / "rows.csv")
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
    fig.savefig(out / "figure.png", dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
