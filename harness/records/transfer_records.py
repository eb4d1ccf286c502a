"""The harness's reading and judging of the connectors' records (transfer_strategies/records.py
defines what a connector writes): records read as their files grow (TransferStats, both runners'
reader), one side of a transfer merged over its engine's tensor-parallel workers (merge_ranks), and
whether the decode workers hold, head by head, what the prefill workers sent (digests_agree)."""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from pathlib import Path

from transfer_strategies.records import ComputeRecord, JsonRecord, TransferRecord, compute_path, rank_path

# How merge_ranks combines the workers' fields: the side's last worker decides when it is done
# and the first when it started; bytes and messages add up; the rest is the same on every rank.
_LATEST = ("send_ms", "gpu_ms", "transfer_ms", "notify_ms", "load_ms", "ready_ms", "digest_ms", "codec_ms", "hook_ms",
           "t_forward_done",
           "t_sent", "t_arrived", "t_kv_ready", "t_kv_checked", "t_decode_scheduled")


_EARLIEST = ("t_admitted", "t_load_start")


def merge_ranks(records: list[TransferRecord]) -> TransferRecord:
    """One side of one transfer as the engine saw it, from its workers' records (one per rank):
    bytes and messages summed, the first start and last end, the first error. Digests stay with
    each worker's record: they are judged channel by channel (digests_agree), not merged."""
    if len(records) == 1:
        return records[0]
    records = sorted(records, key=lambda r: r.rank or 0)
    out = dataclasses.replace(records[0], rank=None, digests=None, payload_digest=None)
    for name in _LATEST + _EARLIEST:
        values = [getattr(r, name) for r in records if getattr(r, name) is not None]
        setattr(out, name, (max if name in _LATEST else min)(values) if values else None)
    if records[0].bytes is not None:  # None: not seen from outside (the observer)
        out.bytes = sum(r.bytes for r in records)
        out.messages = sum(r.messages for r in records)
    out.kv_cache_bytes = sum(r.kv_cache_bytes for r in records)
    out.error = next((r.error for r in records if r.error), None)
    errors = [r.codec_error for r in records if r.codec_error]
    if errors:  # each worker measured its own heads: the largest of the largest, the mean of the means
        out.codec_error = {k: [(max if k.startswith("max") else _mean)(layer) for layer in zip(*(e[k] for e in errors))]
                           for k in errors[0]}
    return out


def _mean(values) -> float:
    return sum(values) / len(values)


def digests_agree(sent: list[TransferRecord], received: list[TransferRecord], p: int, d: int) -> bool | None:
    """Whether each decode worker holds, head by head, what the prefill worker that sent it had
    in the blocks the transfer wrote (tp.shares: who sends which head to whom).

    Only the written blocks are judged: the decode side digests those past its own prefix-cache
    hits (skip_blocks; recorder.transfer_block_ids), so the sender's digests are compared from that
    block on. A cached block may hold a token the decode engine computed itself, in other bits
    than the prefill's (seen on a GPU, and on CPU between TP degrees). Judged per channel, not
    over an engine's merged records: where the prefill engine replicates a head (more workers
    than KV heads) its replicas need not be bit for bit equal (vLLM's CPU build at TP 4 with 2
    KV heads: they differ in the last bits), and a decode worker must hold exactly its
    sender's copy. A worker whose record is missing, or that digested other blocks than the
    transfer wrote, fails it; None: a side without digests, or a transfer that wrote nothing
    (every block was in the decode engine's prefix cache).

    A lossy strategy's (codecs.py) sender digests the blocks the receiver should reconstruct,
    and both sides checksum the compressed payload: each decode worker's must equal its
    sender's (equal degrees: worker r to worker r; else each part, per share)."""
    if not sent or not received or any(r.digests is None for r in sent + received):
        return None
    skip = max(r.skip_blocks for r in received)  # the decode engine's, the same on every worker
    if skip >= max(r.blocks for r in received):
        return None
    lossy = any(r.codec for r in sent + received)
    sends = {r.rank or 0: {h: ds[skip:] for h, ds in r.digests.items()} for r in sent}
    receives = {r.rank or 0: r.digests for r in received}
    if set(sends) != set(range(p)) or set(receives) != set(range(d)):
        return False
    from transfer_strategies.tp import heads_of, shares  # here: the results loader reads records without torch

    # one head held whole by every worker (MLA's latent, which vLLM counts as one KV head; digests
    # "all": no heads to cut): each decode worker must hold prefill worker 0's copy, which crossed
    # to decode worker 0 and was relayed from there to the others (tp.py)
    keys = {h for digests in receives.values() for h in digests}
    relayed = any(r.relayed_bytes is not None for r in received)
    if relayed or (keys == {"all"} and p != d):
        if any(receives[q].keys() != sends[0].keys() for q in range(d)):
            return False
        pairs = [(0, q, list(sends[0])) for q in range(d)]
    elif p == d:  # worker r to worker r, whatever the digests' keys ("all" where heads are unknown)
        if lossy:
            payloads = {r.rank or 0: r.payload_digest for r in sent}
            if any(r.payload_digest is None or r.payload_digest != payloads.get(r.rank or 0) for r in received):
                return False
        return all(sends[r] == receives[r] for r in range(p))
    else:
        n_heads = len({h for digests in sends.values() for h in digests})
        if not all(receives[q].keys() == {str(h) for h in heads_of(q, d, n_heads)} for q in range(d)):
            return False
        pairs = [(s.prefill_rank, s.decode_rank, [str(h) for h in s.heads]) for s in shares(p, d, n_heads)]
    if lossy:  # each part (by head: of the decode worker's checksum the prefill worker's part) as it arrived
        sent_parts = {r.rank or 0: r.payload_digest for r in sent}
        got_parts = {r.rank or 0: r.payload_digest for r in received}
        for r, q, _ in pairs:
            mine = sent_parts[r].get(str(q)) if isinstance(sent_parts[r], dict) else sent_parts[r]
            theirs = got_parts[q].get(str(r)) if isinstance(got_parts[q], dict) else got_parts[q]
            if mine is None or mine != theirs or isinstance(sent_parts[r], dict) != isinstance(got_parts[q], dict):
                return False
    return all(sends[r].get(k) == receives[q][k] for r, q, keys in pairs for k in keys)


class TransferRecordReader:
    """Reads the records appended to a file since the last call (the file grows while read).
    A last line without its newline is being written: it is read on a later call."""

    def __init__(self, path: str | Path, record=TransferRecord):
        self.path = Path(path)
        self.offset = 0
        self.record = record

    def read_new(self) -> list[JsonRecord]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        end = data.rfind(b"\n") + 1
        self.offset += end
        return [self.record.from_dict(json.loads(line)) for line in data[:end].splitlines() if line.strip()]


RECEIVE_WAIT_S = 30.0


class TransferStats:
    """The connectors' records, read as they are appended: each file from where the last read
    stopped, only when a record asked for is not in yet. Sides: the workers' transfer records
    ("send", "receive"), one per worker of the engine (tensor parallelism), merged, and the
    scheduler sides' compute records ("prefill", "decode") written beside them. Safe to share
    between threads (runner=serve's row writers of the load and of the probes share one): a read
    and a take hold its lock, so no two threads read one file from the same place (both advancing
    its offset, the next read would start inside a record)."""

    def __init__(self, *paths: Path, tp: tuple[int, int] = (1, 1), prefill_engines: int = 1,
                 expected: bool = False):
        """paths: the prefill engines' records, then the decode engines' (serving mode: several
        of each, the first prefill_engines of them prefill); tp: the prefill and decode engines'
        degrees; expected: every transfer has records (this project's connectors), so a missing
        one is waited for."""
        self.expected = expected
        # how long a send record that must come is waited for: RECEIVE_WAIT_S until one never came
        # (the run then fails as kv_not_moved or unjudged; the other requests need not wait as long)
        self.patience_s = RECEIVE_WAIT_S
        degrees = (tp[0],) * prefill_engines + (tp[1],) * (len(paths) - prefill_engines)
        self.workers = {"send": tp[0], "receive": tp[1]}
        self.readers = [TransferRecordReader(rank_path(p, r)) for p, n in zip(paths, degrees) for r in range(n)]
        self.readers += [TransferRecordReader(compute_path(p), ComputeRecord) for p in paths]
        self.records: dict[tuple[str, str], list[TransferRecord | ComputeRecord]] = {}
        self._lock = threading.Lock()

    def has_both(self, transfer_id: str) -> bool:
        """Whether both sides' records of this transfer are in, from every worker (reading what
        was appended)."""
        with self._lock:
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
        while True:
            with self._lock:
                if self._workers_in(transfer_id, side) >= want:
                    break
                self._read()
                missing = (transfer_id, side) not in self.records
                if self._workers_in(transfer_id, side) >= want or (not self.expected and missing) \
                        or time.monotonic() > deadline:
                    break
            time.sleep(0.01)
        with self._lock:
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
        received: the decode request ended having taken its KV (not aborted), so with this
        project's connectors the prefill workers' send records must come, and once they sent
        bytes a receive record too: each is waited for up to RECEIVE_WAIT_S, not 1 s (on the
        2-core machine under TP a decode worker's record once came later than 1 s after its
        request ended, and a prefill worker's record of a one-block prompt 3.4 s after: both
        transfers went unjudged)."""
        sends = self._take(transfer_id, "send", self.patience_s if received and self.expected else 1.0)
        if received and self.expected and not sends:
            self.patience_s = 1.0
        must_come = received and self.expected and any(s.bytes and not s.error for s in sends)
        receives = self._take(transfer_id, "receive", RECEIVE_WAIT_S if must_come else 1.0)
        return (merge_ranks(sends) if sends else None, merge_ranks(receives) if receives else None,
                digests_agree(sends, receives, self.workers["send"], self.workers["receive"]))
