"""Two sweeps of the same jobs, one with engines kept between jobs (run.reuse_engines, the
default) and one cold (run.reuse_engines=false): each job's wall time, the engines it started,
and whether its verdict, every output and every transfer's digests are the same in both.

    JOBS="strategy=fused workload=synthetic workload.prompt_len=64,256,1024"
    python -m harness -m hydra.sweep.dir=OUT/cold run.reuse_engines=false $JOBS
    python -m harness -m hydra.sweep.dir=OUT/reused $JOBS
    python scripts/compare_sweeps.py OUT/cold OUT/reused      # a markdown table; exit 1 if any job differs

(`bash scripts/sweep_reuse.sh OUT $JOBS` runs all three.) A sweep's wall time is its
sweep_wall_s.txt when the caller wrote one (the process's, Hydra and imports included), else the
sum of its jobs' total_s.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from harness.records.files import read_jsonl
from harness.workload import is_warmup


def jobs(sweep: Path) -> dict[str, Path]:
    """Job directories by name, in the order the sweep ran them (Hydra's job number first)."""
    number = lambda p: int(p.name.split("_", 1)[0]) if p.name.split("_", 1)[0].isdigit() else -1  # noqa: E731
    return {p.name: p for p in sorted(sweep.iterdir(), key=lambda p: (number(p), p.name))
            if (p / "summary.json").exists()}


def results(run: Path) -> tuple[str, list, list]:
    """(status, outputs by prompt, the prefill's digests by prompt): what reuse must not change."""
    summary = json.loads((run / "summary.json").read_text())
    rows = sorted(read_jsonl(run / "requests.jsonl"), key=lambda r: r["prompt_idx"])
    sent = {int(r["transfer_id"].split("-", 1)[1]): r.get("digests")
            for r in read_jsonl(run / "prefill-transfers.jsonl") if not is_warmup(r["transfer_id"])}
    return summary["status"], [r["token_ids"] for r in rows], [sent.get(r["prompt_idx"]) for r in rows]


def label(run: Path) -> str:
    """The job's own overrides (Hydra's .hydra/overrides.yaml, or meta.json's `overrides` in a
    committed run, whose .hydra/ was dropped), less what every job of a sweep sets."""
    path, meta = run / ".hydra" / "overrides.yaml", run / "meta.json"
    if path.exists():
        overrides = [x[2:] for x in path.read_text().splitlines() if x.startswith("- ")]
    else:
        overrides = (json.loads(meta.read_text()).get("overrides") or []) if meta.exists() else []
    return " ".join(x for x in overrides if "reuse_engines" not in x) or run.name


def started(run: Path) -> int:
    return sum(not reused for reused in json.loads((run / "summary.json").read_text())["engines_reused"].values())


def total_s(run: Path) -> float:
    return json.loads((run / "summary.json").read_text())["timings"]["total_s"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cold", type=Path)
    ap.add_argument("reused", type=Path)
    a = ap.parse_args()
    cold, reused = jobs(a.cold), jobs(a.reused)
    if set(cold) != set(reused) or not cold:
        print(f"error: the sweeps do not have the same jobs: {sorted(cold)} vs {sorted(reused)}", file=sys.stderr)
        return 2
    print("| job | cold: wall s, engines started | reused: wall s, engines started | status | outputs | digests |")
    print("| --- | --- | --- | --- | --- | --- |")
    differ = 0
    for name in cold:
        c, r = results(cold[name]), results(reused[name])
        same = [c[0] == r[0], c[1] == r[1], c[2] == r[2]]
        differ += not all(same)
        print(f"| {label(reused[name])} | {total_s(cold[name]):.1f}, {started(cold[name])} | "
              f"{total_s(reused[name]):.1f}, {started(reused[name])} | {r[0]}{'' if same[0] else f' (cold: {c[0]})'} | "
              f"{'same' if same[1] else 'DIFFER'} | {'same' if same[2] else 'DIFFER'} |")
    for sweep, runs in (("cold", cold), ("reused", reused)):
        sweep_path = getattr(a, sweep) / "sweep_wall_s.txt"
        wall = float(sweep_path.read_text()) if sweep_path.exists() else sum(total_s(p) for p in runs.values())
        print(f"\n{sweep}: {len(runs)} jobs, {sum(started(p) for p in runs.values())} engine start-ups, {wall:.0f} s")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
