"""The transfer record: one JSON line per transfer per side, written by the connector workers
(prefill worker: side "send"; decode worker: side "receive") and joined by the harness with its
own per-request rows. Each side writes its own file, so no two processes append to one file.

The harness depends on this module, never the other way round; results/README.md documents every
field (a test checks it against this class).
"""

from __future__ import annotations

import dataclasses
import json
import threading
from dataclasses import dataclass
from pathlib import Path

# Version of every record a run writes (transfer records, request and baseline rows).
#   1: unversioned rows; transfer_ms was the host's clock on every device at first, then on GPUs
#      the GPU's clock (CUDA events) with the host's kept as transfer_host_ms
#   2: schema_version on every row; transfer_ms is the GPU's clock where there is one
#   3: the request's timeline (t_* stamps on one clock, time.monotonic(), in every process of a
#      machine) and error; request rows gain the timeline, the TTFT decomposition and kv_ms
SCHEMA_VERSION = 3
UNVERSIONED = 1  # what a row without schema_version is


@dataclass
class TransferRecord:
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
    # None where this side does not measure it (send: send_ms, gpu_ms; receive: the rest)
    send_ms: float | None = None
    gpu_ms: float | None = None
    transfer_ms: float | None = None
    notify_ms: float | None = None
    load_ms: float | None = None
    ready_ms: float | None = None
    digests: list[str] | None = None
    digest_ms: float | None = None
    # the timeline, time.monotonic() seconds (None where this side does not see it)
    t_admitted: float | None = None  # this engine's scheduler allocated the request's blocks
    t_forward_done: float | None = None  # send: the forward pass that computed the KV was done
    t_sent: float | None = None  # send: every message's doorbell rung
    t_arrived: float | None = None  # receive: the last message's doorbell reached this worker
    t_load_start: float | None = None  # receive: this worker began taking the KV
    t_kv_ready: float | None = None  # receive: the KV in this engine's own blocks
    t_kv_checked: float | None = None  # receive: its digests computed (check.digests), right after t_kv_ready
    t_decode_scheduled: float | None = None  # receive: vLLM scheduled the step computing the first token
    error: str | None = None  # receive: why the KV was not loaded (the request failed or recomputed)
    schema_version: int = SCHEMA_VERSION

    @classmethod
    def from_dict(cls, row: dict) -> TransferRecord:
        """A record from one JSON line; version-1 lines (no schema_version, optional fields
        absent) load too. Keys this version does not know are dropped."""
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{"schema_version": UNVERSIONED, **{k: v for k, v in row.items() if k in known}})

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


class TransferRecordWriter:
    """Appends records to one file; each line is flushed at once so a crash keeps it."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._lock = threading.Lock()  # the engine's thread and the channel's receiver thread write

    def write(self, record: TransferRecord) -> None:
        # Opened per record: a worker writes a few per step, and a file left open would need a
        # close hook that vLLM does not always call when an engine is killed
        line = json.dumps(record.to_dict()) + "\n"
        with self._lock, open(self.path, "a") as f:
            f.write(line)


class TransferRecordReader:
    """Reads the records appended to a file since the last call (the file grows while read).
    A last line without its newline is being written: it is read on a later call."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.offset = 0

    def read_new(self) -> list[TransferRecord]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        end = data.rfind(b"\n") + 1
        self.offset += end
        return [TransferRecord.from_dict(json.loads(line)) for line in data[:end].splitlines() if line.strip()]
