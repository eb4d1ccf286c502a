"""The join: what a request's row takes from its transfer's records, one set of rules for both
runners' rows (offline/rows.py, serving/rows.py): the fields fields.py declares a source for,
copied from each side's merged record; the transfer's time and GB/s; the KV's arrival after the
forward pass; the compute records' counts; a lossy strategy's codec fields; the request's
timeline (TIMELINE) and the TTFT overhead cut along the KV's critical path (ttft_overhead_parts;
runner=serve's handover: path_parts). Each runner's row keeps the fields it declares."""

from __future__ import annotations

from harness.records.critical_path import CRITICAL_PATH, TIMELINE
from harness.records.fields import FIELDS
from harness.records.schema import OVERHEAD_PARTS
from transfer_strategies.records import ComputeRecord, TransferRecord

CODEC_ERRORS = ("max_abs", "mean_abs", "max_rel", "mean_rel")


def transfer_fields(send: TransferRecord | None, recv: TransferRecord | None, digest_match: bool | None,
                    prefill: ComputeRecord | None = None, decode: ComputeRecord | None = None) -> dict:
    """A request's fields from its transfer's records (TransferStats.take_transfer: each side merged
    over its workers, and the digests' verdict) and its engines' compute records; None where a side
    wrote none (vLLM's own connectors)."""
    sides = {"send": send, "receive": recv}
    out = {}
    for f in FIELDS:
        if f.source:
            side, attr = f.source.split(".")
            out[f.name] = getattr(sides[side], attr) if sides[side] is not None else None
    out["digest_match"] = digest_match
    out["transfer_ms"] = transfer_ms(send, recv)
    out["gbps"] = out["bytes"] / out["transfer_ms"] / 1e6 if out["bytes"] and out["transfer_ms"] else None
    out["kv_ms"] = None
    if send is not None and recv is not None and send.t_forward_done is not None and recv.t_kv_ready is not None:
        out["kv_ms"] = (recv.t_kv_ready - send.t_forward_done) * 1e3
    return {**out, **compute_fields(prefill, decode), **codec_fields(send, recv)}


def transfer_ms(send: TransferRecord | None, recv: TransferRecord | None) -> float | None:
    """The transfer's time: on a GPU the GPU's clock (CUDA events from the gather's start to the
    last payload written: the host's clock adds the wake-up latency of waiting for the GPU at
    either end, -0.10 to -0.02 ms against the GPU's on an H200), else the receiver's host clock."""
    if send is not None and send.gpu_ms is not None:
        return send.gpu_ms
    return recv.transfer_ms if recv is not None else None


def kv_gated(early: bool, recv: TransferRecord | None) -> bool:
    """Whether the KV gated the first token: not for a decode request submitted early with nothing
    to load (every block in the decode engine's prefix cache: vLLM computed it without waiting)."""
    return not (early and recv is not None and recv.blocks == recv.skip_blocks)


def codec_fields(send: TransferRecord | None, recv: TransferRecord | None) -> dict:
    """A lossy strategy's codec and its reconstruction's error over the layers (the largest of the
    largest, the mean of the means); None for a lossless strategy."""
    error = send.codec_error if send is not None and send.codec_error else None
    out = {"codec": (send or recv).codec if (send or recv) is not None else None}
    for k in CODEC_ERRORS:
        out[f"codec_{k}"] = None if error is None else (max if k.startswith("max") else _mean)(error[k])
    return out


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def compute_fields(prefill: ComputeRecord | None, decode: ComputeRecord | None) -> dict:
    """A request's row's share of the engines' compute records (None where a connector writes
    none: vLLM's own). kv_recomputed: the decode engine computed prompt tokens it was sent."""
    hits = decode.cached_tokens - decode.loaded_tokens if decode and decode.cached_tokens is not None else None
    return {"decode_computed_tokens": decode.computed_tokens if decode else None,
            "decode_hit_tokens": hits,
            "decode_loaded_tokens": decode.loaded_tokens if decode else None,
            "decode_cached_tokens": decode.cached_tokens if decode else None,
            "decode_preemptions": decode.preemptions if decode else None,
            "prefill_preemptions": prefill.preemptions if prefill else None,
            "kv_recomputed": decode.recomputed_tokens > 0 if decode else None}


def timeline(t0: float, pre: dict, dec: dict, send: TransferRecord | None, recv: TransferRecord | None) -> dict:
    """One request's events on one clock (time.monotonic() in every process), in ms since the
    prefill request was submitted: t_<event>_ms for each of TIMELINE (None where unseen)."""
    stamps = {"prefill_token": pre["first_token_t"], "first_token": dec["first_token_t"],
              "decode_submitted": dec["submitted_t"], **record_stamps(send, recv)}
    return {f"t_{e}_ms": None if stamps.get(e) is None else (stamps[e] - t0) * 1e3 for e in TIMELINE}


def record_stamps(send: TransferRecord | None, recv: TransferRecord | None) -> dict[str, float | None]:
    """The events of a transfer the connectors' records stamp (time.monotonic()), by TIMELINE's names."""
    stamps = {}
    if send is not None:
        stamps.update(prefill_admitted=send.t_admitted, forward_done=send.t_forward_done, sent=send.t_sent)
    if recv is not None:
        stamps.update(decode_admitted=recv.t_admitted, kv_arrived=recv.t_arrived, load_start=recv.t_load_start,
                      kv_ready=recv.t_kv_ready, kv_checked=recv.t_kv_checked, decode_scheduled=recv.t_decode_scheduled)
    return stamps


def path_parts(t: dict, path, kv_gates_first_token: bool = True) -> dict[str, float] | None:
    """The time to the first token cut along a critical path ((part, the event that ends it), in
    order; the last event first_token): each part ends at its event's t_<event>_ms. Each point
    is the latest of itself and the points before it (a worker can take the KV before the
    doorbell's sender has returned; a hand-off load starts before the KV is in), and no later
    than the first token: an event stamped after it did not gate it. Overlap is so credited to
    the earliest part still running: layerwise's KV leaves during the forward pass, whose end is
    stamped after its last layer has left, and on a loaded machine after the decode engine
    answered; the whole time is then the forward pass's. So no part is negative and they add up
    to t_first_token_ms exactly, in any order of events. None without every event, or where the
    KV did not gate the first token (submitted early, with every block already in the decode
    engine's prefix cache: vLLM computed it without waiting)."""
    if not kv_gates_first_token or any(t.get(f"t_{end}_ms") is None for _, end in path):
        return None
    out, at, last = {}, 0.0, t["t_first_token_ms"]
    for part, end in path:
        end_at = min(max(at, t[f"t_{end}_ms"]), last)
        out[part] = end_at - at
        at = end_at
    return out


def ttft_overhead_parts(t: dict, base_ttft_ms: float, kv_gates_first_token: bool = True) -> dict:
    """The TTFT overhead against the colocated baseline, cut along the KV's critical path
    (path_parts over CRITICAL_PATH, the baseline's TTFT taken off the first part):
      prefill   prefill submitted -> its forward pass done, less the baseline's TTFT
      send      -> every doorbell rung (gather and post)
      delivery  -> the last doorbell at the decode worker
      pickup    -> the decode worker takes the KV (hand-off: the prefill's answer, the harness and
                   a decode step; early submission: the worker noticing it)
      scatter   -> the KV in the decode engine's own blocks
      check     -> its digests launched, the staging space given back first (the harness's own cost)
      decode    -> the decode engine's first token (scheduling, its forward pass, output)
    They add up to the overhead exactly; all None where path_parts is."""
    parts = path_parts(t, CRITICAL_PATH, kv_gates_first_token)
    if parts is None:
        return dict.fromkeys(OVERHEAD_PARTS)
    return {f"overhead_{part}_ms": ms - (base_ttft_ms if part == "prefill" else 0.0) for part, ms in parts.items()}
