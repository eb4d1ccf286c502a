"""Worker side of a connector: it runs in vLLM's model worker and owns the engine's KV blocks and
the channel to the other engine, opened with the layout handshake (both engines must agree on
the KV's shape before the first request). The work around each transfer is split by role: the
connector facade (`base.py`) calls its engine's side directly, and both sides record through the
recorder:

    send_side.py     prefill: payload space, routing, posting messages, the send's clock
    receive_side.py  decode: each step's parked, drained, cancelled and expired requests,
                     collecting, decoding a lossy payload, the end of each receive, loaded or failed
    recorder.py      both: each transfer's record, its digests and checks, written off the step

A worker has the send side or the receive side (`register`, once the channel is open) and the
recorder (`attach`, once its KV cache is known).
"""

from __future__ import annotations

import itertools

import torch

from transfer_strategies.codecs import Codec
from transfer_strategies.connector_config import HarnessSettings, TransportSettings
from transfer_strategies.connector_stats import Tally
from transfer_strategies.head_shards import open_sharded, use_codec
from transfer_strategies.kv_blocks import KVBlocks
from transfer_strategies.receive_side import ReceiveSide
from transfer_strategies.recorder import TransferRecorder
from transfer_strategies.records import RecordWriters, rank_path
from transfer_strategies.relay import Relay, open_relay, open_relayed
from transfer_strategies.send_side import SendSide
from transfer_strategies.tp import Placement, Share
from transfer_strategies.transport import open_channel

LAYOUT_ID = "__layout__"


class TransferWorker:
    def __init__(self, strategy: str, is_producer: bool, harness: HarnessSettings | None = None,
                 transport: TransportSettings | None = None):
        """harness: what the harness sets; transport: the channel's settings (connector_config.py;
        their defaults where None)."""
        self.strategy = strategy
        self.is_producer = is_producer
        self.harness = harness or HarnessSettings()
        self.transport = transport or TransportSettings()
        self.tally = Tally()  # what this worker recorded, for vLLM's /metrics (connector_stats.py)
        self.kv: KVBlocks | None = None
        self.place: Placement | None = None
        self.channel = None
        self.codec: Codec | None = None  # a lossy strategy's, bound to this engine's layout (base.py)
        self.recorder: TransferRecorder | None = None  # attach
        self.send_side: SendSide | None = None  # register, prefill
        self.receive_side: ReceiveSide | None = None  # register, decode
        self.relay: Relay | None = None  # register, decode worker 0 of an MLA engine of several (relay.py)

    def register(self, kv_caches: dict[str, torch.Tensor], num_blocks: int, block_size: int,
                 place: Placement | None = None) -> None:
        """place: this worker's rank and both engines' tensor-parallel degrees (None: one worker
        each side, every head here)."""
        self.attach(kv_caches, num_blocks, place)
        h = self.harness
        layout = dict(self.kv.layout(), block_size=block_size)
        opening = {"device": self.kv.device, "transport": self.transport, "host": h.host,
                   "timeout_s": h.timeout_s, "open_timeout_s": h.startup_timeout_s}
        role = "sender" if self.is_producer else "receiver"
        if place is None or place.single:
            # rendezvous: a list on a decode worker fed by several prefill workers (serving mode)
            self.channel = open_channel(role, rendezvous=h.rendezvous, **opening,
                                        on_open=lambda channel: self._exchange_layout(channel, layout))
        elif place.relays and place.rank > 0:  # the latent comes from decode worker 0 (relay.py)
            self.channel = open_relayed(place, h.rendezvous, opening,
                                        on_open=lambda channel: self._exchange_layout(channel, layout))
        else:
            # each channel's handshake in the order they open (per instance)
            shares = itertools.cycle(place.my_shares())
            self.channel = open_sharded(place, self.kv, h.rendezvous, opening,
                                        on_open=lambda channel: self._exchange_layout(channel, layout, next(shares)))
            if place.relays:  # decode worker 0: what arrives goes on to the engine's other workers
                self.relay = open_relay(place, h.rendezvous, opening,
                                        on_open=lambda channel: self._exchange_layout(channel, layout, sending=True))
                self.channel.inbox.forward = self.relay.forward
        if self.is_producer:
            self.send_side = SendSide(self.kv, self.channel, self.recorder, h.checksums, h.timeout_s)
        else:
            self.receive_side = ReceiveSide(self.kv, self.channel, self.recorder, h.verify, h.timeout_s)

    def use_codec(self, codec: Codec) -> None:
        """A lossy strategy's codec, bound to this engine's layout; between engines of different
        tensor-parallel degrees the channel cuts and joins its payloads by head with it. Each part
        that uses it holds it."""
        self.codec = self.recorder.codec = codec
        if self.receive_side is not None:
            self.receive_side.codec = codec
        use_codec(self.channel, codec)

    def attach(self, kv_caches: dict[str, torch.Tensor], num_blocks: int, place: Placement | None = None) -> None:
        """This engine's KV cache and records, before any channel opens."""
        self.place = place
        rank = 0 if place is None else place.rank
        self.kv = KVBlocks(kv_caches, num_blocks, None if place is None or place.one_head else len(place.heads))
        self.recorder = TransferRecorder(self.strategy, self.is_producer, self.harness.verify, self.kv, place,
                                         RecordWriters(self.harness.stats_path, lambda path: rank_path(path, rank)),
                                         self.tally)

    def _exchange_layout(self, channel, mine: dict, share: Share | None = None, sending: bool | None = None) -> None:
        """Both engines must agree on layers, per-block shape, dtype and block size (not on
        num_blocks) before the first request; under tensor parallelism each channel's two
        workers on their ranks and degrees too, and the block shape may differ in its head count.
        sending: this worker sends its layout (default: a prefill worker; decode worker 0 on
        its relay channels, relay.py)."""
        place = self.place
        sending = self.is_producer if sending is None else sending
        if place is not None and not place.single:
            mine = dict(mine, prefill_tp=place.prefill_tp, decode_tp=place.decode_tp)
            if self.is_producer:
                mine["prefill_rank"] = place.rank
        if sending:
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

    def held(self) -> dict:
        """What this worker still holds once every request has ended (all 0 unless something
        leaked): prefill, staging regions of the receiver's buffer; decode, transfers whose
        messages wait in its inbox and requests parked for KV."""
        if self.recorder is not None:
            self.recorder.flush()  # every transfer so far in its file before the harness reads on
        if self.channel is None:
            return {}
        if self.is_producer:
            return {"staging_regions": self.channel.held()}
        held = {"transfers": self.channel.inbox.held(), "parked": self.receive_side.parking.count()}
        if self.relay is not None:
            held["relay_regions"] = self.relay.held()
        return held

    def close(self) -> None:
        if self.recorder is not None:
            self.recorder.flush()
        if self.relay is not None:
            self.relay.close()
        if self.channel is not None:
            self.channel.close()
