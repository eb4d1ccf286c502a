"""The transfer record: one JSON line per transfer per side, written by the connector workers
(prefill worker: side "send"; decode worker: side "receive") and joined by the harness with its
own per-request rows. Each side writes its own file, so no two processes append to one file.

The compute record: one JSON line per request per engine, written by the connector's scheduler
side when vLLM frees the request, into a file of its own beside the transfer records
(`compute_path`): how many prompt tokens the engine computed, as vLLM scheduled them, and how
many it took from the connector. It is the proof that the decode engine used the KV it was sent
(a decode engine that recomputed the prompt passes every output check).

The harness depends on this module, never the other way round; results/README.md documents every
field (a test checks it against this class).
"""

from __future__ import annotations

import dataclasses
import json
import queue
import threading
from dataclasses import dataclass
from pathlib import Path

# Version of every record a run writes (transfer records, request and baseline rows).
#   1: unversioned rows; transfer_ms was the host's clock on every device at first, then on GPUs
#      the GPU's clock (CUDA events) with the host's kept as transfer_host_ms
#   2: schema_version on every row; transfer_ms is the GPU's clock where there is one
#   3: the request's timeline (t_* stamps on one clock, time.monotonic(), in every process of a
#      machine) and error; request rows gain the timeline, the TTFT decomposition and kv_ms
#   4: the scheduler sides' compute records (ComputeRecord) and the request rows' fields from them
#      (decode_computed_tokens, kv_recomputed, preemptions); the scenarios' fault and aborted;
#      transfer records carry block_ids and fault
#   5: tensor parallelism: a transfer record per worker (rank; ranks above 0 in files of their own,
#      rank_path), digests per KV head ({global head: [one per block]}; "all" where heads cannot
#      be told apart), merged per transfer by `merge_ranks` (digests judged per channel: digests_agree)
#   6: near ties: baseline rows keep each position's top-k ids (top_ids), request rows near_tie
#   7: runner=serve's rows near_tie too (its summary near_ties)
#   8: a receive record's digests cover the blocks the transfer wrote (block_ids[skip_blocks:]),
#      not the decode engine's own prefix-cache hits; a transfer that wrote nothing has none to judge
#   9: digests off the engines' steps: t_kv_checked is when they were launched on the device,
#      digest_ms their own time (the device's, then the hex), no longer the step's
#  10: engines kept between the runs of one process: summary.json's engines_reused and
#      engine_logs; each request names its run's records file (kv_transfer_params' records)
#  11: runner=serve runs the fault and abort scenarios: its rows gain fault and aborted, its
#      summary faults_injected, faults_caught and faults_missed
#  12: lossy strategies (codecs.py): transfer records gain codec, codec_ms, payload_digest and (send)
#      codec_error; a lossy sender's digests are of the blocks the receiver should reconstruct;
#      request rows gain codec, codec_ms and the reconstruction's error (codec_max_rel, ...)
#  13: the lossy checks off the engines' steps (codec_checks.py): a lossy sender's payload_digest,
#      codec_error and digests come from one pass over its blocks (on CUDA), its digest_ms is
#      that pass's time; send records gain hook_ms (a streaming strategy's host time in the
#      forward pass's per-layer hooks), request rows and summary.json hook_ms too
#  14: runner=serve's repeats, probes, trace replay, ramp-up, coalesced streams, matched baselines
#      (results/README.md)
#  15: runner=serve's handover: its P/D rows gain base_ttft_ms and handover_<part>_ms, its summary
#      handover_parts_mean_ms (harness/schema.py HANDOVER_PATH)
#  16: lossy strategies between engines of different tensor-parallel degrees: a transfer record's
#      payload_digest is then one checksum per part ({the other worker's rank: hex})
SCHEMA_VERSION = 16
UNVERSIONED = 1  # what a row without schema_version is


class JsonRecord:
    """A dataclass written as one JSON line."""

    @classmethod
    def from_dict(cls, row: dict):
        """A record from one JSON line; version-1 lines (no schema_version, optional fields
        absent) load too. Keys this version does not know are dropped."""
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{"schema_version": UNVERSIONED, **{k: v for k, v in row.items() if k in known}})

    def to_dict(self) -> dict:
        # shallow: asdict's deep copy of a record's digests (2048 at 8k tokens of the Llama-3-8B
        # shape) made writing one cost 0.61 ms on the H200 machine's host (now 0.16), on both
        # engines' critical paths
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


@dataclass
class TransferRecord(JsonRecord):
    transfer_id: str
    side: str  # "send" (prefill worker) or "receive" (decode worker)
    strategy: str  # the connector's class name
    blocks: int
    skip_blocks: int
    tokens: int
    kv_cache_blocks: int
    kv_cache_bytes: int
    bytes: int
    messages: int
    block_ids: list[int] | None = None  # this engine's blocks holding the request's KV, in order
    # None where this side does not measure it (send: send_ms, gpu_ms; receive: the rest)
    send_ms: float | None = None
    gpu_ms: float | None = None
    transfer_ms: float | None = None
    notify_ms: float | None = None
    load_ms: float | None = None
    ready_ms: float | None = None
    # {global KV head: [digest of each block]} (version 4: a list); receive, since version 8: of the
    # blocks written, block_ids[skip_blocks:] (block_ids[:skip_blocks] came from its prefix cache)
    digests: dict[str, list[str]] | None = None
    digest_ms: float | None = None
    # the timeline, time.monotonic() seconds (None where this side does not see it)
    t_admitted: float | None = None  # this engine's scheduler allocated the request's blocks
    t_forward_done: float | None = None  # send: the forward pass that computed the KV was done
    t_sent: float | None = None  # send: every message's doorbell rung
    t_arrived: float | None = None  # receive: the last message's doorbell reached this worker
    t_load_start: float | None = None  # receive: this worker began taking the KV
    t_kv_ready: float | None = None  # receive: the KV in this engine's own blocks
    t_kv_checked: float | None = None  # receive: its digests launched (check.digests), right after t_kv_ready
    t_decode_scheduled: float | None = None  # receive: vLLM scheduled the step computing the first token
    error: str | None = None  # receive: why the KV was not loaded (the request failed or recomputed)
    fault: str | None = None  # send: the transport fault a scenario injected into this transfer
    rank: int | None = 0  # the worker's tensor-parallel rank (None: merged over every rank, merge_ranks)
    # lossy strategies only (codecs.py; None elsewhere): the codec (format/scale/values per scale),
    # its time (send: compressing, after the gather; receive: reconstructing), the checksum of the
    # compressed payload with its scales (send: of what it should have sent; receive: of what
    # arrived), and (send) the reconstruction's error against the original, per layer:
    # {max_abs, mean_abs, max_rel, mean_rel: [one per layer]} (codecs.reconstruction_error).
    # Between engines of different TP degrees the payload is cut by head (head_shards.py), and
    # payload_digest is each part's checksum by the other side's worker: {decode rank: hex} on a
    # send record, {prefill rank: hex} on a receive record
    codec: str | None = None
    codec_ms: float | None = None
    payload_digest: str | dict[str, str] | None = None
    codec_error: dict[str, list[float]] | None = None
    # send, a strategy streaming from inside the forward pass (layerwise; None elsewhere, from version
    # 13): the host time its per-layer hooks spent on this request, summed over layers
    hook_ms: float | None = None
    schema_version: int = SCHEMA_VERSION


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
    hits (skip_blocks; worker.transfer_block_ids), so the sender's digests are compared from that
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
    if lossy and p == d:
        payloads = {r.rank or 0: r.payload_digest for r in sent}
        if any(r.payload_digest is None or r.payload_digest != payloads.get(r.rank or 0) for r in received):
            return False
    sends = {r.rank or 0: {h: ds[skip:] for h, ds in r.digests.items()} for r in sent}
    receives = {r.rank or 0: r.digests for r in received}
    if set(sends) != set(range(p)) or set(receives) != set(range(d)):
        return False
    if p == d:  # worker r to worker r, whatever the digests' keys ("all" where heads are unknown)
        return all(sends[r] == receives[r] for r in range(p))
    from transfer_strategies.tp import heads_of, shares  # here: the results loader reads records without torch

    n_heads = len({h for digests in sends.values() for h in digests})
    if not all(receives[q].keys() == {str(h) for h in heads_of(q, d, n_heads)} for q in range(d)):
        return False
    if lossy:  # each part: what its prefill worker checksummed for that decode worker, as it arrived
        sent_parts = {r.rank or 0: r.payload_digest for r in sent}
        got_parts = {r.rank or 0: r.payload_digest for r in received}
        for s in shares(p, d, n_heads):
            mine, theirs = sent_parts[s.prefill_rank], got_parts[s.decode_rank]
            if not (isinstance(mine, dict) and isinstance(theirs, dict)
                    and mine.get(str(s.decode_rank)) is not None
                    and mine.get(str(s.decode_rank)) == theirs.get(str(s.prefill_rank))):
                return False
    return all(sends[s.prefill_rank].get(str(h)) == receives[s.decode_rank][str(h)]
               for s in shares(p, d, n_heads) for h in s.heads)


@dataclass
class ComputeRecord(JsonRecord):
    """One request on one engine, counted from vLLM's scheduler outputs (what it scheduled the
    model to compute), not from what the strategy says it did."""

    transfer_id: str
    side: str  # "prefill" or "decode"
    req_id: str
    prompt_tokens: int
    computed_tokens: int = 0  # prompt tokens this engine computed, summed over every admission
    loaded_tokens: int = 0  # prompt tokens vLLM took from the connector (its external hits)
    cached_tokens: int | None = None  # at its first scheduled step: its own prefix-cache hits + loaded_tokens
    admissions: int = 0  # vLLM allocated its blocks this many times (more than once: preempted)
    schema_version: int = SCHEMA_VERSION

    @property
    def preemptions(self) -> int:
        return max(self.admissions - 1, 0)

    @property
    def recomputed_tokens(self) -> int:
        """Decode: prompt tokens computed beyond the last one, which vLLM always computes for
        its logits (its own prefix-cache hits are not computed, so they are not counted)."""
        return max(self.computed_tokens - 1, 0)


def compute_path(stats_path: str | Path) -> Path:
    """Where the scheduler side writes its compute records, beside the worker's transfer records
    (prefill-transfers.jsonl -> prefill-transfers.compute.jsonl): the scheduler and a worker may
    be different processes."""
    p = Path(stats_path)
    return p.with_name(p.stem + ".compute" + p.suffix)


def rank_path(stats_path: str | Path, rank: int) -> Path:
    """Where worker `rank` of an engine writes its transfer records: rank 0 in stats_path, the
    others beside it (prefill-transfers.jsonl -> prefill-transfers.rank1.jsonl), one file per
    process."""
    p = Path(stats_path)
    return p if rank == 0 else p.with_name(f"{p.stem}.rank{rank}{p.suffix}")


class TransferRecordWriter:
    """Appends records to one file; each line is flushed at once so a crash keeps it."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._lock = threading.Lock()  # the engine's thread and the channel's receiver thread write

    def write(self, record: JsonRecord) -> None:
        # Opened per record: a worker writes a few per step, and a file left open would need a
        # close hook that vLLM does not always call when an engine is killed
        line = json.dumps(record.to_dict()) + "\n"
        with self._lock, open(self.path, "a") as f:
            f.write(line)


class RecordWriters:
    """One writer per records file, made when first asked for: a request names its file
    (kv_transfer_params' records), else the connector's default (harness.stats_path, or none).
    `path` maps the named file to this process's own (records.rank_path, compute_path)."""

    def __init__(self, default: str | None, path=Path):
        self.default, self.path = default, path
        self._writers: dict[str, TransferRecordWriter] = {}

    def get(self, named: str | None = None) -> TransferRecordWriter | None:
        name = named or self.default
        if not name:
            return None
        if name not in self._writers:
            self._writers[name] = TransferRecordWriter(self.path(name))
        return self._writers[name]

    @property
    def any(self) -> bool:
        """Whether records are written at all (a default file, or a request named one)."""
        return bool(self.default or self._writers)


class RecordQueue:
    """Writes the transfer records whose checks the device is still computing, from a thread of
    its own once they are in (each pending check's `fill(record)`: digests.PendingDigests,
    codec_checks.SendCheck and PayloadCheck), so that no engine step waits for them; a record
    with nothing pending is written at once. `flush` returns when everything put has been written."""

    def __init__(self):
        self._queue: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None

    def put(self, writer: TransferRecordWriter, record: TransferRecord, pending: list | None = None) -> None:
        if not pending:
            writer.write(record)
            return
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="transfer-records", daemon=True)
            self._thread.start()
        self._queue.put((writer, record, pending))

    def _run(self) -> None:
        while True:
            writer, record, pending = self._queue.get()
            try:
                for check in pending:
                    check.fill(record)
            except Exception as e:  # noqa: BLE001 - the record says so: its transfer is not judged equal
                record.error = f"its checks (digests, a payload checksum) could not be computed: {e!r}"
            try:
                writer.write(record)
            finally:
                self._queue.task_done()

    def flush(self) -> None:
        self._queue.join()


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
