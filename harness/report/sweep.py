"""Sweep summary: after `python -m harness -m ...`, one table of every job (done or failed)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from harness.records.fields import OFFLINE, SERVE
from harness.records.figures import figures_in
from harness.records.schema import shown_in
from harness.records.stats import Column, format_table
from harness.records.tables import field_column, figure_column

JOB = [Column(k) for k in ("job", "overrides", "status", "strategy")]


def columns(runner: str) -> list[Column]:
    """A sweep's table for its runner's jobs: what each job was, the run-level figures figures.py
    shows in a sweep, and each metric's p50 with its bootstrap interval (summary.json's _lo/_hi): an
    offline job's "sweep" metrics; a serving job's latencies on both paths (the baseline's `base_`)
    and their tail."""
    out = JOB + ([Column(k) for k in ("model", "workload")] if runner == OFFLINE else [])
    out += [figure_column(g) for g in figures_in("sweep", runner)]
    if runner == OFFLINE:
        return out + [field_column(f, f"{f.name}_p50", interval=True, suffix=" p50") for f in shown_in("sweep")]
    for f in shown_in("serve", SERVE):
        out += [field_column(f, f"{prefix}{f.name}_p50", interval=True, suffix=f" p50{label}")
                for prefix, label in (("", ""), ("base_", " (baseline)"))]
    return out + [field_column(f, f"{f.name}_p99", suffix=" p99") for f in shown_in("tail", SERVE)]


def keys() -> list[str]:
    """The summary.json keys a sweep's table reads, for either runner."""
    cols = columns(OFFLINE) + columns(SERVE)
    return [*dict.fromkeys(k for c in cols for k in ([c.key, f"{c.key}_lo", f"{c.key}_hi"] if c.interval
                                                     else [c.key])), "runner"]


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
        rows.append({"job": job.name, **{k: s.get(k) for k in keys() if k != "job"}})
    return rows


def format_rows(rows: list[dict]) -> str:
    serve = any(r.get("runner") == "serve" for r in rows)
    return format_table(rows, columns(SERVE if serve else OFFLINE), align="left")


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
