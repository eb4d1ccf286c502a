"""The prefill worker's side of every transfer: the space a strategy builds its payloads in, the
channel each request's KV leaves by (with several decode instances, the one it names), each
message posted with its header (and a scenario's fault: damaged, dropped or held back), and the
send's clock (clock.py), from its start to every doorbell rung, for its record (recorder.py).
"""

from __future__ import annotations

import threading
import time

import torch

from transfer_strategies.clock import SendClock
from transfer_strategies.faults import WITHHELD, damage, header
from transfer_strategies.head_shards import ShardedSender
from transfer_strategies.kv_blocks import KVBlocks
from transfer_strategies.kv_transfer_params import PEER
from transfer_strategies.recorder import TransferRecorder, sync
from transfer_strategies.scheduler import TransferRequest
from transfer_strategies.transport.fan_out import FanOut


class SendSide:
    def __init__(self, kv: KVBlocks, channel, recorder: TransferRecorder, checksums: bool, timeout_s: float):
        """channel: the sender (transport/); checksums: each message's payload checksum in its
        header; timeout_s: the decode worker's, which a late message's default delay passes."""
        self.kv, self.channel, self.recorder = kv, channel, recorder
        self.checksums, self.timeout_s = checksums, timeout_s
        # sends to no decode worker: every worker of a TP prefill engine holds all of MLA's latent,
        # and only the first sends it (tp.shares), so it crosses once
        senders = channel.senders if isinstance(channel, FanOut) else [channel]
        self.silent = all(isinstance(one, ShardedSender) and not one.targets for one in senders)

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
                self.recorder.record(req, "send", error=f"this prefill instance sends to {n} decode instances and "
                                                        f"transfer {req.transfer_id} names none of them "
                                                        f"(kv_transfer_params {PEER!r}: {peer!r})",
                                     t_admitted=req.progress.t_admitted)
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
        sync(self.kv.device)
        # nothing of this request written (dropped or withheld by a fault, or nothing to send): the
        # channel's last event is an earlier transfer's (on the H200 it gave drops -72 ms)
        gpu_ms = req.progress.clock.gpu_ms(channel.last_written) if req.progress.bytes else None
        send_ms = req.progress.clock.host_ms()
        self.recorder.record(req, "send", send_ms=send_ms, gpu_ms=gpu_ms,
                             hook_ms=req.progress.hook_ms if req.progress.clock.streaming else None,
                             t_admitted=req.progress.t_admitted, t_forward_done=t_forward_done, t_sent=t_sent)
