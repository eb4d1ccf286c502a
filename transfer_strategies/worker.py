"""Worker side of a connector: the engine's KV blocks, the channel to the other engine, and the
bookkeeping around every transfer (its clock, byte and message counts, digests, the negative
control and its record). It runs in vLLM's model worker; the connector facade (`base.py`) holds
one and hands the strategy its short API on top.

On the decode side it also holds the requests vLLM parked until their KV arrives (early
submission, see scheduler.py; parking.py keeps them): each step it says which have arrived
(`arrived`), the facade runs the strategy's `receive` for them, and `finished_receiving` tells
vLLM which to release. A parked request whose KV has not come within timeout_s (the scheduler
side's clock: it lists the request as expired, to every worker in the same step) fails: its blocks
are reported to vLLM as not loaded (`load_errors`), so vLLM's kv_load_failure_policy decides
(fail the request, or recompute it), and its record says why.
"""

from __future__ import annotations

import itertools
import threading
import time

import torch

from transfer_strategies.clock import DeviceTimer, SendClock
from transfer_strategies.codec_checks import PayloadCheck, SendCheck
from transfer_strategies.codecs import Codec
from transfer_strategies.connector_config import HarnessSettings, TransportSettings
from transfer_strategies.connector_stats import Tally
from transfer_strategies.digests import BlockDigests
from transfer_strategies.faults import WITHHELD, TransferFault, check_message, damage, header
from transfer_strategies.head_shards import open_sharded, use_codec
from transfer_strategies.kv_blocks import KVBlocks
from transfer_strategies.kv_transfer_params import PEER
from transfer_strategies.negative_control import corrupt_received
from transfer_strategies.parking import ParkedRequests
from transfer_strategies.records import RecordQueue, RecordWriters, TransferRecord, TransferRecordWriter, rank_path
from transfer_strategies.scheduler import TransferRequest
from transfer_strategies.tp import Placement, Share
from transfer_strategies.transport import Message, open_channel
from transfer_strategies.transport.fan_out import FanOut

LAYOUT_ID = "__layout__"


class TransferWorker:
    def __init__(self, strategy: str, is_producer: bool, harness: HarnessSettings | None = None,
                 transport: TransportSettings | None = None):
        """harness: what the harness sets; transport: the channel's settings (connector_config.py;
        their defaults where None)."""
        self.strategy = strategy
        self.is_producer = is_producer
        self.harness = harness = harness or HarnessSettings()
        self.transport = transport or TransportSettings()
        self.verify = harness.verify
        self.records = RecordQueue()
        self.tally = Tally()  # what this worker recorded, for vLLM's /metrics (connector_stats.py)
        self.writers: RecordWriters | None = None  # made in register, when this worker's rank is known
        self.kv: KVBlocks | None = None
        self.place: Placement | None = None
        self.channel = None
        self.timeout_s = harness.timeout_s
        self.checksums = harness.checksums  # each message's payload checksum in its header
        self.parking = ParkedRequests()  # decode, early submission
        self.codec: Codec | None = None  # a lossy strategy's, bound to this engine's layout (base.py)
        self._scheduled_at: dict[str, float] = {}  # req id -> when its first decode step was scheduled
        # receive records waiting for that stamp, with their digests and file
        self._unwritten: dict[str, tuple[TransferRecordWriter, TransferRecord, list]] = {}

    def register(self, kv_caches: dict[str, torch.Tensor], num_blocks: int, block_size: int,
                 place: Placement | None = None) -> None:
        """place: this worker's rank and both engines' tensor-parallel degrees (None: one worker
        each side, every head here)."""
        self.attach(kv_caches, num_blocks, place)
        h = self.harness
        layout = dict(self.kv.layout(), block_size=block_size)
        opening = {"device": self.kv.device, "transport": self.transport, "host": h.host,
                   "timeout_s": self.timeout_s, "open_timeout_s": h.startup_timeout_s}
        role = "sender" if self.is_producer else "receiver"
        if place is None or place.single:
            # rendezvous: a list on a decode worker fed by several prefill workers (serving mode)
            self.channel = open_channel(role, rendezvous=h.rendezvous, **opening,
                                        on_open=lambda channel: self._exchange_layout(channel, layout))
            return
        shares = itertools.cycle(place.my_shares())  # each channel's handshake in the order they open (per instance)
        self.channel = open_sharded(place, self.kv, h.rendezvous, opening,
                                    on_open=lambda channel: self._exchange_layout(channel, layout, next(shares)))

    def use_codec(self, codec: Codec) -> None:
        """A lossy strategy's codec, bound to this engine's layout; between engines of different
        tensor-parallel degrees the channel cuts and joins its payloads by head with it."""
        self.codec = codec
        use_codec(self.channel, codec)

    def attach(self, kv_caches: dict[str, torch.Tensor], num_blocks: int, place: Placement | None = None) -> None:
        """This engine's KV cache and records, before any channel opens."""
        self.place = place
        rank = 0 if place is None else place.rank
        self.writers = RecordWriters(self.harness.stats_path, lambda path: rank_path(path, rank))
        self.kv = KVBlocks(kv_caches, num_blocks, None if place is None else len(place.heads))
        self.digests = BlockDigests(self.kv, None if place is None else place.heads)

    def _exchange_layout(self, channel, mine: dict, share: Share | None = None) -> None:
        """Both engines must agree on layers, per-block shape, dtype and block size (not on
        num_blocks) before the first request; under tensor parallelism each channel's two
        workers on their ranks and degrees too, and the block shape may differ in its head count."""
        place = self.place
        if place is not None and not place.single:
            mine = dict(mine, prefill_tp=place.prefill_tp, decode_tp=place.decode_tp)
            if self.is_producer:
                mine["prefill_rank"] = place.rank
        if self.is_producer:
            channel.send(LAYOUT_ID, 0, 1, torch.empty(0, dtype=torch.uint8), layout=mine)
            return
        theirs = dict(channel.wait(LAYOUT_ID)[0].meta["layout"])
        channel.release(LAYOUT_ID)
        if share is not None:
            rank = theirs.pop("prefill_rank", None)
            if rank != share.prefill_rank:
                raise RuntimeError(f"decode worker {place.rank} expected prefill worker {share.prefill_rank} on its "
                                   f"channel, got {rank}")
            for lay in (theirs, mine):  # the head count differs between degrees: compared through the shares
                if lay.get("head_dim") is not None:
                    lay["block_shape"] = [None if i == lay["head_dim"] else n for i, n in enumerate(lay["block_shape"])]
        if theirs != mine:
            raise RuntimeError(f"prefill and decode KV layouts differ: prefill {theirs}, decode {mine}")

    # ---------------------------------------------------------------- prefill worker
    def alloc(self, n_blocks: int, n_layers: int) -> torch.Tensor:
        """[n_layers, *layer_shape(n_blocks)] in the KV dtype, in the channel's send space (in
        the staging buffer the receiver reads from: a payload built there is not copied again)."""
        kv = self.kv
        return kv.view(self.channel.alloc(kv.nbytes(n_blocks, n_layers)), n_layers)

    def route(self, req: TransferRequest):
        """The channel req's KV leaves by: with several decode instances (transport/fan_out.py)
        the one its prefill request names, which alloc() then takes space from until the next route."""
        return self.channel.to(req.asked.peer) if isinstance(self.channel, FanOut) else self.channel

    def routable(self, reqs: list[TransferRequest], record: bool = True) -> list[TransferRequest]:
        """Those of reqs whose KV has somewhere to go; with several decode instances a request
        that names none of them is not sent (record: its send record says why, and the decode
        request it belonged to fails when its KV does not come)."""
        if not isinstance(self.channel, FanOut):
            return reqs
        n, kept = len(self.channel.senders), []
        for req in reqs:
            peer = req.asked.peer
            if peer is not None and 0 <= peer < n:
                kept.append(req)
            elif record:
                self._record(req, "send", error=f"this prefill instance sends to {n} decode instances and transfer "
                                                f"{req.transfer_id} names none of them (kv_transfer_params "
                                                f"{PEER!r}: {peer!r})", t_admitted=req.progress.t_admitted)
        return kept

    def begin_send(self, req: TransferRequest, streaming: bool = False) -> None:
        self.route(req)  # what the strategy allocates from now on is in its decode instance's space
        req.progress.clock = SendClock(self.kv.device, streaming)

    def post(self, req: TransferRequest, payload: torch.Tensor, index: int, count: int, **meta) -> None:
        t0 = req.progress.clock.start()
        channel = self.route(req)
        if channel is not self.channel and self.channel.owns(payload) and not channel.owns(payload):
            raise RuntimeError(f"transfer {req.transfer_id}: its payload was built in another decode instance's "
                               f"staging space than its own (transport/fan_out.py)")
        # The last message's doorbell rings from this thread (no hand-over); earlier ones (count
        # 0: more follow, how many not known yet), and all of a streaming send, from the channel's
        # thread so that launching copies goes on.
        background = req.progress.clock.streaming or not count or index < count - 1
        meta = dict(header(payload, self.checksums), t0=t0, **meta)
        req.progress.messages += 1
        if req.asked.fault is not None:
            payload = damage(req.asked.fault, payload, index, count, channel.owns(payload))
            if req.asked.fault in WITHHELD:
                self._withhold(channel, req, payload, index, count, meta)
                return
        req.progress.bytes += channel.send(req.transfer_id, index, count, payload, background=background, **meta)

    def _withhold(self, channel, req: TransferRequest, payload: torch.Tensor, index: int, count: int,
                  meta: dict) -> None:
        """A dropped message gives its staging space back; a delayed one leaves from a timer."""
        if req.asked.fault == "drop":
            channel.discard(payload)
            return
        # late by default: past the decode worker's timeout
        delay_s = req.asked.fault_delay_s if req.asked.fault_delay_s is not None else self.timeout_s + 2
        timer = threading.Timer(delay_s, channel.send, (req.transfer_id, index, count, payload), meta)
        timer.daemon = True
        timer.start()

    def end_send(self, req: TransferRequest) -> None:
        req.progress.clock.start()  # in case nothing was posted
        t_forward_done = req.progress.clock.forward_done()
        channel = self.route(req)
        channel.flush()
        t_sent = time.monotonic()  # every doorbell rung
        self._sync()
        # nothing of this request written (dropped or withheld by a fault, or nothing to send): the
        # channel's last event is an earlier transfer's (on the H200 it gave drops -72 ms)
        gpu_ms = req.progress.clock.gpu_ms(channel.last_written) if req.progress.bytes else None
        send_ms = req.progress.clock.host_ms()
        self._record(req, "send", send_ms=send_ms, gpu_ms=gpu_ms,
                     hook_ms=req.progress.hook_ms if req.progress.clock.streaming else None,
                     t_admitted=req.progress.t_admitted, t_forward_done=t_forward_done, t_sent=t_sent)

    # ---------------------------------------------------------------- decode worker
    def take_step(self, meta) -> None:
        """What vLLM's scheduler decided for this step (decode side): requests to park until
        their KV arrives, messages to drain, parked requests it cancelled, first steps scheduled."""
        for req in meta.parked:
            self.parking.park(req)
        for req in meta.drains:  # nothing is written: no digest to take (transfer_block_ids)
            scheduled = meta.scheduled.pop(req.req_id, None)
            self.channel.when_complete(req.transfer_id, lambda msgs, req=req, t=scheduled: self._drained(req, msgs, t))
        for rid in meta.cancelled:
            tid = self.parking.cancel(rid)
            if tid is not None:
                self._drop(tid)
            if rid in self._unwritten:  # loaded, then finished before vLLM scheduled it
                self._write_receive(*self._unwritten.pop(rid), rid)
        for tid in meta.dropped:
            self._drop(tid)
        for rid in meta.expired:  # every worker in this step: vLLM hears of the failure from all at once
            req = self.parking.expire(rid)
            if req is not None:
                self._drop(req.transfer_id)
                self._record(req, "receive", error=f"no KV arrived for transfer {req.transfer_id} within "
                                                    f"{self.timeout_s:.0f} s", t_admitted=req.progress.t_admitted)
        self.parking.scheduled(meta.scheduled)
        if self.writers.any:  # read only by the records (a stamp nothing pops would stay)
            self._scheduled_at.update(meta.scheduled)
        for rid in [r for r in self._unwritten if r in self._scheduled_at]:
            self._write_receive(*self._unwritten.pop(rid), rid)

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
        self._record_received(req, msgs, t_end, t_end, t_decode_scheduled=t_scheduled)  # nothing loaded

    def finished_receiving(self) -> set[str]:
        return self.parking.released()

    def load_errors(self) -> set[int]:
        return self.parking.load_errors()

    def begin_receive(self, req: TransferRequest) -> None:
        req.progress.clock = time.monotonic()

    def decode_into(self, req: TransferRequest, payload: torch.Tensor) -> None:
        """A lossy strategy's payload as it arrived, checksummed, then reconstructed into this
        engine's blocks past its prefix-cache hits; one of another size than the codec's for this
        request (a scale gone missing) is a TransferFault, and nothing is written."""
        if self.verify:  # queued before the reconstruction; read in the record's thread
            req.progress.payload_check = PayloadCheck(self._payload_parts(req, payload))
        timer = DeviceTimer(self.kv.device)
        try:
            self.codec.decode_into(payload, req.block_ids, req.skip_blocks)
        except ValueError as e:
            raise TransferFault(f"transfer {req.transfer_id}: {e}") from None
        req.progress.codec_ms = timer.stop()

    def _unequal_degrees(self) -> bool:
        return self.place is not None and self.place.prefill_tp != self.place.decode_tp

    def _payload_parts(self, req: TransferRequest, payload: torch.Tensor):
        """What a lossy receiver checksums: the payload as it arrived, or between engines of
        different TP degrees each prefill worker's part of it, by that worker's rank (as the
        sender checksums what each decode worker should get: _payload_shares)."""
        if not self._unequal_degrees():
            return payload
        joined = next((m.meta["parts"] for m in req.progress.received if m.payload is payload and "parts" in m.meta),
                      [payload])
        return {str(s.prefill_rank): part for s, part in zip(self.place.my_shares(), joined, strict=True)}

    def _payload_shares(self) -> list[tuple[str, range]] | None:
        """Between engines of different TP degrees, each decode worker this prefill worker sends to
        (its rank) and the heads it takes, of this worker's; None: one payload, whole."""
        if not self._unequal_degrees():
            return None
        first = self.place.heads.start
        return [(str(s.decode_rank), range(s.heads.start - first, s.heads.stop - first))
                for s in self.place.my_shares()]

    def collect(self, req: TransferRequest, index: int | None = None) -> list[Message]:
        msgs = self.channel.wait(req.transfer_id, index)
        req.progress.received.extend(msgs)
        for m in msgs:
            problem = check_message(m)
            if problem is not None:
                raise TransferFault(f"transfer {req.transfer_id} message {m.index + 1} of {m.count}: {problem}")
        return msgs

    def fail_receive(self, req: TransferRequest, reason: str) -> None:
        """A transfer caught broken: its messages are dropped, its blocks reported to vLLM as
        failed loads (its kv_load_failure_policy fails or recomputes the request), its record
        says why."""
        self._sync()  # nothing queued still reads its messages (the payload's checksum)
        self.channel.release(req.transfer_id)
        self.parking.fail_blocks(req.written_block_ids)
        self._record(req, "receive", error=reason, t_admitted=req.progress.t_admitted)

    def end_receive(self, req: TransferRequest) -> None:
        if req.asked.corrupt:
            corrupt_received(self.kv, req)
        self._sync()
        t_end = time.monotonic()
        self.channel.release(req.transfer_id)
        self._record_received(req, req.progress.received, req.progress.clock, t_end)

    def _record_received(self, req: TransferRequest, msgs: list[Message], t_start: float, t_end: float,
                         **times) -> None:
        sent_at = msgs[0].meta.get("t0", t_start) if msgs else t_start
        delivered = max((m.delivered for m in msgs), default=t_start)
        arrived = max((m.arrived for m in msgs), default=t_start)
        wire = [m.meta.get("wire", (1, m.payload.numel())) for m in msgs]  # joined messages (head_shards.py): parts
        req.progress.messages, req.progress.bytes = sum(n for n, _ in wire), sum(b for _, b in wire)
        self._record(req, "receive",
                     transfer_ms=(delivered - sent_at) * 1e3,  # sender starts gathering -> last byte in our memory
                     notify_ms=(arrived - delivered) * 1e3,  # -> this worker has been told (doorbell latency)
                     load_ms=(t_end - t_start) * 1e3,  # decode step blocked on KV (wait + scatter)
                     ready_ms=(t_end - sent_at) * 1e3,  # sender starts -> KV in this engine's blocks
                     t_admitted=req.progress.t_admitted, t_arrived=arrived, t_load_start=t_start, t_kv_ready=t_end,
                     **times)

    # ---------------------------------------------------------------- both
    def _sync(self) -> None:
        if self.kv.device.type == "cuda":
            torch.cuda.synchronize(self.kv.device)

    def transfer_block_ids(self, req: TransferRequest) -> list[int]:
        """The blocks whose digests judge a transfer: on the prefill side every block sent, on
        the decode side the blocks the transfer wrote (past the engine's own prefix-cache
        hits). A cached block is not the transfer's: the decode engine may have computed part
        of it itself (the last prompt token of an earlier request that ended on the block's
        last slot), and on a GPU its bits differ from the prefill's in the last place. The
        harness compares the sender's digests past the receiver's skip_blocks
        (records.digests_agree)."""
        return list(req.block_ids if self.is_producer else req.written_block_ids)

    def _record(self, req: TransferRequest, side: str, **times) -> None:
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
            kv_cache_bytes=self.kv.cache_bytes(), bytes=req.progress.bytes, messages=req.progress.messages, **times)
        self.tally.add(record)
        if writer is None:
            return
        if side == "send" or "t_decode_scheduled" in times:
            self.records.put(writer, record, pending)
        elif req.req_id in self._scheduled_at or "error" in times:
            self._write_receive(writer, record, pending, req.req_id)
        else:  # parked: written when vLLM schedules its first decode step
            self._unwritten[req.req_id] = (writer, record, pending)

    def _write_receive(self, writer: TransferRecordWriter, record: TransferRecord, pending: list,
                       req_id: str) -> None:
        record.t_decode_scheduled = self._scheduled_at.pop(req_id, None)
        self.records.put(writer, record, pending)

    def held(self) -> dict:
        """What this worker still holds once every request has ended (all 0 unless something
        leaked): prefill, staging regions of the receiver's buffer; decode, transfers whose
        messages wait in its inbox and requests parked for KV."""
        self.records.flush()  # every transfer so far in its file before the harness reads on
        if self.channel is None:
            return {}
        if self.is_producer:
            return {"staging_regions": self.channel.held()}
        return {"transfers": self.channel.inbox.held(), "parked": self.parking.count()}

    def close(self) -> None:
        self.records.flush()
        if self.channel is not None:
            self.channel.close()
