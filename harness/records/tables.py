"""What an offline run prints at its end: the per-request table and the summary's lines."""

from __future__ import annotations

from harness.records import accuracy, provoked
from harness.records.stats import Column, format_value
from harness.records.stats import format_table as stats_table
from harness.records.summary import format_overhead

REQUEST_COLUMNS = [
    Column("#", "prompt_idx"), Column("prompt", "prompt_len"), Column("out", "output_len"), Column("match"),
    Column("tie", "near_tie"), Column("diverge@", "first_divergence"), Column("max|dlp|", "max_logprob_diff", ".1e"),
    Column("digest", "digest_match"), Column("base ttft", "base_ttft_ms", ".1f"),
    Column("pre ttft", "prefill_ttft_ms", ".1f"), Column("ttft", "ttft_ms", ".1f"),
    Column("base e2e", "base_e2e_ms", ".1f"), Column("e2e", "e2e_ms", ".1f"), Column("xfer ms", "transfer_ms", ".2f"),
    Column("kv ms", "kv_ms", ".2f"),
    Column("bytes", "bytes"), Column("msgs", "messages"), Column("GB/s", "gbps", ".2f")]


def format_run_table(rows: list[dict], summary: dict) -> str:
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
        f"  {f(s.get('transfer_gbps'), '.2f')} GB/s", *overhead_lines(s), *accuracy.line(s), *provoked.lines(s),
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
