"""The connectors' records of each transfer, as both runners read them (TransferStats), and what
a request's row takes from them: its compute fields, its timeline (TIMELINE) and the TTFT overhead
cut along the KV's critical path (ttft_overhead_parts; runner=serve's handover: path_parts)."""

from __future__ import annotations

import time
from pathlib import Path

from harness.records.schema import CRITICAL_PATH, OVERHEAD_PARTS
from harness.records.transfer_records import TransferRecordReader, digests_agree, merge_ranks
from transfer_strategies.records import ComputeRecord, TransferRecord, compute_path, rank_path

RECEIVE_WAIT_S = 30.0


class TransferStats:
    """The connectors' records, read as they are appended: each file from where the last read
    stopped, only when a record asked for is not in yet. Sides: the workers' transfer records
    ("send", "receive"), one per worker of the engine (tensor parallelism), merged, and the
    scheduler sides' compute records ("prefill", "decode") written beside them."""

    def __init__(self, *paths: Path, tp: tuple[int, int] = (1, 1), prefill_engines: int = 1,
                 expected: bool = False):
        """paths: the prefill engines' records, then the decode engines' (serving mode: several
        of each, the first prefill_engines of them prefill); tp: the prefill and decode engines'
        degrees; expected: every transfer has records (this project's connectors), so a missing
        one is waited for."""
        self.expected = expected
        degrees = (tp[0],) * prefill_engines + (tp[1],) * (len(paths) - prefill_engines)
        self.workers = {"send": tp[0], "receive": tp[1]}
        self.readers = [TransferRecordReader(rank_path(p, r)) for p, n in zip(paths, degrees) for r in range(n)]
        self.readers += [TransferRecordReader(compute_path(p), ComputeRecord) for p in paths]
        self.records: dict[tuple[str, str], list[TransferRecord | ComputeRecord]] = {}

    def has_both(self, transfer_id: str) -> bool:
        """Whether both sides' records of this transfer are in, from every worker (reading what
        was appended)."""
        self._read()
        return all(self._workers_in(transfer_id, side) >= n for side, n in self.workers.items())

    def _workers_in(self, transfer_id: str, side: str) -> int:
        return len({getattr(r, "rank", 0) for r in self.records.get((transfer_id, side), ())})

    def _read(self) -> None:
        for reader in self.readers:
            for r in reader.read_new():
                self.records.setdefault((r.transfer_id, r.side), []).append(r)

    def _take(self, transfer_id: str, side: str, wait_s: float) -> list:
        """A transfer side's records, one per worker (its last), handed out once, waiting up to
        wait_s for the last worker's: a worker writes a record once its digests are in, off the
        engine's step (records.RecordQueue), and a decode worker the record of a request it had
        nothing to load for when the message comes; either can be after the request finished."""
        want = self.workers.get(side, 1)
        deadline = time.monotonic() + wait_s
        while self._workers_in(transfer_id, side) < want:
            self._read()
            waits = self.expected
            if (not waits and (transfer_id, side) not in self.records) or time.monotonic() > deadline:
                break
            if self._workers_in(transfer_id, side) < want:
                time.sleep(0.01)
        found = self.records.pop((transfer_id, side), [])
        return list({getattr(r, "rank", 0): r for r in found}.values())

    def take(self, transfer_id: str, side: str) -> ComputeRecord | None:
        """A scheduler side's compute record ("prefill", "decode"; None: the strategy writes none)."""
        found = self._take(transfer_id, side, 0.0)
        return found[0] if found else None

    def take_transfer(self, transfer_id: str, received: bool = True
                      ) -> tuple[TransferRecord | None, TransferRecord | None, bool | None]:
        """Both sides' records, each merged over its engine's workers, and whether the decode
        workers hold what the prefill workers sent, head by head (records.digests_agree).
        received: the decode request ended having taken its KV (not aborted), so once the prefill
        workers sent bytes a receive record must come: it is waited for up to RECEIVE_WAIT_S, not
        1 s (on the 2-core machine under TP a decode worker's record once came later than 1 s
        after its request ended, and the transfer went unjudged)."""
        sends = self._take(transfer_id, "send", 1.0)
        must_come = received and self.expected and any(s.bytes and not s.error for s in sends)
        receives = self._take(transfer_id, "receive", RECEIVE_WAIT_S if must_come else 1.0)
        return (merge_ranks(sends) if sends else None, merge_ranks(receives) if receives else None,
                digests_agree(sends, receives, self.workers["send"], self.workers["receive"]))


def compute_fields(prefill: ComputeRecord | None, decode: ComputeRecord | None) -> dict:
    """A request's row's share of the engines' compute records (None where a connector writes
    none: vLLM's own). kv_recomputed: the decode engine computed prompt tokens it was sent."""
    return {"decode_computed_tokens": decode.computed_tokens if decode else None,
            "decode_loaded_tokens": decode.loaded_tokens if decode else None,
            "decode_cached_tokens": decode.cached_tokens if decode else None,
            "decode_preemptions": decode.preemptions if decode else None,
            "prefill_preemptions": prefill.preemptions if prefill else None,
            "kv_recomputed": decode.recomputed_tokens > 0 if decode else None}


TIMELINE = ("prefill_admitted", "forward_done", "sent", "decode_submitted", "decode_admitted", "kv_arrived",
            "load_start", "kv_ready", "kv_checked", "decode_scheduled", "prefill_token", "first_token")


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
