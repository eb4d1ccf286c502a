"""summary.json of an offline run (runner=serve's: serve_summary.py), from its request rows, so
that it can be computed again from any run directory: counts, the p50 (with its bootstrap
interval) and p90 of every declared metric, the TTFT overhead's parts in means, prefix-cache
hits, and what the run says about itself (run_summary)."""

from __future__ import annotations

from harness.records import provoked
from harness.records.accuracy import accuracy_cost
from harness.records.fields import OFFLINE, Stats
from harness.records.schema import CRITICAL_PATH, OVERHEAD_PARTS, SCHEMA_VERSION, UNVERSIONED, summarized
from harness.records.stats import p50_with_interval, percentile


def summarize(rows: list[dict]) -> dict:
    """The per-run statistics of summary.json (results/README.md lists them): counts, and the
    statistics of every metric fields.py declares summed up for an offline run."""
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
    out.update(provoked.fault_counts(rows))
    if provoked.aborted(rows):
        out["aborted"] = provoked.aborted(rows)
    clean = [r for r in rows if not provoked.provoked(r)]
    if out["digest_checked"] and not out["digest_failures"] and any(not r.get("match") and not r.get("near_tie")
                                                                    for r in clean):
        out["diagnosis"] = ("outputs differ although every KV block arrived intact (digests match): the decode "
                            "engine used the KV wrongly or before it had arrived")
    for f in summarized(OFFLINE):
        out.update(statistics(f.name, [r.get(f.name) for r in rows], f.summary[OFFLINE]))
    means = overhead_means(rows)
    if means:
        out["overhead_mean_ms"], out["overhead_parts_mean_ms"] = means
    tot_bytes = sum(r.get("bytes") or 0 for r in rows)
    tot_ms = sum(r.get("transfer_ms") or 0 for r in rows)
    out["total_bytes"] = tot_bytes
    out["transfer_gbps"] = tot_bytes / tot_ms / 1e6 if tot_ms > 0 else None
    out.update(prefix_hits(rows))
    return out


def statistics(key: str, values: list, stats: Stats) -> dict:
    """summary.json's statistics of one metric (fields.py Stats): `<key>_p50` with its 95% bootstrap
    interval (`_lo`, `_hi`), `<key>_p90`, `<key>_p99`, as the declaration asks."""
    out = {}
    for s in stats.stats:
        if s == "p50":
            out.update(p50_with_interval(values, f"{key}_p50"))
        elif s == "sum":
            counted = [v for v in values if number(v)]
            out[f"{key}_sum"] = int(sum(counted)) if counted else None
        else:
            out[f"{key}_{s}"] = percentile(values, int(s[1:]))
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
    preemptions summed per engine; requests the decode engine started from more prompt tokens
    than the prefill sent the KV of (kv_miscounted). Empty for rows without compute records."""
    counted = [r for r in rows if r.get("kv_recomputed") in (True, False)]  # not None, nor a loader's NaN
    if not counted:
        return {}
    recomputed = [r for r in counted if r["kv_recomputed"]]
    # vLLM started the request from prompt tokens whose KV nobody sent (a connector may send more: vLLM's
    # NixlConnector sends the prompt's last token too, which the decode engine computes again)
    miscounted = [r for r in counted if not r["kv_recomputed"] and not (r.get("error") or r.get("transfer_error"))
                  and number(r.get("sent_tokens")) and number(r.get("decode_cached_tokens"))
                  and r["decode_cached_tokens"] > r["sent_tokens"]]
    return {"kv_recomputed": len(recomputed), "kv_miscounted": len(miscounted),
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
