"""Load any set of run directories into pandas (see results/README.md for the columns).

    from harness.results import load_requests, load_runs
    df = load_requests("results/runs", "results/sweeps")   # one row per request per run
    runs = load_runs("results/runs")                         # one row per run
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from harness.records import read_jsonl

VERSION_COLUMNS = ["vllm", "torch", "python", "device_name", "git_sha"]


def find_runs(*paths: str | Path) -> list[Path]:
    """Run directories (those holding a summary.json) under the given paths, or the paths themselves."""
    found: set[Path] = set()
    for p in map(Path, paths):
        if (p / "summary.json").exists():
            found.add(p)
        elif p.is_dir():
            found.update(s.parent for s in p.rglob("summary.json"))
    return sorted(found)


def _meta(run: Path) -> dict:
    meta_file = run / "meta.json"
    if not meta_file.exists():
        return {}
    meta = json.loads(meta_file.read_text())
    return {k: meta.get("versions", {}).get(k) for k in VERSION_COLUMNS}


def load_requests(*paths: str | Path, with_tokens: bool = False) -> pd.DataFrame:
    """Every request of every run, with the run's versions. Token id lists only if with_tokens."""
    frames = []
    for run in find_runs(*paths):
        rows = read_jsonl(run / "requests.jsonl")
        if not rows:
            continue
        df = pd.DataFrame(rows)
        if not with_tokens:
            df = df.drop(columns=[c for c in ("token_ids", "base_token_ids") if c in df])
        for k, v in _meta(run).items():
            df[k] = v
        df["run_dir"] = str(run)
        frames.append(df)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def load_runs(*paths: str | Path) -> pd.DataFrame:
    """One row per run: its summary (p50/p90 of every metric, match rate, status) and versions."""
    rows = []
    for run in find_runs(*paths):
        s = json.loads((run / "summary.json").read_text())
        timings = s.pop("timings", {}) or {}
        s.pop("engine_pids", None)
        s.update({f"timings.{k}": v for k, v in timings.items() if not isinstance(v, dict)})
        s.update(_meta(run))
        s["run_dir"] = str(run)
        rows.append(s)
    return pd.DataFrame(rows)
