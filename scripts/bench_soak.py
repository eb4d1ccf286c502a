"""Soak (issue 14): many requests of mixed lengths, some sharing prefixes, through every built-in
strategy on the CPU, with every output and digest checked, while each engine's memory is sampled:
does anything grow?

    python scripts/bench_soak.py [--requests 1000] [--concurrency 8] [--max-len 1500]
                                 [--strategies fused,per_request_blocks,layerwise,full_cache]
                                 [--out DIR] [overrides ...]

The prompts (seeded): lengths uniform in [1, max-len]; one in four starts with one of 8 shared
prefixes (128 to 1,024 tokens). One harness run per strategy (run directories under DIR, default
results/bench/soak_<time>), 16 output tokens each. Meanwhile the resident memory (RSS) of each
engine process is sampled every second with the number of P/D requests finished so far
(DIR/<strategy>/memory.csv), and apart from it its private memory (RSS less shared pages: the
KV staging buffer is shared memory both engines touch). Growth is measured over the P/D pass:
each engine's memory once 10% of its requests had finished against the last sample before the
engines stop. KV blocks, staging regions or transfers still held at the end fail the run
(kv_blocks_in_use, transfer_held).
Prints one table and writes DIR/soak.json. Exit 1 if a run was not ok.
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

import psutil

from harness.resolvers import built_in_strategies

ROOT = Path(__file__).resolve().parent.parent
STRATEGIES = built_in_strategies()
VOCAB = (10, 3400)  # tiny-llama's ordinary token ids


def prompts(n: int, max_len: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    prefixes = [[rng.randrange(*VOCAB) for _ in range(rng.randrange(128, 1025))] for _ in range(8)]
    out = []
    for _ in range(n):
        length = rng.randrange(1, max_len + 1)
        head = rng.choice(prefixes)[:length] if rng.random() < 0.25 else []
        out.append(head + [rng.randrange(*VOCAB) for _ in range(length - len(head))])
    return out


def lines(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


def run_one(strategy: str, run_dir: Path, prompt_path: Path, concurrency: int, overrides: list[str]) -> dict:
    cmd = [sys.executable, "-m", "harness", f"hydra.run.dir={run_dir}", f"strategy={strategy}", "workload=jsonl",
           f"workload.path={prompt_path}", f"workload.concurrency={concurrency}", "engine.max_model_len=2048",
           "sampling.max_tokens=16", "device=cpu", *overrides]
    shutil.rmtree(run_dir, ignore_errors=True)  # the records append: each run from nothing
    run_dir.mkdir(parents=True)
    samples = []
    with open(run_dir / "harness.out", "w") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        while proc.poll() is None:
            time.sleep(1.0)
            try:
                pids = json.loads((run_dir / "engines.json").read_text())
            except (FileNotFoundError, json.JSONDecodeError):
                continue
            row = {"t_s": time.monotonic(), "pd_done": lines(run_dir / "requests.jsonl")}
            for name, pid in pids.items():
                try:
                    mem = psutil.Process(pid).memory_info()
                except psutil.Error:
                    continue
                # shared pages (the KV staging buffer both engines map) count in both RSS as they are touched
                row[f"{name}_rss_mib"], row[f"{name}_private_mib"] = mem.rss / 2**20, (mem.rss - mem.shared) / 2**20
            samples.append(row)
    if samples:
        keys = sorted({k for s in samples for k in s})
        with open(run_dir / "memory.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=keys)
            w.writeheader()
            w.writerows(samples)
    summary = json.loads((run_dir / "summary.json").read_text())
    out = {k: summary.get(k) for k in ("status", "requests", "match_rate", "mismatches", "baseline_self_mismatches",
                                        "digest_checked", "digest_failures", "transfer_errors", "kv_recomputed",
                                        "kv_blocks_in_use", "transfer_held")}
    out["exit_code"] = proc.returncode
    out["disagg_s"] = summary.get("timings", {}).get("disagg_s")
    n = summary.get("requests") or 0
    # over the P/D pass: from 10% of its requests done to the last sample before the engines stop
    during = [s for s in samples if max(1, n // 10) <= s["pd_done"] < n]
    for engine in ("prefill", "decode"):
        for kind in ("rss", "private"):
            key = f"{engine}_{kind}_mib"
            values = [s[key] for s in during if s.get(key)]
            if len(values) >= 2:
                out[f"{key}_at_10pct"], out[f"{key}_at_end"] = round(values[0], 1), round(values[-1], 1)
                out[f"{engine}_{kind}_growth_pct"] = round(100 * (values[-1] - values[0]) / values[0], 2)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--max-len", type=int, default=1500)
    ap.add_argument("--strategies", default=",".join(STRATEGIES))
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("overrides", nargs="*")
    a = ap.parse_args()
    if a.requests < 1 or a.concurrency < 1 or not 1 <= a.max_len <= 2000:
        print("error: --requests and --concurrency must be >= 1, --max-len in [1, 2000] (max_model_len 2048 "
              "less 16 output tokens)", file=sys.stderr)
        return 2
    out = a.out or ROOT / "results" / "bench" / time.strftime("soak_%Y-%m-%d_%H-%M-%S")
    out.mkdir(parents=True, exist_ok=True)
    prompt_path = out / "prompts.jsonl"
    prompt_path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts(a.requests, a.max_len)))
    results = {}
    for strategy in a.strategies.split(","):
        results[strategy] = run_one(strategy, out / strategy, prompt_path, a.concurrency, a.overrides)
        r = results[strategy]
        print(f"{strategy:20s} {r['status']:8s} match {r['match_rate']} digests {r['digest_failures']}/"
              f"{r['digest_checked']} failed, kv held {r['kv_blocks_in_use']}, P/D {r['disagg_s']:.0f} s; from 10% "
              f"to the end RSS prefill {r.get('prefill_rss_growth_pct')}% decode {r.get('decode_rss_growth_pct')}%, "
              f"private prefill {r.get('prefill_private_growth_pct')}% decode {r.get('decode_private_growth_pct')}%",
              flush=True)
    (out / "soak.json").write_text(json.dumps({"command": " ".join(sys.argv), "requests": a.requests,
                                               "concurrency": a.concurrency, "max_len": a.max_len,
                                               "results": results}, indent=2))
    print(f"written: {out / 'soak.json'}")
    return 0 if all(r["exit_code"] == 0 for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
