"""The rows a run writes, defined once: the writer (harness/offline/rows.py), the pandas loader
(harness/report/load.py) and the test of results/README.md all use these classes.

    baseline.jsonl   BaselineRow, one per prompt of the colocated engine
    requests.jsonl   RequestRow, one per prompt of the disaggregated run
    *-transfers.jsonl  TransferRecord (transfer_strategies/records.py), one per transfer per side
  runner=serve (harness/serving/serve.py): baseline.jsonl and requests.jsonl hold ServeRow, one per
  request of the load as the client saw it (requests.jsonl: the P/D path)

Every row carries schema_version (SCHEMA_VERSION when written); rows of version 1 have none.
results/README.md says what each version means.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

# The version of the harness's rows and summaries (schema_version in each); the connectors' records
# have their own (transfer_strategies/records.py RECORD_VERSION), the same number up to 16.
SCHEMA_VERSION = 16
UNVERSIONED = 1  # what a row without schema_version is


@dataclass
class BaselineRow:
    run_id: str
    prompt_idx: int
    prompt_len: int
    ttft_ms: float
    e2e_ms: float
    token_ids: list[int]
    logprobs: list[float] | None
    top_ids: list[list[int]] | None = None  # each position's top-k token ids, best first (sampling.logprobs = k)
    task_score: float | None = None  # workload=corpus: output tokens equal to the text's continuation (from version 12)
    schema_version: int = SCHEMA_VERSION

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass
class RequestRow:
    run_id: str
    strategy: str
    model: str
    workload: str
    device: str
    prompt_idx: int
    prompt_len: int
    output_len: int
    conversation: int | None  # workload=multiturn: the conversation and its turn (from 0); None elsewhere
    turn: int | None
    # the decode output against the baseline's (harness/records/compare.py)
    match: bool
    first_divergence: int | None
    max_logprob_diff: float | None
    near_tie: bool | None  # a mismatch at a near tie (harness/records/compare.py); None: they match, or top-k unknown
    prefill_token_match: bool
    digest_match: bool | None  # None: no digests (vLLM's own connectors, verify off)
    error: str | None  # why the KV was not loaded, or the decode engine failed the request
    base_ttft_ms: float
    base_e2e_ms: float
    prefill_ms: float
    prefill_ttft_ms: float  # the prefill engine's token: the first token a streaming router could deliver
    prefill_ttft_overhead_ms: float
    ttft_ms: float  # the decode engine's first token
    e2e_ms: float
    ttft_overhead_ms: float
    # from the transfer records; None where the strategy writes none
    bytes: int | None
    messages: int | None
    blocks: int | None
    kv_cache_bytes: int | None
    skip_blocks: int | None
    send_ms: float | None
    gpu_ms: float | None
    transfer_ms: float | None
    transfer_host_ms: float | None
    kv_ms: float | None  # forward pass done -> KV in the decode engine's blocks (t_kv_ready - t_forward_done)
    # forward pass done -> the decode engine's first token (t_first_token - t_forward_done): what the
    # P/D path adds after the prefill's forward pass, free of that pass's own run-to-run spread
    after_forward_ms: float | None
    load_ms: float | None
    ready_ms: float | None
    notify_ms: float | None
    gbps: float | None
    # the timeline: ms since the prefill request was submitted (harness/records/join.py TIMELINE)
    t_prefill_admitted_ms: float | None
    t_forward_done_ms: float | None
    t_sent_ms: float | None
    t_decode_submitted_ms: float | None
    t_decode_admitted_ms: float | None
    t_kv_arrived_ms: float | None
    t_load_start_ms: float | None
    t_kv_ready_ms: float | None
    t_kv_checked_ms: float | None
    t_decode_scheduled_ms: float | None
    t_prefill_token_ms: float | None
    t_first_token_ms: float | None
    # ttft_overhead_ms cut into parts that add up to it (harness/records/join.py ttft_overhead_parts)
    overhead_prefill_ms: float | None
    overhead_send_ms: float | None
    overhead_delivery_ms: float | None
    overhead_pickup_ms: float | None
    overhead_scatter_ms: float | None
    overhead_check_ms: float | None
    overhead_decode_ms: float | None
    # from the connectors' compute records (scheduler side; None for vLLM's own connectors)
    decode_computed_tokens: int | None  # prompt tokens the decode engine computed (1 when it used the KV)
    decode_loaded_tokens: int | None  # prompt tokens it took from the connector
    decode_cached_tokens: int | None  # at its first step: its own prefix-cache hits + loaded tokens
    decode_preemptions: int | None
    prefill_preemptions: int | None
    kv_recomputed: bool | None  # the decode engine computed prompt tokens beyond the last one
    fault: str | None  # the transport fault a scenario injected into this request's transfer (scenario.fault)
    aborted: str | None  # which of its requests the harness aborted (scenario.aborts): prefill, decode, prefill+decode
    token_ids: list[int]
    base_token_ids: list[int]
    # a lossy strategy's (from version 12; None for a lossless one): harness/records/accuracy.py codec_fields
    codec: str | None = None
    codec_encode_ms: float | None = None  # the sender compressing (after its gather)
    codec_decode_ms: float | None = None  # the receiver reconstructing (before its scatter)
    codec_max_abs: float | None = None  # the reconstruction's error, measured on the sender: largest over layers
    codec_mean_abs: float | None = None  # mean over layers of the mean |error|
    codec_max_rel: float | None = None  # largest over layers of (largest |error| / largest |value|)
    codec_mean_rel: float | None = None  # mean over layers of (mean |error| / mean |value|)
    # a streaming strategy's (layerwise; from version 13): the prefill's host time in its per-layer
    # hooks for this request, summed over layers (the send record's)
    hook_ms: float | None = None
    # workload=corpus (from version 12): the share of output tokens equal to the text's continuation,
    # of this output and of the baseline's (harness/records/accuracy.py task_score)
    task_score: float | None = None
    base_task_score: float | None = None
    schema_version: int = SCHEMA_VERSION

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass
class ServeRow:
    """One request of runner=serve's load, as the client saw it, checked against the baseline."""

    run_id: str
    strategy: str
    model: str
    workload: str
    device: str
    path: str  # disagg (requests.jsonl) | baseline | baseline_repeat (baseline.jsonl: the same load again)
    request_idx: int  # its place in the arrival schedule (the same for every path)
    prompt_idx: int
    prompt_len: int
    output_len: int
    conversation: int | None  # as in RequestRow
    turn: int | None
    status: str  # ok | failed | cancelled (the client went away on purpose: serve.cancel_fraction, scenario.aborts)
    error: str | None
    request_rate: float  # requested (inf: all at once)
    arrival_s: float  # when the schedule said to send it, from the start of the load
    sent_s: float  # when it was sent (later than arrival_s when max_concurrency held it back)
    ttft_ms: float | None  # the client's first token (the prefill's with serve.stream_prefill_token)
    # P/D path through the project's router (its marks): when the router had the prefill's answer,
    # and when the decode instance's first token reached it
    prefill_ttft_ms: float | None
    decode_ttft_ms: float | None
    tpot_ms: float | None  # (e2e - ttft) / (output_len - 1)
    e2e_ms: float | None
    itl_ms: list[float]  # every gap between two output tokens
    meets_slo: bool | None  # TTFT and TPOT within slo.ttft_ms and slo.tpot_ms (None: not ok)
    # against the baseline's first pass, same request (None where either did not finish)
    match: bool | None
    first_divergence: int | None
    max_logprob_diff: float | None
    near_tie: bool | None  # as in RequestRow (from version 7)
    transfer_id: str | None
    # from the connectors' records (this project's strategies, P/D path only)
    digest_match: bool | None
    transfer_error: str | None
    bytes: int | None
    blocks: int | None  # as in RequestRow
    skip_blocks: int | None
    transfer_ms: float | None
    kv_ms: float | None
    decode_computed_tokens: int | None  # as in RequestRow
    decode_preemptions: int | None
    kv_recomputed: bool | None
    token_ids: list[int]
    # P/D path (from version 11): the transport fault its transfer carried (scenario.fault, the
    # X-KV-Fault header), and "client" where the client abandoned it at a random time (scenario.aborts)
    fault: str | None = None
    aborted: str | None = None
    # the client got its tokens in bursts (from version 14): more than half of the gaps between
    # them under serve.coalesced_gap_ms (serve_summary.coalesced); its tpot_ms and itl_ms are then
    # when tokens reached the client, not when the engine made them (None: fewer than 2 tokens)
    coalesced: bool | None = None
    # the P/D path (from version 15): the baseline's TTFT for the same request (its first pass), and
    # the time to the decode instance's first token at the client cut along HANDOVER_PATH (they
    # add up to it; None where an event was not stamped: vLLM's connectors, a failed request)
    base_ttft_ms: float | None = None
    handover_router_ms: float | None = None  # client sent -> the router posted the prefill request
    handover_prefill_queue_ms: float | None = None  # -> the prefill engine's scheduler admitted it
    handover_prefill_ms: float | None = None  # -> its forward pass done
    handover_send_ms: float | None = None  # then as overhead_<part>_ms in RequestRow
    handover_delivery_ms: float | None = None
    handover_pickup_ms: float | None = None
    handover_scatter_ms: float | None = None
    handover_check_ms: float | None = None
    handover_decode_ms: float | None = None  # -> the decode instance's first token at the client
    repeat: int = 0  # serve.repeats: which pass of the same schedule on its path (from version 14)
    # P/D path, a lossy strategy's (from version 12): as in RequestRow
    codec: str | None = None
    codec_encode_ms: float | None = None
    codec_decode_ms: float | None = None
    codec_max_abs: float | None = None
    codec_mean_abs: float | None = None
    codec_max_rel: float | None = None
    codec_mean_rel: float | None = None
    task_score: float | None = None  # workload=corpus: as in RequestRow (from version 12)
    schema_version: int = SCHEMA_VERSION

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


# Request fields that summary.json reports as <field>_p50, <field>_p90 and the p50's interval
SUMMARY_METRICS = ["base_ttft_ms", "base_e2e_ms", "ttft_ms", "prefill_ttft_ms", "e2e_ms", "ttft_overhead_ms",
                   "prefill_ttft_overhead_ms", "transfer_ms", "kv_ms", "after_forward_ms", "gpu_ms", "notify_ms",
                   "send_ms", "load_ms", "bytes", "messages", "gbps", "codec_encode_ms", "codec_decode_ms", "hook_ms"]
# The TTFT overhead's parts along the KV's critical path, each with the timeline event that ends it
# (harness/records/join.py ttft_overhead_parts); rows hold them as overhead_<part>_ms, and summary.json
# gives their means (which add up to the mean overhead)
CRITICAL_PATH = (("prefill", "forward_done"), ("send", "sent"), ("delivery", "kv_arrived"), ("pickup", "load_start"),
                 ("scatter", "kv_ready"), ("check", "kv_checked"), ("decode", "first_token"))
OVERHEAD_PARTS = [f"overhead_{part}_ms" for part, _ in CRITICAL_PATH]
# runner=serve's handover: the P/D path's time to the decode instance's first token at the client,
# cut along the same path with the router and the prefill instance's queue before the forward pass
# (harness/records/join.py path_parts); rows hold them as handover_<part>_ms, summary.json their means
HANDOVER_PATH = (("router", "routed"), ("prefill_queue", "prefill_admitted"), *CRITICAL_PATH)
HANDOVER_PARTS = [f"handover_{part}_ms" for part, _ in HANDOVER_PATH]


def field_names(cls) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]
