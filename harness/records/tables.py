"""What a run prints at its end: an offline run's per-request table (format_run_table), runner=serve's
table of both paths (format_serve_summary), and each summary's lines; the columns are the declared
metrics' (fields.py, figures.py)."""

from __future__ import annotations

from harness.records import accuracy, provoked
from harness.records.accuracy import line as accuracy_line
from harness.records.fields import SERVE, Field
from harness.records.figures import Figure, figures_in
from harness.records.provoked import lines as scenario_lines
from harness.records.schema import shown_in
from harness.records.stats import Column, format_value
from harness.records.stats import format_table as stats_table
from harness.records.summary import format_overhead


def field_column(f: Field, key: str | None = None, interval: bool = False, suffix: str = "") -> Column:
    """A per-request metric's column (its declared header and format) over its values or one of its
    statistics (key)."""
    return Column(f.header + suffix, key or f.name, f.spec, interval)


def figure_column(g: Figure) -> Column:
    return Column(g.label, g.key, g.spec)


def format_run_table(rows: list[dict], summary: dict) -> str:
    """The per-request table a run prints at its end, and one line of its summary."""
    s = summary
    f = format_value
    return "\n".join([
        stats_table(rows, [field_column(f) for f in shown_in("run")]), "",
        f"match {s.get('requests', 0) - s.get('mismatches', 0)}/{s.get('requests', 0)}"
        + (f" ({s['near_ties']} other(s) at a near tie)" if s.get("near_ties") else "")
        + (f" (baseline with itself {format_value(s['baseline_self_match_rate'], '.2f')})"
           if s.get("baseline_self_match_rate") is not None else "")
        + (f" (decode engine alone, no transfer: {format_value(s['control_match_rate'], '.2f')})"
           if s.get("control_match_rate") is not None else "") +
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
    """The mean TTFT overhead and its parts (docs/measurements.md: what the times mean)."""
    lines = []
    if s.get("overhead_parts_mean_ms"):
        lines.append(f"ttft overhead mean {format_overhead(s['overhead_mean_ms'], s['overhead_parts_mean_ms'])} ms"
                     f"  (decode_submit={s.get('decode_submit')}; prefill's own token p50 "
                     f"{format_value(s.get('prefill_ttft_ms_p50'), '.1f')} ms)")
    if s.get("diagnosis"):
        lines.append(s["diagnosis"])
    return lines


def interference_lines(s: dict) -> list[str]:
    """Each path's interference factor with its interval (harness/records/interference.py)."""
    def one(prefix: str) -> str:
        v = s.get(f"{prefix}interference")
        if v is None:
            return "n/a"
        return f"{v:+.2f} [{s[f'{prefix}interference_lo']:+.2f}, {s[f'{prefix}interference_hi']:+.2f}]"
    if s.get("interference") is None and s.get("base_interference") is None:
        return []
    return [f"interference (token gaps with a prefill in flight against without, - 1): P/D {one('')}, "
            f"baseline {one('base_')}"]


def serve_columns() -> list[Column]:
    """runner=serve's summary table, a row per path: its counts and rates, each latency's p50 with its
    interval and, for the tail's, its p99 (fields.py and figures.py declare which)."""
    return ([Column("path"), *(figure_column(g) for g in figures_in("serve", SERVE))]
            + [field_column(f, f"{f.name}_p50", interval=True, suffix=" p50") for f in shown_in("serve", SERVE)]
            + [field_column(f, f"{f.name}_p99", suffix=" p99") for f in shown_in("tail", SERVE)])


def format_serve_summary(s: dict) -> str:
    """What a runner=serve run prints at its end: the table of both paths and the summary's lines."""
    def path_row(name: str, prefix: str) -> dict:
        return {"path": name, **{k[len(prefix):]: v for k, v in s.items() if k.startswith(prefix)}} if prefix else \
            {"path": name, **s}
    rows = [path_row("baseline", "base_"), path_row("P/D " + str(s.get("strategy")), "")]
    f = format_value
    return "\n".join([
        stats_table(rows, serve_columns()), "",
        (f"replayed the trace {s['trace']['path']} at time scale {s['trace']['time_scale']}" if s.get("trace") else
         f"requested {f(s.get('request_rate'), '.2f')} req/s ({s.get('arrivals')})" if not s.get("ramp_up") else
         f"requested a {s['ramp_up']['strategy']} ramp from {s['ramp_up']['start_rps']} to "
         f"{s['ramp_up']['end_rps']} req/s ({s.get('arrivals')})") + f"; SLOs {s.get('slo')}",
        f"P/D TTFT p50 {f(s.get('ttft_ms_p50'), '.1f')} ms at the client; at the router: the prefill's answer "
        f"{f(s.get('prefill_ttft_ms_p50'), '.1f')}, the decode's first token {f(s.get('decode_ttft_ms_p50'), '.1f')}",
        f"outputs: P/D matches the baseline {f(s.get('match_rate'), '.3f')} "
        f"({s.get('mismatches')} differ, {s.get('near_ties', 0)} of them at a near tie); "
        f"the baseline matches itself {f(s.get('baseline_self_match_rate'), '.3f')} "
        f"({s.get('baseline_self_mismatches')} differ)"
        + (f"; the decode instances alone, no transfer, match it {f(s['control_match_rate'], '.3f')} "
           f"({s['control_mismatches']} differ)" if s.get("control_match_rate") is not None else "")
        + f"; digest failures {s.get('digest_failures')}/"
        f"{s.get('digest_checked')}; KV usage at the end {s.get('kv_cache_usage_at_end')}", *route_lines(s),
        *source_lines(s),
        *handover_lines(s),
        *accuracy_line(s), *interference_lines(s),
        *prefix_hit_lines(s), *scenario_lines(s), *coalesced_lines(s), *probe_lines(s), *repeat_lines(s),
        *([f"aborted by the client at a random time: {s['aborted']}"] if s.get("aborted") else [])])


def route_lines(s: dict) -> list[str]:
    if not s.get("decode_only_requests"):
        return []
    return [f"routes (serve.pd_policy=selective): {s['decode_only_requests']} of {s.get('requests')} P/D-path requests "
            f"to the decode instance alone, no KV moved; the rest disaggregated"]


def source_lines(s: dict) -> list[str]:
    v = s.get("vllm_prompt_tokens_by_source")
    if not v:
        return []
    said = {True: "agree", False: "DISAGREE", None: "not compared: a request did not end ok"}
    return [f"vLLM's count of the decode instances' prompt tokens: computed {v.get('local_compute')}, own prefix "
            f"cache {v.get('local_cache_hit')}, received {v.get('external_kv_transfer')}; the records say received "
            f"{s.get('decode_loaded_tokens_sum')} + probes ({said[s.get('vllm_received_tokens_agree')]})"]


def handover_lines(s: dict) -> list[str]:
    parts = s.get("handover_parts_mean_ms")
    if not parts:
        return []
    return [f"handover, means over {s['handover_requests']} P/D requests: decode's first token "
            f"{s['handover_ttft_mean_ms']:.1f} ms = " + "  ".join(f"{k} {v:.1f}" for k, v in parts.items()),
            f"  against the baseline's TTFT {s['handover_base_ttft_mean_ms']:.1f} ms for the same requests: "
            f"{s['handover_overhead_mean_ms']:+.1f} ms"]


def repeat_lines(s: dict) -> list[str]:
    if s.get("ttft_ms_p50_across_lo") is None:  # one pass
        return []
    f = format_value

    def across(prefix: str) -> str:
        return (f"{f(s[f'{prefix}ttft_ms_p50_across'], '.1f')} [{f(s[f'{prefix}ttft_ms_p50_across_lo'], '.1f')}, "
                f"{f(s[f'{prefix}ttft_ms_p50_across_hi'], '.1f')}]")
    return [f"across {s['repeats']} runs of the schedule, TTFT p50 (mean of the runs' p50s, 95% t-interval): "
            f"P/D {across('')} ms, baseline {across('base_')} ms"]


def probe_lines(s: dict) -> list[str]:
    p = s.get("probes")
    if not p:
        return []
    f = format_value
    return [f"probes (one every {p['interval_s']} s beside the load): TTFT p50 P/D {f(p['ttft_ms_p50'], '.1f')} ms, "
            f"baseline {f(p['base_ttft_ms_p50'], '.1f')} ms; p99 {f(p['ttft_ms_p99'], '.1f')} and "
            f"{f(p['base_ttft_ms_p99'], '.1f')} ms; {p['ok']} and {p['base_ok']} ok, {p['mismatches']} outputs "
            f"differ, digest failures {p['digest_failures']}/{p['digest_checked']}"]


def coalesced_lines(s: dict) -> list[str]:
    """The warning a summary carries when streams came in bursts (coalesced)."""
    if not (s.get("coalesced") or s.get("base_coalesced")):
        return []
    return [f"streams coalesced (over half of a request's token gaps under {s.get('coalesced_gap_ms')} ms): "
            f"P/D {s.get('coalesced')} of {s.get('ok')}, baseline {s.get('base_coalesced')} of {s.get('base_ok')}; "
            f"their TPOT and ITL are when the tokens reached the client, not when the engine made them"]
