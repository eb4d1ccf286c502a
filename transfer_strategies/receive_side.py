"""The decode worker's side of every transfer: what vLLM's scheduler decided for each step, the
messages each request collects (checked for a scenario's damage), a lossy payload reconstructed
into this engine's blocks, and how each receive ends, loaded or failed, for its record
(recorder.py).

It also holds the requests vLLM parked until their KV arrives (early submission, see
scheduler.py; parking.py keeps them): each step it says which have arrived (`arrived`), the
facade runs the strategy's `receive` for them, and `finished_receiving` tells vLLM which to
release. A parked request whose KV has not come within timeout_s (the scheduler side's clock: it
lists the request as expired, to every worker in the same step) fails: its blocks are reported to
vLLM as not loaded (`load_errors`), so vLLM's kv_load_failure_policy decides (fail the request,
or recompute it), and its record says why.
"""

from __future__ import annotations

import time

import torch

from transfer_strategies.clock import DeviceTimer
from transfer_strategies.codecs import Codec
from transfer_strategies.faults import TransferFault, check_message
from transfer_strategies.kv_blocks import KVBlocks
from transfer_strategies.negative_control import corrupt_received
from transfer_strategies.parking import ParkedRequests
from transfer_strategies.recorder import TransferRecorder, sync
from transfer_strategies.scheduler import TransferRequest
from transfer_strategies.transport import Message


class ReceiveSide:
    def __init__(self, kv: KVBlocks, channel, recorder: TransferRecorder, verify: bool, timeout_s: float):
        """channel: the receiver (transport/); verify: check.digests (a lossy payload's checksum
        too); timeout_s: how long a parked request waits for its KV (its error says so)."""
        self.kv, self.channel, self.recorder = kv, channel, recorder
        self.verify, self.timeout_s = verify, timeout_s
        self.parking = ParkedRequests()  # early submission
        self.codec: Codec | None = None  # a lossy strategy's (worker.use_codec)

    def take_step(self, meta) -> None:
        """What vLLM's scheduler decided for this step: requests to park until their KV arrives,
        messages to drain, parked requests it cancelled, first steps scheduled."""
        for req in meta.parked:
            self.parking.park(req)
        for req in meta.drains:  # nothing is written: no digest to take (recorder.transfer_block_ids)
            scheduled = meta.scheduled.pop(req.req_id, None)
            self.channel.when_complete(req.transfer_id, lambda msgs, req=req, t=scheduled: self._drained(req, msgs, t))
        for rid in meta.cancelled:
            tid = self.parking.cancel(rid)
            if tid is not None:
                self._drop(tid)
            self.recorder.cancelled(rid)
        for tid in meta.dropped:
            self._drop(tid)
        for rid in meta.expired:  # every worker in this step: vLLM hears of the failure from all at once
            req = self.parking.expire(rid)
            if req is not None:
                self._drop(req.transfer_id)
                self.recorder.record(req, "receive", error=f"no KV arrived for transfer {req.transfer_id} "
                                                           f"within {self.timeout_s:.0f} s",
                                     t_admitted=req.progress.t_admitted)
        self.parking.scheduled(meta.scheduled)
        self.recorder.scheduled(meta.scheduled)

    def arrived(self, idle: bool) -> list[TransferRequest]:
        """Parked requests whose messages have all arrived (the facade receives them now)."""
        return self.parking.poll(self.channel, idle)

    def _drop(self, transfer_id: str) -> None:
        """The KV of a request that no longer wants it is released when (if) it comes."""
        self.channel.when_complete(transfer_id, lambda msgs: self.channel.release(transfer_id))

    def _drained(self, req: TransferRequest, msgs: list[Message], t_scheduled: float | None) -> None:
        """A request whose every block was in this engine's prefix cache: its message is taken
        (the sender's space freed) and recorded; it wrote nothing, so no digest judges it. Runs in
        the channel's receiver thread when the message comes after the request was scheduled:
        the engine may never step again."""
        self.channel.release(req.transfer_id)
        t_end = time.monotonic()
        self.recorder.received(req, msgs, t_end, t_end, t_decode_scheduled=t_scheduled)  # nothing loaded

    def finished_receiving(self) -> set[str]:
        return self.parking.released()

    def load_errors(self) -> set[int]:
        return self.parking.load_errors()

    def begin_receive(self, req: TransferRequest) -> None:
        req.progress.clock = time.monotonic()

    def collect(self, req: TransferRequest, index: int | None = None) -> list[Message]:
        msgs = self.channel.wait(req.transfer_id, index)
        req.progress.received.extend(msgs)
        for m in msgs:
            problem = check_message(m)
            if problem is not None:
                raise TransferFault(f"transfer {req.transfer_id} message {m.index + 1} of {m.count}: {problem}")
        return msgs

    def decode_into(self, req: TransferRequest, payload: torch.Tensor) -> None:
        """A lossy strategy's payload as it arrived, checksummed, then reconstructed into this
        engine's blocks past its prefix-cache hits; one of another size than the codec's for this
        request (a scale gone missing) is a TransferFault, and nothing is written."""
        if self.verify:  # queued before the reconstruction; read in the record's thread
            req.progress.payload_check = self.recorder.payload_check(req, payload)
        timer = DeviceTimer(self.kv.device)
        try:
            self.codec.decode_into(payload, req.block_ids, req.skip_blocks)
        except ValueError as e:
            raise TransferFault(f"transfer {req.transfer_id}: {e}") from None
        req.progress.codec_ms = timer.stop()

    def fail_receive(self, req: TransferRequest, reason: str) -> None:
        """A transfer caught broken: its messages are dropped, its blocks reported to vLLM as
        failed loads (its kv_load_failure_policy fails or recomputes the request), its record
        says why."""
        sync(self.kv.device)  # nothing queued still reads its messages (the payload's checksum)
        self.channel.release(req.transfer_id)
        self.parking.fail_blocks(req.written_block_ids)
        self.recorder.record(req, "receive", error=reason, t_admitted=req.progress.t_admitted)

    def end_receive(self, req: TransferRequest) -> None:
        if req.asked.corrupt:
            corrupt_received(self.kv, req)
        sync(self.kv.device)
        t_end = time.monotonic()
        self.channel.release(req.transfer_id)
        self.recorder.received(req, req.progress.received, req.progress.clock, t_end)
