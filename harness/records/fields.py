"""Every field of the rows a run writes, declared once: its name, type and meaning, which rows carry
it, where it comes from, and, for a metric, its unit, format, which direction is better, how
summary.json sums it up and which tables show it. The row types (schema.py), summary.json
(summary.py, serve_summary.py), the join of the connectors' records (join.py), every table and
report (tables.py, harness/report/) and results/README.md's field tables (markdown_table) read
these declarations; none keeps a list of its own. harness/records/README.md shows a metric added
end to end.

Rows (`rows`): OFFLINE, an offline run's requests.jsonl; SERVE, runner=serve's rows (every path);
BASELINE, an offline run's baseline.jsonl. Declaration order is the rows' column order.

Views (`shown`), the tables a metric appears in:
    run       the per-request table an offline run prints
    bench     the strategy benchmark's table and rows.csv: the median of each cell with its interval
    gate      the metrics scripts/compare_bench.py judges by default
    link      the link report: medians per prompt length, link and strategy
    accuracy  the lossy strategies' report (vs_fused: also as a share of fused's at the same length)
    sweep     a multirun's table: summary.json's p50 with its interval
    serve     runner=serve's printed summary and its sweep table, per path (tail: with the p99 too)
    probe     serve.probes' brief in summary.json
"""

from __future__ import annotations

from dataclasses import dataclass, field

from harness.records.critical_path import HANDOVER_DOC, HANDOVER_PATH, OVERHEAD_DOCS, TIMELINE_DOCS

OFFLINE, SERVE, BASELINE = "offline", "serve", "baseline"
REQUIRED = object()  # a field every row is built with (no default)
VIEWS = ("run", "bench", "gate", "link", "accuracy", "vs_fused", "sweep", "serve", "tail", "probe")


@dataclass(frozen=True)
class Stats:
    """How summary.json sums a metric up over a run's requests: each of `stats` (a p50 comes with its
    95% bootstrap interval, `_lo` and `_hi`), over every value of a list field (itl_ms: every gap).
    only_measured: left out of the summary where no request has a value (the router's marks)."""

    stats: tuple[str, ...]
    only_measured: bool = False


P50_P90 = Stats(("p50", "p90"))
TOTAL = Stats(("sum",))  # a count over the run (token sources)
LATENCY = Stats(("p50", "p90", "p99"))
MARK = Stats(("p50", "p99"), only_measured=True)


@dataclass(frozen=True)
class Field:
    name: str
    type: str
    doc: str | dict[str, str]  # one meaning, or one per row kind where it differs
    rows: tuple[str, ...] = (OFFLINE,)
    default: object = REQUIRED
    # "send.<attr>" or "receive.<attr>": copied from that side's merged transfer record (join.py)
    source: str | None = None
    # a metric's: its column header, unit, format, direction, summary.json's statistics per runner
    # (OFFLINE, SERVE), the views showing it, and the field it is also shown as a share of
    label: str | None = None
    unit: str = ""
    spec: str = ".3g"
    better: str | None = None  # "lower" or "higher"
    summary: dict[str, Stats] = field(default_factory=dict)
    shown: tuple[str, ...] = ()
    share_of: str | None = None

    def __post_init__(self):
        unknown = set(self.shown) - set(VIEWS)
        assert not unknown, f"{self.name}: no view {unknown}"

    @property
    def header(self) -> str:
        return self.label or self.name

    @property
    def pooled(self) -> bool:
        """A list per row (itl_ms): summed up over every value of every row."""
        return self.type.startswith("list[")

    def meaning(self, row: str) -> str:
        return self.doc if isinstance(self.doc, str) else self.doc[row]


BOTH, ALL = (OFFLINE, SERVE), (OFFLINE, SERVE, BASELINE)
MS = {"unit": "ms", "spec": ".1f", "better": "lower"}  # a latency a user feels
FINE_MS = {"unit": "ms", "spec": ".3f", "better": "lower"}  # a transfer's parts, well under a millisecond on a GPU
CODEC_ERROR = "the reconstruction's error against the original KV, measured on the sender"
AGAINST_BASELINE = ("against the baseline's first pass for the same request, as in the offline rows (null where "
                    "either did not finish; near_tie from version 7: each position's top-k from the completions API's "
                    "`logprobs`, token ids through vLLM's `return_tokens_as_token_ids`)")
PROMPT = {OFFLINE: "prompt index in the workload, tokens in, tokens out", BASELINE: "as in requests.jsonl",
          SERVE: "which workload prompt (used in order, again from the first when the load has more requests), its "
                 "tokens"}
CONVERSATION = {OFFLINE: "`workload=multiturn`: the conversation the prompt belongs to and its turn (from 0; turn t + "
                         "1's prompt is turn t's prompt, the baseline's answer to it and new user text, sent once turn "
                         "t has finished); null for other workloads (absent in rows written before they were added)",
                SERVE: "`workload=multiturn`: as in the offline rows (null for other workloads)"}
FROM_RECORDS = "from the transfer records, as in the offline rows"

F = Field
FIELDS: list[Field] = [
    F("run_id", "str", "the run directory's name", ALL),
    F("strategy", "str", "what ran, where (`cpu` or `cuda`)", BOTH),
    F("model", "str", "what ran, where (`cpu` or `cuda`)", BOTH),
    F("workload", "str", "what ran, where (`cpu` or `cuda`)", BOTH),
    F("device", "str", "what ran, where (`cpu` or `cuda`)", BOTH),
    F("path", "str", "`disagg`, `baseline` or `baseline_repeat`; in control.jsonl `control` "
      "(`run.no_transfer_control`: the schedule once more through the P/D router, each request asking for its decode "
      "instance alone, its prefix cache emptied first; compared with the baseline's first pass, from version 20); in "
      "probes.jsonl `disagg_probe` and `baseline_probe` "
      "(`serve.probes`: a short request every interval_s beside the load, from version 14; request_idx and prompt_idx "
      "count the probes, request_rate is 1 / interval_s, a P/D probe is compared with the baseline's probe of the "
      "same index)", (SERVE,)),
    F("request_idx", "int", "the request's place in the arrival schedule: the same request on every path", (SERVE,)),
    F("repeat", "int", "`serve.repeats`: which pass of the same schedule on its path (0 the first; every P/D pass is "
      "compared with the baseline's first), from version 14", (SERVE,), default=0),
    F("prompt_idx", "int", PROMPT, ALL, label="#", spec=".0f", shown=("run",)),
    F("prompt_len", "int", PROMPT, ALL, label="prompt", spec=".0f", shown=("run",)),
    F("output_len", "int", {OFFLINE: "prompt index in the workload, tokens in, tokens out",
                            SERVE: "output tokens received"}, BOTH, label="out", spec=".0f", shown=("run",)),
    F("conversation", "int | None", CONVERSATION, BOTH),
    F("turn", "int | None", CONVERSATION, BOTH),
    F("status", "str", "`ok`, `failed` (see `error`) or `cancelled` (the client went away on purpose: after the first "
      "token, `serve.cancel_fraction`, or at a random time, `scenario.aborts`)", (SERVE,)),
    F("match", "bool | None", {OFFLINE: "decode output token ids == baseline's", SERVE: AGAINST_BASELINE}, BOTH,
      shown=("run",)),
    F("first_divergence", "int | None", {OFFLINE: "index of the first differing token (null when equal)",
                                         SERVE: AGAINST_BASELINE}, BOTH, label="diverge@", spec=".0f", shown=("run",)),
    F("max_logprob_diff", "float | None", {
        OFFLINE: "largest abs difference of the chosen tokens' logprobs up to and including the first divergence",
        SERVE: AGAINST_BASELINE}, BOTH, label="max|dlp|", spec=".1e", shown=("run",)),
    F("near_tie", "bool | None", {
        OFFLINE: "for a mismatch: true when, at the first differing token, each engine's token is among the other's "
                 "top-k (`sampling.logprobs`; vLLM's `check_logprobs_close`): a near tie tipped by rounding (in bf16 "
                 "the decode engine computes the prompt's last token over loaded KV with another kernel than the "
                 "colocated prefill), not KV gone wrong; false otherwise; null when the outputs match or a side's "
                 "top-k is unknown (before version 6, `sampling.logprobs=1`)",
        SERVE: AGAINST_BASELINE}, BOTH, label="tie", shown=("run",)),
    F("prefill_token_match", "bool", "the prefill engine's one token == the baseline's first token"),
    F("digest_match", "bool | None", {
        OFFLINE: "per-block, per-KV-head digests of the blocks the transfer wrote into the decode engine (past "
                 "`skip_blocks`) == the prefill engine's of the same blocks, channel by channel over every worker of "
                 "each engine (null: strategy without digests, or nothing written: every block was in the decode "
                 "engine's prefix cache)",
        SERVE: "the prefill and decode workers' block digests of its KV agree (null: not checked: no records, vLLM's "
               "connectors, external endpoints)"}, BOTH, label="digest", shown=("run",)),
    F("error", "str | None", {
        OFFLINE: "why the decode engine did not load the KV (its record's error: no KV within "
                 "`run.transfer_timeout_s`), or that the decode engine failed the request; null when all went well",
        SERVE: "why it failed: the HTTP status and body, an error event in the stream, too few tokens, or `timed out "
               "(run.request_timeout_s)`"}, BOTH),
    F("transfer_error", "str | None", "the decode worker's record says why its KV was not loaded", (SERVE,),
      source="receive.error"),
    F("request_rate", "float", "the requested rate (inf: all at once); with `serve.ramp_up`, the ramp's rate at this "
      "request (from version 14)", (SERVE,)),
    F("arrival_s", "float", "when the schedule said to send it, s from the start of the load (`workload=multiturn`: a "
      "later turn has its conversation's arrival, and is sent once its previous turn has ended)", (SERVE,)),
    F("sent_s", "float", "when it was sent (later than arrival_s when `serve.max_concurrency` held it back)", (SERVE,)),
    F("base_ttft_ms", "float | None", {
        OFFLINE: "colocated baseline: submit -> first token, -> last token",
        SERVE: "P/D path: the baseline's TTFT for the same request (its first pass), on the client's clock (from "
               "version 15)"}, BOTH, label="base TTFT ms", **MS, summary={OFFLINE: P50_P90},
      shown=("run", "bench", "sweep")),
    F("base_e2e_ms", "float", "colocated baseline: submit -> first token, -> last token", label="base e2e ms", **MS,
      summary={OFFLINE: P50_P90}, shown=("run",)),
    F("prefill_ms", "float", "submit to prefill -> prefill done (its one token)", **MS),
    F("prefill_ttft_ms", "float | None", {
        OFFLINE: "submit to prefill -> the prefill engine's token: the first token a router streaming the prefill's "
                 "answer could deliver (the decode engine computes the same token again)",
        SERVE: "P/D path: the router had the prefill instance's answer (its SSE mark); null on the baseline"},
      BOTH, label="prefill TTFT ms", **MS, summary={OFFLINE: P50_P90, SERVE: MARK}, shown=("run",)),
    F("prefill_ttft_overhead_ms", "float", "prefill_ttft_ms - base_ttft_ms", label="prefill TTFT overhead ms", **MS,
      summary={OFFLINE: P50_P90}, shown=("bench", "gate", "link"), share_of="base_ttft_ms"),
    F("ttft_ms", "float | None", {
        OFFLINE: "submit to prefill -> first token of the decode engine (prefill + transfer + first decode step)",
        BASELINE: "submit -> first token, -> last token",
        SERVE: "the first output token at the client (with `serve.stream_prefill_token`: the prefill instance's)"},
      ALL, label="TTFT ms", **MS, summary={OFFLINE: P50_P90, SERVE: LATENCY},
      shown=("run", "bench", "sweep", "serve", "tail", "probe")),
    F("decode_ttft_ms", "float | None", "P/D path: the decode instance's first token reached the router (its SSE mark)",
      (SERVE,), label="decode TTFT ms", **MS, summary={SERVE: MARK}),
    F("tpot_ms", "float | None", "(e2e_ms - ttft_ms) / (output_len - 1)", (SERVE,), label="TPOT ms", **MS,
      summary={SERVE: LATENCY}, shown=("serve", "tail")),
    F("e2e_ms", "float | None", {
        OFFLINE: "submit to prefill -> last decode token",
        BASELINE: "submit -> first token, -> last token",
        SERVE: "the last token at the client"}, ALL, label="e2e ms", **MS, summary={OFFLINE: P50_P90, SERVE: LATENCY},
      shown=("run", "sweep", "serve", "probe")),
    F("itl_ms", "list[float]", "every gap between two output tokens (a list)", (SERVE,), label="ITL ms", **MS,
      summary={SERVE: LATENCY}, shown=("serve",)),
    F("coalesced", "bool | None", "the stream came in bursts: more than half of itl_ms under `serve.coalesced_gap_ms` "
      "(0.5 ms), far below any decode step (vLLM merges a request's streamed outputs while its API server is behind; "
      "nothing in vLLM turns that off): its tpot_ms and itl_ms are when the tokens reached the client, not when the "
      "engine made them; null with fewer than 2 tokens or when not ok (from version 14)", (SERVE,), default=None),
    F("meets_slo", "bool | None", "ttft_ms within `slo.ttft_ms` and tpot_ms within `slo.tpot_ms` (null limits: none); "
      "null when not ok", (SERVE,)),
    F("ttft_overhead_ms", "float", "ttft_ms - base_ttft_ms", label="TTFT overhead ms", **MS, summary={OFFLINE: P50_P90},
      shown=("bench", "gate", "link", "accuracy"), share_of="base_ttft_ms"),
    F("transfer_id", "str | None", "the router's transfer id for it (the client's X-Request-Id), which the "
      "connectors' records carry", (SERVE,)),
    F("route", "str | None", "P/D path: how the project's router sent it (its X-PD-Route): `disagg` (prefill, then "
      "decode with the KV) or `decode_only` (`serve.pd_policy=selective`: the decode instance computed the whole "
      "prompt itself; no transfer, no records); null elsewhere (from version 20)", (SERVE,), default=None),
    F("bytes", "int | None", {
        OFFLINE: "payload bytes and messages the prefill worker sent for this request",
        SERVE: FROM_RECORDS}, BOTH, source="send.bytes", label="KV bytes moved",
      unit="B", spec=".0f", summary={OFFLINE: P50_P90}, shown=("run", "bench", "link", "vs_fused", "sweep")),
    F("messages", "int | None", "payload bytes and messages the prefill worker sent for this request",
      source="send.messages", label="messages", spec=".0f", summary={OFFLINE: P50_P90}, shown=("run", "bench")),
    F("blocks", "int | None", {
        OFFLINE: "KV blocks holding the prompt's tokens [0, n-1) (the decode engine computes the last)",
        SERVE: FROM_RECORDS}, BOTH, source="send.blocks"),
    F("kv_cache_bytes", "int | None", "the prefill engine's whole KV cache (what `full_cache` sends), over all its "
      "workers (`engine.kv_cache_gib` is per worker)", source="send.kv_cache_bytes"),
    F("skip_blocks", "int | None", {
        OFFLINE: "leading blocks the decode engine already had (its own prefix cache) and did not overwrite: not the "
                 "transfer's, so not judged by the digests",
        SERVE: FROM_RECORDS}, BOTH, source="receive.skip_blocks"),
    F("send_ms", "float | None", "prefill worker: start of gathering -> last message posted and flushed",
      source="send.send_ms", label="send ms", **FINE_MS, summary={OFFLINE: P50_P90}),
    F("gpu_ms", "float | None", "on a GPU: start of gathering -> last payload written, on the GPU's clock (CUDA "
      "events); null on the CPU", source="send.gpu_ms", label="GPU ms", **FINE_MS, summary={OFFLINE: P50_P90}),
    F("transfer_ms", "float | None", {
        OFFLINE: "start of gathering on the prefill side -> last byte in memory the decode worker reads (staged "
                 "transport: when the prefill worker had written it into the decode worker's buffer; gloo: when the "
                 "receive completed); on a GPU gpu_ms, else transfer_host_ms (also on a GPU over transport=nixl, whose "
                 "write no CUDA event sees: `gpu/2026-12-05-s29/transport/nixl`, made before that, has the gather into "
                 "NIXL's mirror alone as transfer_ms and gpu_ms)",
        SERVE: FROM_RECORDS}, BOTH, label="transfer ms", **FINE_MS,
      summary={OFFLINE: P50_P90}, shown=("run", "bench", "gate", "link", "vs_fused", "sweep")),
    F("transfer_host_ms", "float | None", "transfer_ms on the host's clock (the decode worker's record)",
      source="receive.transfer_ms", label="host clock ms", **FINE_MS, shown=("bench",)),
    F("kv_ms", "float | None", {
        OFFLINE: "end-to-end KV time: the prefill's forward pass done -> KV in the decode engine's own blocks "
                 "(t_kv_ready_ms - t_forward_done_ms): the copy, the doorbell, the wait for the decode worker and the "
                 "scatter",
        SERVE: FROM_RECORDS}, BOTH, label="KV e2e ms", **FINE_MS,
      summary={OFFLINE: P50_P90}, shown=("run", "bench", "gate", "link", "vs_fused")),
    F("after_forward_ms", "float | None", "the prefill's forward pass done -> the decode engine's first token "
      "(t_first_token_ms - t_forward_done_ms): kv_ms plus the digests, vLLM's scheduling and the decode engine's first "
      "step. The TTFT overhead less its prefill part: free of the forward pass's own run-to-run spread (±5 ms at 8k "
      "tokens on an H200), which is what separates strategies with a dozen prompts; it leaves out what a strategy "
      "costs the forward pass itself (layerwise's sends: see prefill_ttft_overhead_ms). Version-3 rows written before "
      "the field get it from their timeline when loaded", label="after forward ms", **MS, summary={OFFLINE: P50_P90},
      shown=("bench", "gate", "link")),
    F("load_ms", "float | None", "decode step blocked on this request's KV (waiting + scatter into its blocks)",
      source="receive.load_ms", label="load ms", **FINE_MS, summary={OFFLINE: P50_P90}),
    F("ready_ms", "float | None", "start of gathering -> KV scattered into the decode engine's blocks",
      source="receive.ready_ms", label="KV ready ms", **FINE_MS, shown=("bench",)),
    F("notify_ms", "float | None", "that moment -> the decode worker's receiver thread has the message (doorbell "
      "latency, not in transfer_ms)", source="receive.notify_ms", label="notify ms", **FINE_MS,
      summary={OFFLINE: P50_P90}, shown=("bench",)),
    F("gbps", "float | None", "bytes / transfer_ms (GB/s, 1e9)", label="GB/s", unit="GB/s", spec=".2f", better="higher",
      summary={OFFLINE: P50_P90}, shown=("run", "bench")),
]

FIELDS += [F(f"t_{event}_ms", "float | None", doc, **MS) for event, doc in TIMELINE_DOCS.items()]
FIELDS += [F(f"overhead_{part}_ms", "float | None", doc, label=f"{part} ms", **FINE_MS,
             shown=("gate",) if part in ("check", "decode") else ()) for part, doc in OVERHEAD_DOCS.items()]
FIELDS += [F(f"handover_{part}_ms", "float | None", HANDOVER_DOC, (SERVE,), default=None) for part, _ in HANDOVER_PATH]


COMPUTED = "from the compute records, as in the offline rows (from version 4)"
V19, SUMS = "from version 19, both runners", {OFFLINE: TOTAL, SERVE: TOTAL}  # the token sources
FIELDS += [
    F("decode_computed_tokens", "int | None", {
        OFFLINE: "prompt tokens the decode engine computed, as vLLM's scheduler scheduled them, over every admission "
                 "(1 when it used the KV: vLLM always computes the last prompt token; null for vLLM's own connectors)",
        SERVE: COMPUTED}, BOTH, summary=SUMS),
    F("decode_hit_tokens", "int | None", f"prompt tokens the decode engine found in its own prefix cache ({V19})",
      BOTH, default=None, summary=SUMS),
    F("decode_loaded_tokens", "int | None", "prompt tokens the decode engine received from a transfer (vLLM's external "
      f"hits; in the serving rows {V19})", BOTH, default=None, summary=SUMS),
    F("sent_tokens", "int | None", "prompt tokens the prefill side sent the KV of (its send record's: ours all but "
      "the last, vLLM's NixlConnector all); the decode engine's hit and loaded tokens may add up to no more, else it "
      f"trusted KV nobody sent: status kv_miscounted ({V19})", BOTH, default=None, source="send.tokens", summary=SUMS),
    F("decode_cached_tokens", "int | None", "at the decode request's first step: its own prefix-cache hits plus the "
      "loaded tokens (prompt_len - 1 when nothing was recomputed)"),
    F("decode_preemptions", "int | None", {OFFLINE: "how often vLLM preempted the request on that engine (freed its "
                                                    "blocks and admitted it again)", SERVE: COMPUTED}, BOTH),
    F("prefill_preemptions", "int | None", "how often vLLM preempted the request on that engine (freed its blocks and "
      "admitted it again)"),
    F("kv_recomputed", "bool | None", {
        OFFLINE: "the decode engine computed prompt tokens beyond the last one: it did not use (all of) the KV it was "
                 "sent. Explained when the request was preempted after its KV came (its blocks were freed); otherwise "
                 "the run fails with status kv_recomputed",
        SERVE: COMPUTED}, BOTH),
    F("fault", "str | None", {
        OFFLINE: "the transport fault a scenario injected into this request's transfer (`drop`, `delay`, `truncate`, "
                 "`flip`; null: none, `scenario.fault`)",
        SERVE: "P/D path: the transport fault its transfer carried (`scenario.fault`, every n-th prompt's, as offline; "
               "the client asks the router for it with the `X-KV-Fault` header), null otherwise (from version 11)"},
      BOTH, default=None),
    F("aborted", "str | None", {
        OFFLINE: "which of its requests the harness aborted (`scenario.aborts`): `prefill`, `decode` or "
                 "`prefill+decode`; null: none (or the abort came after the request had finished)",
        SERVE: "P/D path: `client` where the client abandoned the request at a random time in its first "
               "`scenario.aborts.max_delay_ms` (its status is then `cancelled`), null otherwise (from version 11)"},
      BOTH, default=None),
    F("token_ids", "list[int]", {
        OFFLINE: "the two outputs (left out by `load_requests` unless `with_tokens=True`)",
        BASELINE: "the output and its chosen tokens' logprobs",
        SERVE: "the output token ids"}, ALL),
    F("logprobs", "list[float] | None", "the output and its chosen tokens' logprobs", (BASELINE,)),
    F("top_ids", "list[list[int]] | None", "each position's top-k token ids, best first (k = `sampling.logprobs`; "
      "absent before version 6)", (BASELINE,), default=None),
    F("base_token_ids", "list[int]", "the two outputs (left out by `load_requests` unless `with_tokens=True`)"),
    F("codec", "str | None", {
        OFFLINE: "a lossy strategy's codec, `format/scale/values per scale` (`int8/block/64`: int8, one scale per "
                 "block, KV head and 64 of a head's features; `transfer_strategies/codecs.py`); null for a strategy "
                 "that moves the KV bit for bit (from version 12, as the fields below)",
        SERVE: "P/D path, a lossy strategy's: as in the offline rows (from version 12)"}, BOTH, default=None),
    F("codec_encode_ms", "float | None", {
        OFFLINE: "the sender compressing the gathered blocks, the receiver reconstructing them before its scatter "
                 "(CUDA events on a GPU, the host's clock on CPU); inside transfer_ms and load_ms",
        SERVE: "P/D path, a lossy strategy's: as in the offline rows (from version 12)"}, BOTH, default=None,
      source="send.codec_ms", label="encode ms", **FINE_MS, summary={OFFLINE: P50_P90}, shown=("accuracy",)),
    F("codec_decode_ms", "float | None", {
        OFFLINE: "the sender compressing the gathered blocks, the receiver reconstructing them before its scatter "
                 "(CUDA events on a GPU, the host's clock on CPU); inside transfer_ms and load_ms",
        SERVE: "P/D path, a lossy strategy's: as in the offline rows (from version 12)"}, BOTH, default=None,
      source="receive.codec_ms", label="decode ms", **FINE_MS, summary={OFFLINE: P50_P90}, shown=("accuracy",)),
    *(F(f"codec_{k}", "float | None", {
        OFFLINE: f"{CODEC_ERROR}: the largest \\|error\\| over the request's layers, the mean over layers of the mean "
                 "\\|error\\|" if k.endswith("abs") else
                 "the same relative to the layer's values: the largest of (largest \\|error\\| / largest \\|value\\|), "
                 "the mean of (mean \\|error\\| / mean \\|value\\|); the codec's bound (`Codec.max_rel_error`) holds "
                 "for the first",
        SERVE: "P/D path, a lossy strategy's: as in the offline rows (from version 12)"}, BOTH, default=None)
      for k in ("max_abs", "mean_abs", "max_rel", "mean_rel")),
    F("hook_ms", "float | None", "layerwise (a strategy streaming from inside the forward pass; from version 13, null "
      "elsewhere): the prefill worker's host time in its per-layer hooks for this request, summed over the layers (the "
      "send record's); the forward pass waits for it where the host is behind the GPU", default=None,
      source="send.hook_ms", label="hook ms", **FINE_MS, summary={OFFLINE: P50_P90}),
    F("task_score", "float | None", {
        OFFLINE: "`workload=corpus` (prompts cut from the models' training text, each with the text's own "
                 "continuation): the share of this output's tokens, and of the baseline's, equal to the "
                 "continuation's at the same position; null for other workloads (from version 12)",
        BASELINE: "`workload=corpus`: the share of output tokens equal to the text's continuation (null otherwise; "
                  "from version 12)",
        SERVE: "`workload=corpus`: as in the offline rows, on every path (from version 12)"}, ALL, default=None),
    F("base_task_score", "float | None", "`workload=corpus` (prompts cut from the models' training text, each with the "
      "text's own continuation): the share of this output's tokens, and of the baseline's, equal to the "
      "continuation's at the same position; null for other workloads (from version 12)", default=None),
    F("schema_version", "int", "see above", ALL),  # schema.py fills it in
]
