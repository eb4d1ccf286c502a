"""Load any set of run directories into pandas (results/README.md lists the columns).

    from harness.report.load import load_requests, load_runs
    df = load_requests("results/runs", "results/sweeps")   # one row per request per run
    runs = load_runs("results/cpu")                          # one row per run

Both add the run's versions (meta.json), its resolved config flattened into dotted columns
(`engine.block_size`, `workload.concurrency`, `strategy.name`, ...: a sweep groups by them)
and run_dir. Rows written before records were versioned get schema_version 1.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
from omegaconf import OmegaConf

from harness.records.files import read_jsonl
from harness.records.schema import UNVERSIONED, RequestRow, ServeRow, field_names

VERSION_COLUMNS = ["vllm", "torch", "python", "device_name", "git_sha"]
KV_GEOMETRY_COLUMNS = ["kind", "bytes_per_token", "describe"]  # meta.json's kv_geometry, as kv_<key>
RUN_FILES = ("summary.json", "requests.jsonl", "requests.jsonl.gz")


def find_runs(*paths: str | Path) -> list[Path]:
    """Run directories (those holding a summary.json or a requests.jsonl: a run killed before
    its summary still has its rows) under the given paths, or the paths themselves."""
    found: set[Path] = set()
    for p in map(Path, paths):
        for name in RUN_FILES:
            if (p / name).exists():
                found.add(p)
            elif p.is_dir():
                found.update(f.parent for f in p.rglob(name))
    return sorted(found)


def _meta(run: Path) -> dict:
    meta_file = run / "meta.json"
    return json.loads(meta_file.read_text()) if meta_file.exists() else {}


def run_config(run: Path) -> dict:
    """The run's resolved config, flattened: {"engine.block_size": 32, ...}: meta.json's copy
    (resolved by the running harness) over Hydra's .hydra/config.yaml (there for every run,
    bad input included; an interpolation that needs the running harness, such as
    `${project_root:}`, is kept as written)."""
    hydra_file = run / ".hydra" / "config.yaml"
    flat = _flatten_node(OmegaConf.load(hydra_file)) if hydra_file.exists() else {}
    return {**flat, **_flatten(_meta(run).get("config") or {})}


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = _cell(v)
    return out


def _flatten_node(node, prefix: str = "") -> dict:
    out = {}
    for k in node:
        try:
            v = node[k]
        except Exception:  # noqa: BLE001 - a resolver of the running harness (project_root, hydra:...)
            v = OmegaConf.to_container(node, resolve=False)[k]
        if OmegaConf.is_dict(v) and len(v):
            out.update(_flatten_node(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = _cell(OmegaConf.to_container(v, resolve=False) if OmegaConf.is_config(v) else v)
    return out


def _cell(v):
    """Lists as tuples (hashable, so a column of them can be grouped by); empty dicts as None."""
    if isinstance(v, list):
        return tuple(v)
    if isinstance(v, dict):
        return None
    return v


def _run_columns(run: Path) -> dict:
    meta = _meta(run)
    versions = meta.get("versions", {})
    geometry = meta.get("kv_geometry") or {}  # runs from before it was recorded: None
    return {**{k: versions.get(k) for k in VERSION_COLUMNS}, **run_config(run),
            **{f"kv_{k}": geometry.get(k) for k in KV_GEOMETRY_COLUMNS}, "run_dir": str(run)}


def load_requests(*paths: str | Path, with_tokens: bool = False) -> pd.DataFrame:
    """Every request of every run, with the run's versions and config. Token id lists only if
    with_tokens. Every RequestRow field is a column (NaN where a version-1 row lacks it); a
    runner=serve run gives its ServeRow rows, the baseline's among them (column `path`)."""
    frames = []
    for run in find_runs(*paths):
        serve = _meta(run).get("runner") == "serve"
        # runner=serve: every path's requests (column `path`: disagg, baseline, baseline_repeat)
        rows = read_jsonl(run / "requests.jsonl") + (read_jsonl(run / "baseline.jsonl") if serve else [])
        if not rows:
            continue
        df = pd.DataFrame(rows)
        names = field_names(ServeRow if serve else RequestRow)
        df = df.reindex(columns=names + [c for c in df.columns if c not in names])
        df["schema_version"] = df["schema_version"].fillna(UNVERSIONED).astype(int)
        if not serve:
            # version-3 rows written before after_forward_ms was: the same from their timeline
            ms = {c: pd.to_numeric(df[c], errors="coerce") for c in ("after_forward_ms", "t_first_token_ms",
                                                                      "t_forward_done_ms")}
            df["after_forward_ms"] = ms["after_forward_ms"].fillna(ms["t_first_token_ms"] - ms["t_forward_done_ms"])
        if not with_tokens:
            df = df.drop(columns=[c for c in ("token_ids", "base_token_ids") if c in names])
        for k, v in _run_columns(run).items():
            df[k] = [v] * len(df)
        frames.append(df)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def load_runs(*paths: str | Path) -> pd.DataFrame:
    """One row per run: its summary (p50 with interval and p90 of every metric, match rate,
    status), versions and config. A run without summary.json has status None."""
    rows = []
    for run in find_runs(*paths):
        summary_file = run / "summary.json"
        if summary_file.exists():
            s = json.loads(summary_file.read_text())
        else:  # killed before its summary: the version of the rows it wrote
            written = read_jsonl(run / "requests.jsonl")
            s = {"status": None, "schema_version": min((r.get("schema_version", UNVERSIONED) for r in written),
                                                         default=UNVERSIONED)}
        s.setdefault("schema_version", UNVERSIONED)
        s.setdefault("recomputed", False)
        timings = s.pop("timings", {}) or {}
        s.pop("engine_pids", None)
        s.update({f"timings.{k}": v for k, v in timings.items() if not isinstance(v, dict)})
        s["reconstructed"] = bool(_meta(run).get("reconstructed"))
        s.update(_run_columns(run))
        rows.append(s)
    return pd.DataFrame(rows)
