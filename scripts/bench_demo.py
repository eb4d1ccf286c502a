"""Measure the demo: wall time, peak memory of the harness and all its engine processes, and
the split between engine start-up and the rest.

    python scripts/bench_demo.py [harness overrides ...]

Memory is sampled every 0.25 s over the whole process tree: the peak of summed PSS (shared
pages divided among the processes that map them, so the libraries the three engines share
are counted once) and, for reference, of summed RSS (which counts them three times).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent


def tree_memory(proc: psutil.Process) -> tuple[int, int]:
    rss = pss = 0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            info = p.memory_full_info()
            rss += info.rss
            pss += getattr(info, "pss", info.rss)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return rss, pss


def main() -> int:
    run_dir = ROOT / "results" / "bench" / time.strftime("demo_%Y-%m-%d_%H-%M-%S")
    cmd = [sys.executable, "-m", "harness", f"hydra.run.dir={run_dir}", *sys.argv[1:]]
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=ROOT)
    ps = psutil.Process(proc.pid)
    peak_rss = peak_pss = 0
    while proc.poll() is None:
        rss, pss = tree_memory(ps)
        peak_rss, peak_pss = max(peak_rss, rss), max(peak_pss, pss)
        time.sleep(0.25)
    wall = time.monotonic() - t0
    summary = json.loads((run_dir / "summary.json").read_text())
    t = summary["timings"]
    startup = t.get("startup_s", 0.0)
    figures = {
        "command": " ".join(["python -m harness", *sys.argv[1:]]),
        "exit_code": proc.returncode, "status": summary["status"],
        "wall_s": round(wall, 1), "engine_startup_s": round(startup, 1),
        "rest_s": round(wall - startup, 1),
        "baseline_s": round(t.get("baseline_s", 0), 1), "disagg_s": round(t.get("disagg_s", 0), 1),
        "shutdown_s": round(t.get("shutdown_s", 0), 1),
        "harness_overhead_s": round(wall - startup - t.get("baseline_s", 0) - t.get("disagg_s", 0)
                                    - t.get("shutdown_s", 0), 1),
        "peak_pss_gib": round(peak_pss / 2**30, 2), "peak_rss_gib": round(peak_rss / 2**30, 2),
        "match_rate": summary.get("match_rate"), "run_dir": str(run_dir),
    }
    print("\n".join(f"{k:>20}: {v}" for k, v in figures.items()))
    (run_dir / "bench.json").write_text(json.dumps(figures, indent=2))
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
