"""The record of every transfer one worker takes part in (records.TransferRecord, one per side):
built when its side ends, counted for /metrics (connector_stats.py), and with check.digests its
checks queued on the device's stream at once (the blocks' digests, or a lossy strategy's checks:
codec_checks.py) and read back and written by the record queue's thread, off the engine's step.

A decode request's receive record carries when vLLM scheduled its first decode step
(t_decode_scheduled), which may come after its KV was loaded: such a record waits here until
then (`scheduled`), or until vLLM finishes the request first (`cancelled`).
"""

from __future__ import annotations

import time

import torch

from transfer_strategies.codec_checks import PayloadCheck, SendCheck
from transfer_strategies.codecs import Codec
from transfer_strategies.connector_stats import Tally
from transfer_strategies.digests import BlockDigests
from transfer_strategies.kv_blocks import KVBlocks
from transfer_strategies.records import RecordQueue, RecordWriters, TransferRecord, TransferRecordWriter
from transfer_strategies.scheduler import TransferRequest
from transfer_strategies.tp import Placement
from transfer_strategies.transport import Message


def sync(device: torch.device) -> None:
    """Wait until the device has done what this worker queued on it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class TransferRecorder:
    def __init__(self, strategy: str, is_producer: bool, verify: bool, kv: KVBlocks, place: Placement | None,
                 writers: RecordWriters, tally: Tally, sees_wire: bool = True):
        """verify: check.digests; place: None with one worker each side, every head here; sees_wire:
        False beside another connector (observer.py), whose bytes and messages are not seen."""
        self.strategy, self.is_producer, self.verify, self.sees_wire = strategy, is_producer, verify, sees_wire
        self.kv, self.place, self.writers, self.tally = kv, place, writers, tally
        self.queue = RecordQueue()
        self.digests = BlockDigests(kv, None if place is None else place.heads)
        self.codec: Codec | None = None  # a lossy strategy's (worker.use_codec)
        self._scheduled_at: dict[str, float] = {}  # req id -> when its first decode step was scheduled
        # receive records waiting for that stamp, with their digests and file
        self._unwritten: dict[str, tuple[TransferRecordWriter, TransferRecord, list]] = {}

    def transfer_block_ids(self, req: TransferRequest) -> list[int]:
        """The blocks whose digests judge a transfer: on the prefill side every block sent, on
        the decode side the blocks the transfer wrote (past the engine's own prefix-cache
        hits). A cached block is not the transfer's: the decode engine may have computed part
        of it itself (the last prompt token of an earlier request that ended on the block's
        last slot), and on a GPU its bits differ from the prefill's in the last place. The
        harness compares the sender's digests past the receiver's skip_blocks
        (records.digests_agree)."""
        return list(req.block_ids if self.is_producer else req.written_block_ids)

    def record(self, req: TransferRequest, side: str, **times) -> None:
        pending = []
        writer = self.writers.get(req.asked.records)
        if self.verify and writer is not None and "error" not in times:
            # queued on the device's stream before any later forward pass can write these blocks;
            # read back and written by the record queue's thread, off this step. A lossy sender
            # checks what it should have sent instead of digesting its cache (codec_checks.py).
            if side == "send" and self.codec is not None:
                pending.append(SendCheck(self.codec, self.digests, req.block_ids, self._payload_shares()))
            else:
                pending.append(self.digests.launch(self.transfer_block_ids(req)))
            if req.progress.payload_check is not None:
                pending.append(req.progress.payload_check)
        if self.codec is not None:
            times.update(codec=self.codec.name, codec_ms=req.progress.codec_ms() if req.progress.codec_ms else None)
        if "t_kv_ready" in times:  # what checking the KV held up the request (launching its digests)
            times["t_kv_checked"] = time.monotonic()
        record = TransferRecord(
            transfer_id=req.transfer_id, side=side, strategy=self.strategy, blocks=len(req.block_ids),
            fault=req.asked.fault,
            rank=0 if self.place is None else self.place.rank,
            block_ids=list(req.block_ids),
            skip_blocks=req.skip_blocks, tokens=req.num_tokens, kv_cache_blocks=self.kv.num_blocks,
            kv_cache_bytes=self.kv.cache_bytes(), bytes=req.progress.bytes if self.sees_wire else None,
            messages=req.progress.messages if self.sees_wire else None, **times)
        self.tally.add(record)
        if writer is None:
            return
        if side == "send" or "t_decode_scheduled" in times:
            self.queue.put(writer, record, pending)
        elif req.req_id in self._scheduled_at or "error" in times:
            self._write_receive(writer, record, pending, req.req_id)
        else:  # parked: written when vLLM schedules its first decode step
            self._unwritten[req.req_id] = (writer, record, pending)

    def received(self, req: TransferRequest, msgs: list[Message], t_start: float, t_end: float, **times) -> None:
        """The receive record of a transfer whose messages were taken between t_start and t_end."""
        sent_at = msgs[0].meta.get("t0", t_start) if msgs else t_start
        delivered = max((m.delivered for m in msgs), default=t_start)
        arrived = max((m.arrived for m in msgs), default=t_start)
        # joined messages (head_shards.py): their parts; relayed ones (relay.py): nothing crossed to this worker
        wire = [m.meta.get("wire", (1, m.payload.numel())) for m in msgs]
        req.progress.messages, req.progress.bytes = sum(n for n, _ in wire), sum(b for _, b in wire)
        relayed = [m.meta["relayed"] for m in msgs if "relayed" in m.meta]
        if relayed:
            times["relayed_bytes"] = sum(relayed)
        self.record(req, "receive",
                    transfer_ms=(delivered - sent_at) * 1e3,  # sender starts gathering -> last byte in our memory
                    notify_ms=(arrived - delivered) * 1e3,  # -> this worker has been told (doorbell latency)
                    load_ms=(t_end - t_start) * 1e3,  # decode step blocked on KV (wait + scatter)
                    ready_ms=(t_end - sent_at) * 1e3,  # sender starts -> KV in this engine's blocks
                    t_admitted=req.progress.t_admitted, t_arrived=arrived, t_load_start=t_start, t_kv_ready=t_end,
                    **times)

    def scheduled(self, stamps: dict[str, float]) -> None:
        """vLLM scheduled these requests' first decode steps (req id -> when): their receive
        records, once they have one, are written."""
        if self.writers.any:  # read only by the records (a stamp nothing pops would stay)
            self._scheduled_at.update(stamps)
        for rid in [r for r in self._unwritten if r in self._scheduled_at]:
            self._write_receive(*self._unwritten.pop(rid), rid)

    def cancelled(self, req_id: str) -> None:
        """vLLM finished the request without scheduling it: a receive record waiting for that is written now."""
        if req_id in self._unwritten:  # loaded, then finished before vLLM scheduled it
            self._write_receive(*self._unwritten.pop(req_id), req_id)

    def _write_receive(self, writer: TransferRecordWriter, record: TransferRecord, pending: list,
                       req_id: str) -> None:
        record.t_decode_scheduled = self._scheduled_at.pop(req_id, None)
        self.queue.put(writer, record, pending)

    def flush(self) -> None:
        """Returns once every record so far is in its file."""
        self.queue.flush()

    # a lossy strategy's payload checks between engines of different tensor-parallel degrees
    def payload_check(self, req: TransferRequest, payload: torch.Tensor) -> PayloadCheck:
        """What a lossy receiver checksums, queued now: the payload as it arrived, or between
        engines of different TP degrees each prefill worker's part of it, by that worker's rank
        (as the sender checksums what each decode worker should get: _payload_shares)."""
        if not self._unequal_degrees():
            return PayloadCheck(payload)
        joined = next((m.meta["parts"] for m in req.progress.received if m.payload is payload and "parts" in m.meta),
                      [payload])
        return PayloadCheck({str(s.prefill_rank): part for s, part in zip(self.place.my_shares(), joined, strict=True)})

    def _payload_shares(self) -> list[tuple[str, range]] | None:
        """Between engines of different TP degrees, each decode worker this prefill worker sends to
        (its rank) and the heads it takes, of this worker's; None: one payload, whole."""
        if not self._unequal_degrees():
            return None
        first = self.place.heads.start
        return [(str(s.decode_rank), range(s.heads.start - first, s.heads.stop - first))
                for s in self.place.my_shares()]

    def _unequal_degrees(self) -> bool:
        """Payloads cut by head between degrees (not MLA's latent: it crosses whole)."""
        return self.place is not None and self.place.prefill_tp != self.place.decode_tp and not self.place.one_head
