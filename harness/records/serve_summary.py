"""summary.json of a runner=serve run, from its records (baseline.jsonl, requests.jsonl), so
that it can be computed again from any run directory.

Per path (the P/D path's keys bare, the baseline's with `base_`): p50 (with its bootstrap
interval), p90 and p99 of TTFT, TPOT, inter-token gap and E2E; requests ok, failed and
cancelled; request and output-token throughput; the achieved against the requested rate;
goodput (requests per second that finished within the SLOs) and SLO attainment (the share of
requests sent that did).

Correctness: the P/D path's outputs against the baseline's for the same request
(`match_rate`) beside the baseline's second pass against its first (`baseline_self_match_rate`,
greedy decoding's own noise under this load); a mismatch fails the run only when the P/D path
has more mismatches than the baseline has with itself, not counting near ties (harness/records/compare.py).
Digest failures, transfer errors and KV left held fail it always, as does a request that failed
for any reason but its time limit (run.request_timeout_s: a timed-out request is counted,
`timed_out`, and misses the SLOs). A scenario's requests are judged apart, as offline: each
faulted transfer must have been caught (its request failed with a reason, or was recomputed to
the right output), and an aborted request may end anyhow but leave nothing held. The status
follows the offline runner's rules (harness/records/verdict.py).
"""

from __future__ import annotations

from pathlib import Path

from harness.records.accuracy import accuracy_cost
from harness.records.fields import SERVE, Field
from harness.records.files import read_jsonl
from harness.records.interference import interference
from harness.records.provoked import aborted, fault_counts, given
from harness.records.schema import (
    DECODE_ONLY,
    DISAGG,
    HANDOVER_PARTS,
    HANDOVER_PATH,
    SCHEMA_VERSION,
    shown_in,
    summarized,
)
from harness.records.stats import mean_interval, percentile
from harness.records.summary import prefix_hits, recompute_counts, statistics
from harness.records.verdict import judge, unmet

# a request's error when it ran past run.request_timeout_s: a latency outcome, not a failure
TIMED_OUT = "timed out (run.request_timeout_s)"


def latencies() -> list[Field]:
    """The latencies every path's summary gives (fields.py: SERVE's Stats), each pass's p50 too;
    the router's marks (only_measured) aside."""
    return [f for f in summarized(SERVE) if "p50" in f.summary[SERVE].stats and not f.summary[SERVE].only_measured]


def values(f: Field, rows: list[dict]) -> list:
    """A metric's values over rows: every element of a list field (itl_ms: every gap), else each
    row's where it has one."""
    if f.pooled:
        return [v for r in rows for v in r[f.name]]
    return [r[f.name] for r in rows if r.get(f.name) is not None]


def rate(times: list[float]) -> float | None:
    """Events per second between the first and the last of these times."""
    return (len(times) - 1) / (max(times) - min(times)) if len(times) > 1 and max(times) > min(times) else None


def coalesced(itl_ms: list[float], gap_ms: float) -> bool | None:
    """Whether a stream came in bursts: more than half of its gaps under gap_ms, far below any
    decode step. vLLM merges a request's streamed outputs while its API server is behind
    (v1's RequestOutputCollector; --stream-interval is already 1, and nothing turns the merging
    off), which under load on two cores gave 15 of 20 baseline requests all their tokens within
    2 ms of the first: their TPOT and ITL measure the server's flushes, not its steps."""
    if not itl_ms:
        return None
    return sum(g < gap_ms for g in itl_ms) > len(itl_ms) / 2


def path_stats(rows: list[dict], prefix: str = "") -> dict:
    ok = [r for r in rows if r["status"] == "ok"]
    out = {f"{prefix}requests": len(rows), f"{prefix}ok": len(ok),
           f"{prefix}failed": sum(r["status"] == "failed" for r in rows),
           f"{prefix}timed_out": sum(r["status"] == "failed" and r["error"] == TIMED_OUT for r in rows),
           f"{prefix}cancelled": sum(r["status"] == "cancelled" for r in rows)}
    for f in summarized(SERVE):
        vals, stats = values(f, ok), f.summary[SERVE]
        if vals or not stats.only_measured:  # the router's marks: P/D through the project's router only
            out.update(statistics(f"{prefix}{f.name}", vals, stats))
    sent = [r["sent_s"] for r in rows]
    ends = [r["sent_s"] + r["e2e_ms"] / 1e3 for r in ok]
    span = (max(ends) - min(sent)) if ends else None
    out[f"{prefix}duration_s"] = span
    out[f"{prefix}achieved_rate"] = rate(sent)
    # a seeded schedule of a few dozen Poisson arrivals has its own rate, off the requested one by
    # chance: the load generator is judged against it (achieved/scheduled), the load against the request
    out[f"{prefix}scheduled_rate"] = rate([r["arrival_s"] for r in rows])
    out[f"{prefix}request_throughput"] = len(ok) / span if span else None
    out[f"{prefix}output_throughput"] = sum(r["output_len"] for r in ok) / span if span else None
    good = sum(bool(r["meets_slo"]) for r in rows)
    out[f"{prefix}goodput"] = good / span if span else None
    uncancelled = [r for r in rows if r["status"] != "cancelled"]
    out[f"{prefix}slo_attainment"] = good / len(uncancelled) if uncancelled else None
    out[f"{prefix}coalesced"] = sum(bool(r.get("coalesced")) for r in ok)
    out.update(interference(rows, f"{prefix}interference"))
    return out


def handover_stats(rows: list[dict]) -> dict:
    """The P/D requests' handover (harness/records/schema.py HANDOVER_PATH) in means over the requests
    that have every part and a baseline TTFT: `handover_parts_mean_ms` ({part: ms}), which add up
    to `handover_ttft_mean_ms` (the mean time to the decode instance's first token), the same
    requests' baseline TTFT and the difference, the mean TTFT overhead the parts explain."""
    timed = [r for r in rows if r["status"] == "ok" and r.get("base_ttft_ms") is not None
             and all(r.get(k) is not None for k in HANDOVER_PARTS)]
    out = {"handover_requests": len(timed), "handover_parts_mean_ms": None, "handover_ttft_mean_ms": None,
           "handover_base_ttft_mean_ms": None, "handover_overhead_mean_ms": None}
    if timed:
        parts = {part: sum(r[f"handover_{part}_ms"] for r in timed) / len(timed) for part, _ in HANDOVER_PATH}
        ttft, base = sum(parts.values()), sum(r["base_ttft_ms"] for r in timed) / len(timed)
        out.update(handover_parts_mean_ms=parts, handover_ttft_mean_ms=ttft, handover_base_ttft_mean_ms=base,
                   handover_overhead_mean_ms=ttft - base)
    return out


def across_repeats(rows: list[dict], prefix: str = "") -> dict:
    """serve.repeats: each pass's p50 of every latency (`..._p50_by_repeat`) and their mean with
    its 95% t-interval (`..._p50_across`, `_lo`, `_hi`; no interval from one pass): the spread
    between runs of the same schedule, beside the pooled p50's interval over requests."""
    reps = sorted({r.get("repeat") or 0 for r in rows})
    out = {}
    for f in latencies():
        p50s = [percentile(values(f, [r for r in rows if (r.get("repeat") or 0) == k and r["status"] == "ok"]), 50)
                for k in reps]
        mean, lo, hi = mean_interval(p50s)
        m = f"{prefix}{f.name}"
        out.update({f"{m}_p50_by_repeat": p50s, f"{m}_p50_across": mean, f"{m}_p50_across_lo": lo,
                    f"{m}_p50_across_hi": hi})
    return out


def probe_stats(rows: list[dict], interval_s: float | None) -> dict | None:
    """serve.probes' rows (probes.jsonl) in brief: per path their TTFT and E2E p50 and p99, and on
    the P/D path their outputs against the baseline's probes and their digests."""
    if not rows:
        return None
    out: dict = {"interval_s": interval_s}
    for prefix, path in (("", "disagg_probe"), ("base_", "baseline_probe")):
        mine = [r for r in rows if r["path"] == path]
        ok = [r for r in mine if r["status"] == "ok"]
        out[f"{prefix}requests"], out[f"{prefix}ok"] = len(mine), len(ok)
        for f in shown_in("probe", SERVE):
            vals = values(f, ok)
            out[f"{prefix}{f.name}_p50"] = percentile(vals, 50) if vals else None
            out[f"{prefix}{f.name}_p99"] = percentile(vals, 99) if vals else None
    pd_ok = [r for r in rows if r["path"] == "disagg_probe" and r["status"] == "ok"]
    checked = [r for r in pd_ok if r["digest_match"] is not None]
    out["digest_checked"], out["digest_failures"] = len(checked), sum(not r["digest_match"] for r in checked)
    out["mismatches"] = sum(r["match"] is False and not r.get("near_tie") for r in pd_ok)
    return out


def kv_not_moved(rows: list[dict]) -> list[dict]:
    """The P/D requests that ended well with no sign of a transfer: neither a send record nor the
    decode engine's compute record (which every request with a transfer id gets). The router said
    it disaggregated them (route disagg), so their KV should have moved: a router or connector that
    quietly sent them to the decode instance alone. Rows without a route (external endpoints)
    are not judged."""
    return [r for r in rows if r.get("route") == DISAGG and r["status"] == "ok" and r.get("sent_tokens") is None
            and r.get("decode_computed_tokens") is None and not r.get("transfer_error")]


def vllm_sources(sources: dict | None, rows: list[dict], records_expected: bool) -> dict:
    """vLLM's own count of the decode instances' prompt tokens by source, and whether the tokens it
    says came from a transfer are those the connectors' records say the decode engines loaded:
    compared only where every P/D request and probe ended ok (a cancelled or failed one may leave
    no compute record while vLLM counted it at admission)."""
    agree = None
    if sources and records_expected and rows and all(r["status"] == "ok" for r in rows):
        agree = round(sources.get("external_kv_transfer", 0)) == sum(r.get("decode_loaded_tokens") or 0 for r in rows)
    return {"vllm_prompt_tokens_by_source": {k: round(v) for k, v in sources.items()} if sources else None,
            "vllm_received_tokens_agree": agree}


def serve_summary(run_dir: Path, facts: dict, *, status: str, error: str | None, timings: dict, kv_usage: dict,
                  repeats: int, probe_interval_s: float | None, expect_recompute: bool = False,
                  max_accuracy_drop: float | None = None, expect: dict | None = None,
                  records_expected: bool = False, vllm_token_sources: dict | None = None) -> dict:
    """summary.json from the run directory's rows. facts: what the run was, as the serving runner
    states it (serve.run_facts: run_id, strategy, ..., kv_cache_dtype, coalesced_gap_ms), in the
    order summary.json gives them; the rest: what judging the run needs of its configuration
    (expect: what its scenario says the run must show, conf/scenario/*.yaml; records_expected: every
    transfer writes records, so a P/D request without any moved no KV; vllm_token_sources: vLLM's own
    count of the decode instances' prompt tokens by source over the P/D passes)."""
    disagg = read_jsonl(run_dir / "requests.jsonl")
    base_rows = read_jsonl(run_dir / "baseline.jsonl")
    base = [r for r in base_rows if r["path"] == "baseline"]
    repeat = [r for r in base_rows if r["path"] == "baseline_repeat"]
    out: dict = {"schema_version": SCHEMA_VERSION, "runner": "serve", "status": status, "error": error, **facts}
    out.update(path_stats(disagg))
    out.update(path_stats(base, "base_"))
    out.update(handover_stats(disagg))
    out["repeats"] = repeats
    out.update(across_repeats(disagg))
    out.update(across_repeats(base, "base_"))
    compared = [r for r in disagg if r["match"] is not None and not given(r.get("fault"))]
    self_compared = [r for r in repeat if r["match"] is not None]
    out["match_rate"] = sum(r["match"] for r in compared) / len(compared) if compared else None
    out["mismatches"] = sum(not r["match"] for r in compared)
    out["near_ties"] = sum(not r["match"] and bool(r.get("near_tie")) for r in compared)
    out["baseline_self_match_rate"] = (sum(r["match"] for r in self_compared) / len(self_compared)
                                       if self_compared else None)
    out["baseline_self_mismatches"] = sum(not r["match"] for r in self_compared)
    control = [r for r in read_jsonl(run_dir / "control.jsonl") if r["match"] is not None]
    out["control_mismatches"] = sum(not r["match"] for r in control) if control else None
    out["control_match_rate"] = sum(r["match"] for r in control) / len(control) if control else None
    out.update(accuracy_cost(compared, out["match_rate"], out["baseline_self_match_rate"] if repeat else None))
    scores = [r["task_score"] for r in base_rows if r["path"] == "baseline" and r.get("task_score") is not None]
    out["base_task_score"] = sum(scores) / len(scores) if scores else None
    # a request the client abandoned on purpose may leave its transfer unfinished: not a failure;
    # a faulted one is judged by fault_counts
    kept = [r for r in disagg if r["status"] != "cancelled" and not given(r.get("fault"))]
    checked = [r for r in kept if r["digest_match"] is not None]
    out["probes"] = probe_stats(read_jsonl(run_dir / "probes.jsonl"), probe_interval_s)
    # a probe's KV is checked as any request's: its digest failure fails the run
    out["digest_checked"] = len(checked) + (out["probes"] or {}).get("digest_checked", 0)
    out["digest_failures"] = sum(not r["digest_match"] for r in checked) + (out["probes"] or {}).get(
        "digest_failures", 0)
    out["transfer_errors"] = sum(bool(r["transfer_error"]) for r in kept)
    out.update(recompute_counts(kept))
    out["decode_only_requests"] = sum(r.get("route") == DECODE_ONLY for r in disagg)
    out["kv_not_moved"] = len(kv_not_moved(kept)) if records_expected else None
    out.update(vllm_sources(vllm_token_sources, disagg + [r for r in read_jsonl(run_dir / "probes.jsonl")
                                                          if r["path"] == "disagg_probe"], records_expected))
    out["total_bytes"] = sum(r.get("bytes") or 0 for r in kept)
    out.update(prefix_hits(kept))
    out.update({"faults_injected": 0, "faults_caught": 0, "faults_missed": 0,
                **fault_counts([r for r in disagg if r["status"] != "cancelled"])})
    out["aborted"] = aborted(disagg)
    out["kv_cache_usage_at_end"] = kv_usage
    out["timings"] = timings
    code = {"ok": 0, "engine_failed": 3, "interrupted": 130}.get(status, 1)
    if status == "ok":
        broken = [r for r in base_rows + disagg
                  if r["status"] == "failed" and r["error"] != TIMED_OUT and not given(r.get("fault"))]
        # a timeout is a latency outcome (it counts against the SLOs); any other failure is a fault
        status, error = judge(out, noise=out["baseline_self_mismatches"] if repeat else 0,
                              expect_recompute=expect_recompute,
                              first_transfer_error=next((r["transfer_error"] for r in kept if r["transfer_error"]),
                                                        None),
                              faults=(out.get("faults_missed") or 0, out.get("faults_injected") or 0),
                              held={n: u for n, u in kv_usage.items() if u},
                              failed_requests=[f"{r['path']} #{r['request_idx']}: {r['error']}" for r in broken],
                              lossy=bool(out.get("codec") or out["kv_cache_dtype"]),
                              accuracy_drop=out.get("accuracy_drop"),
                              max_accuracy_drop=max_accuracy_drop, scenario_unmet=unmet(out, expect))
        code = 0 if status == "ok" else 1
    out.update(status=status, error=error, exit_code=code)
    return out
