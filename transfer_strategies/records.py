"""The transfer record: one JSON line per transfer per side, written by the connector workers
(prefill worker: side "send"; decode worker: side "receive") and joined by the harness with its
own per-request rows. Each side writes its own file, so no two processes append to one file.

The compute record: one JSON line per request per engine, written by the connector's scheduler
side when vLLM frees the request, into a file of its own beside the transfer records
(`compute_path`): how many prompt tokens the engine computed, as vLLM scheduled them, and how
many it took from the connector. It is the proof that the decode engine used the KV it was sent
(a decode engine that recomputed the prompt passes every output check).

The harness reads and judges them (harness/records/transfer_records.py) and depends on this module,
never the other way round; results/README.md documents every field (a test checks it against these
classes).
"""

from __future__ import annotations

import dataclasses
import json
import queue
import threading
from dataclasses import dataclass
from pathlib import Path

# The version of what the connectors write (TransferRecord, ComputeRecord), in each record's
# schema_version. Up to 16 it also versioned the harness's own rows, which have their own since
# (harness/records/schema.py); results/README.md says what each version means.
RECORD_VERSION = 17
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
    bytes: int | None  # None: not seen (the observer beside vLLM's connector)
    messages: int | None
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
    # receive, a decode engine of several workers each holding one head whole (MLA's latent; from
    # version 17, None elsewhere): the bytes this worker took from decode worker 0's relay, which
    # did not cross the link (its `bytes` and `messages` are 0: relay.py)
    relayed_bytes: int | None = None
    schema_version: int = RECORD_VERSION


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
    schema_version: int = RECORD_VERSION

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
