"""Sweep summary: after `python -m harness -m ...`, one table of every job (done or failed)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from harness.records.stats import Column, format_table

# p50s with their bootstrap interval (summary.json's _lo/_hi): the jobs are compared
COLUMNS = [Column(k) for k in ("job", "overrides", "status", "strategy", "model", "workload", "requests",
                               "match_rate", "digest_failures")]
COLUMNS += [Column(k, interval=True) for k in ("ttft_ms_p50", "base_ttft_ms_p50", "e2e_ms_p50", "transfer_ms_p50")]
COLUMNS += [Column("bytes_p50"), Column("transfer_gbps")]
# what a lossy strategy cost in outputs (records/accuracy.py; "-" for the others), workload=corpus's task score
COLUMNS += [Column("codec"), Column("accuracy_drop"), Column("task_score")]
# runner=serve jobs: latency under load, goodput and correctness against the baseline's own noise
SERVE_COLUMNS = [Column(k) for k in ("job", "overrides", "status", "strategy", "request_rate")]
SERVE_COLUMNS += [Column("achieved", "achieved_rate", ".2f")]
SERVE_COLUMNS += [Column(k, interval=True) for k in ("ttft_ms_p50", "base_ttft_ms_p50", "tpot_ms_p50",
                                                     "base_tpot_ms_p50")]
SERVE_COLUMNS += [Column(k, spec=".3g") for k in ("ttft_ms_p99", "goodput", "base_goodput", "slo_attainment",
                                                   "match_rate", "baseline_self_match_rate", "digest_failures")]
# the handover's mean TTFT overhead against the same requests' baseline (each run's summary cuts it into parts)
SERVE_COLUMNS += [Column("handover overhead ms", "handover_overhead_mean_ms", "+.1f")]
KEYS = list(dict.fromkeys(k for c in COLUMNS + SERVE_COLUMNS
                          for k in ([c.key, f"{c.key}_lo", f"{c.key}_hi"] if c.interval else [c.key])))
KEYS.append("runner")


def sweep_rows(sweep_dir: Path) -> list[dict]:
    rows = []
    for job in sorted((p for p in Path(sweep_dir).iterdir() if p.is_dir()), key=lambda p: p.name):
        summary = job / "summary.json"
        if summary.exists():
            s = json.loads(summary.read_text())
        elif (job / ".hydra").exists():
            s = {"status": "failed (no summary.json)"}
        else:
            continue
        overrides = job / ".hydra" / "overrides.yaml"
        s["overrides"] = (" ".join(OmegaConf.to_container(OmegaConf.load(overrides)))
                          if overrides.exists() else None)
        rows.append({"job": job.name, **{k: s.get(k) for k in KEYS if k != "job"}})
    return rows


def format_rows(rows: list[dict]) -> str:
    serve = any(r.get("runner") == "serve" for r in rows)
    return format_table(rows, SERVE_COLUMNS if serve else COLUMNS, align="left")


class SweepSummary(Callback):
    """After `python -m harness -m ...`: the table of every job, and the sweep's exit status,
    1 when any job is not ok (each job's own status is in the table), so that CI can gate on it."""

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        rows = sweep_rows(sweep_dir)
        text = format_rows(rows)
        (sweep_dir / "sweep_summary.txt").write_text(text + "\n")
        (sweep_dir / "sweep_summary.json").write_text(json.dumps(rows, indent=2))
        failed = [r["job"] for r in rows if r["status"] != "ok"]
        print(f"\nsweep summary ({len(rows)} jobs, {len(failed)} not ok) in {sweep_dir}:\n{text}", flush=True)
        if failed or not rows:
            # Hydra turns an exception in a callback into a warning; SystemExit is the exit status
            sys.exit(1)
