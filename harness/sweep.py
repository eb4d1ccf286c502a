"""Sweep summary: after `python -m harness -m ...`, one table of every job (done or failed)."""

from __future__ import annotations

import json
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

COLUMNS = ["job", "overrides", "status", "strategy", "model", "workload", "requests", "match_rate", "digest_failures",
           "ttft_ms_p50", "base_ttft_ms_p50", "e2e_ms_p50", "transfer_ms_p50", "bytes_p50", "transfer_gbps"]


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
        rows.append({"job": job.name, **{k: s.get(k) for k in COLUMNS if k != "job"}})
    return rows


def format_rows(rows: list[dict]) -> str:
    def cell(v):
        if isinstance(v, float):
            return f"{v:.3g}"
        return "-" if v is None else str(v)

    table = [COLUMNS] + [[cell(r.get(c)) for c in COLUMNS] for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(COLUMNS))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in table)


class SweepSummary(Callback):
    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        rows = sweep_rows(sweep_dir)
        text = format_rows(rows)
        (sweep_dir / "sweep_summary.txt").write_text(text + "\n")
        (sweep_dir / "sweep_summary.json").write_text(json.dumps(rows, indent=2))
        failed = [r["job"] for r in rows if r["status"] != "ok"]
        print(f"\nsweep summary ({len(rows)} jobs, {len(failed)} not ok) in {sweep_dir}:\n{text}", flush=True)
