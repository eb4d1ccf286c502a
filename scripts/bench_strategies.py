"""Every strategy over a range of prompt lengths, against the machine's copy bandwidth measured
in the same run.

    python scripts/bench_strategies.py [--lengths 32,128,512,1024,2048] [--per-length 3]
        [--strategies full_cache,per_request_blocks,fused,layerwise] [-- harness overrides ...]

One harness run per strategy (its prompts cover every length, one request in flight at a
time), then one table: bytes, messages, transfer ms, GB/s, share of the copy ceiling, and
TTFT overhead against the colocated baseline, per strategy and prompt length (medians).
The ceiling: a large tensor copy on the same device (bytes copied / time), measured before
and after the runs. Writes table.md and rows.csv next to the runs.
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
    ap.add_argument("--lengths", default="32,128,512,1024,2048")
    ap.add_argument("--per-length", type=int, default=3)
    ap.add_argument("--strategies", default="full_cache,per_request_blocks,fused,layerwise")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", default=None)
    ap.add_argument("overrides", nargs="*", help="harness overrides, after --")
    args = ap.parse_args()
    lengths = [int(x) for x in args.lengths.split(",")]
    out = Path(args.out or ROOT / "results" / "bench" / time.strftime("strategies_%Y-%m-%d_%H-%M-%S"))
    out.mkdir(parents=True, exist_ok=True)

    rng = random.Random(0)
    prompts = [[rng.randrange(10, 3400) for _ in range(n)] for n in lengths for _ in range(args.per_length)]
    (out / "prompts.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    ceiling_before = copy_ceiling_gbps(args.device)
    print(f"copy ceiling before: {ceiling_before:.2f} GB/s", flush=True)

    rows = []
    for strategy in args.strategies.split(","):
        run_dir = out / strategy
        cmd = [sys.executable, "-m", "harness", f"hydra.run.dir={run_dir}", f"strategy={strategy}",
               f"device={args.device}", "workload=jsonl", f"workload.path={out / 'prompts.jsonl'}",
               f"engine.max_model_len={max(lengths) + 64}", "sampling.max_tokens=4", *args.overrides]
        print(f"--- {strategy}: {' '.join(cmd[2:])}", flush=True)
        code = subprocess.run(cmd, cwd=ROOT).returncode
        got = [json.loads(x) for x in (run_dir / "requests.jsonl").read_text().splitlines() if x.strip()]
        for r in got:
            r["exit_code"] = code
        rows += got

    ceiling_after = copy_ceiling_gbps(args.device)
    ceiling = max(ceiling_before, ceiling_after)
    print(f"copy ceiling after: {ceiling_after:.2f} GB/s", flush=True)

    def med(rs, k):
        vals = [r[k] for r in rs if r.get(k) is not None]
        return statistics.median(vals) if vals else None

    lines = [f"copy ceiling (same run, {args.device}): {ceiling:.2f} GB/s "
             f"(before {ceiling_before:.2f}, after {ceiling_after:.2f})", "",
             "| strategy | prompt | KV bytes moved | messages | transfer ms | GB/s | of ceiling | TTFT overhead ms | match | digests |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    csv = ["strategy,prompt_len,bytes,messages,transfer_ms,gbps,ceiling_share,ttft_overhead_ms,match_rate,digest_ok"]
    for strategy in args.strategies.split(","):
        for n in lengths:
            rs = [r for r in rows if r["strategy"] == strategy and r["prompt_len"] == n]
            if not rs:
                continue
            gbps = med(rs, "gbps")
            share = gbps / ceiling if gbps else None
            match = sum(bool(r["match"]) for r in rs) / len(rs)
            digest = all(r["digest_match"] for r in rs)
            vals = [med(rs, "bytes"), med(rs, "messages"), med(rs, "transfer_ms"), gbps, share,
                    med(rs, "ttft_overhead_ms")]
            fmt = ["{:.0f}", "{:.0f}", "{:.3f}", "{:.2f}", "{:.2f}", "{:.1f}"]
            cells = [f.format(v) if v is not None else "-" for f, v in zip(fmt, vals)]
            lines.append(f"| {strategy} | {n} | " + " | ".join(cells) + f" | {match:.0%} | {'ok' if digest else 'FAIL'} |")
            csv.append(",".join([strategy, str(n), *[str(v) for v in vals], str(match), str(digest)]))
    table = "\n".join(lines)
    (out / "table.md").write_text(table + "\n")
    (out / "rows.csv").write_text("\n".join(csv) + "\n")
    print(table)
    print(f"\nwritten: {out / 'table.md'}")
    return 0 if all(r["exit_code"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
