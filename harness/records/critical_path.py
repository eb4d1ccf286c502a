"""The events of a request's timeline and the paths that cut its time to the first token, each
part with the event that ends it: what the timeline, overhead and handover fields of the rows
(fields.py) mean, and what join.py cuts along."""

TIMELINE_DOCS = {  # ms since the prefill request was submitted (join.py TIMELINE)
    "prefill_admitted": "timeline, ms since the prefill request was submitted: the prefill engine's scheduler "
                        "allocated its blocks (its first step)",
    "forward_done": "the forward pass that computed the prompt's KV was done (on a GPU: when the GPU reached the "
                    "send's copies; a streaming send: the end of the forward pass)",
    "sent": "every message's doorbell rung by the prefill worker",
    "decode_submitted": "the harness submitted the decode request (about 0 with early submission; after the prefill's "
                        "answer with `run.decode_submit=after_prefill`)",
    "decode_admitted": "the decode engine's scheduler allocated its blocks (early submission: parked there, waiting "
                       "for its KV)",
    "kv_arrived": "the last message's doorbell reached the decode worker",
    "load_start": "the decode worker began taking the KV (hand-off: in the decode step that needs it, possibly before "
                  "it arrived; early: the step after it arrived)",
    "kv_ready": "the KV in the decode engine's own blocks",
    "kv_checked": "its digests launched by the decode worker (`check.digests`; = t_kv_ready_ms without them; computed, "
                  "before schema version 9)",
    "decode_scheduled": "the decode engine scheduled the step that computes the first token",
    "prefill_token": "the prefill engine's token reached the harness (= prefill_ttft_ms)",
    "first_token": "the decode engine's first token reached the harness (= ttft_ms)",
}
TIMELINE = tuple(TIMELINE_DOCS)

# The TTFT overhead's parts along the KV's critical path, each with the timeline event that ends it
# (join.py ttft_overhead_parts): rows hold them as overhead_<part>_ms, summary.json their means
CRITICAL_PATH = (("prefill", "forward_done"), ("send", "sent"), ("delivery", "kv_arrived"), ("pickup", "load_start"),
                 ("scatter", "kv_ready"), ("check", "kv_checked"), ("decode", "first_token"))
# runner=serve's handover: the P/D path's time to the decode instance's first token at the client, cut
# along the same path with the router and the prefill instance's queue before the forward pass
# (join.py path_parts): rows hold them as handover_<part>_ms, summary.json their means
HANDOVER_PATH = (("router", "routed"), ("prefill_queue", "prefill_admitted"), *CRITICAL_PATH)
OVERHEAD_DOCS = {
    "prefill": "ttft_overhead_ms cut along the KV's critical path (`harness/records/join.py` `ttft_overhead_parts`; "
               "each point is the latest of itself and those before it and no later than the first token, so no part "
               "is negative and the parts add up to ttft_overhead_ms in any order of events; overlap is credited to "
               "the earliest part still running: a forward pass stamped done after the first token, as layerwise's "
               "can be on a loaded machine, takes the whole overhead): the prefill up to its forward pass done, less "
               "the baseline's whole TTFT (negative: the baseline's sampling and output, which P/D moves into "
               "`overhead_decode_ms`)",
    "send": "forward pass done -> every doorbell rung (gather and post)",
    "delivery": "-> the last doorbell at the decode worker",
    "pickup": "-> the decode worker takes the KV: with the hand-off, the prefill's answer, the harness and the decode "
              "engine's next step; with early submission, the worker noticing it",
    "scatter": "-> the KV in the decode engine's blocks",
    "check": "-> its digests launched (computed, before schema version 9), the staging space given back first: the "
             "harness's own cost on the critical path (with `check.digests=false` only the giving back; absent in "
             "rows written before it was split out of overhead_decode_ms)",
    "decode": "-> the decode engine's first token: scheduling (early submission: vLLM's next step), its forward pass, "
              "output",
}
assert tuple(OVERHEAD_DOCS) == tuple(part for part, _ in CRITICAL_PATH)

HANDOVER_DOC = (
    "P/D path (this project's strategies through its router): the time from the client sending the request to the "
    "decode instance's first token reaching it, cut on one clock (time.monotonic(), shared by every process of the "
    "machine) along the KV's path: `router` until the router posted the prefill request (its `: routed` stamp), "
    "`prefill_queue` until the prefill engine's scheduler admitted it (vLLM's API server, tokenizing, the waiting "
    "queue), `prefill` its forward pass, then `send`, `delivery`, `pickup`, `scatter`, `check` and `decode` as the "
    "offline rows' `overhead_<part>_ms` (the last until the client has the decode's first token). Overlap is credited "
    "to the earliest part still running, so none is negative and they add up to that time exactly "
    "(harness/records/join.py `path_parts`); null where a stamp is missing (vLLM's connectors, external endpoints, a "
    "request not ok) or where the KV did not gate the first token (from version 15)")
