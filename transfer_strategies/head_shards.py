"""Channels between engines of different tensor-parallel degrees (tp.py says who sends which KV
heads to whom). A strategy posts and collects as with one channel; these two wrap the real ones.

ShardedSender, on a prefill worker with other than exactly one decode peer taking all its heads:
a payload in the KV dtype (blocks, as `gather` builds them, or whole layers) is cut by head and
each decode peer gets its heads; so is a lossy strategy's compressed payload (`codec`: no scale
spans two heads, codecs.py), each part the payload its heads alone would give; any other payload
(full_cache's block ids, a payload a fault cut short) goes whole to each.
Cutting costs one copy per peer, into that peer's staging space: a push sender builds its
payload before it knows the peers' shares, so the zero-copy path (gather straight into the one
receiver's buffer) is kept for the one-peer case.

HeadJoinReceiver, on a decode worker fed by several prefill workers: their messages come into one
inbox (fan_in.py); each prefill worker numbers its messages after the ones of the workers before
it (slot * count + index), and a collected message is the parts joined along the head axis, in
head order (one copy on the decode side); a lossy strategy's parts join into one compressed
payload of the worker's heads (`codec`), the parts kept in its meta for their checksums.
"""

from __future__ import annotations

import torch

from transfer_strategies.faults import check_message, payload_checksum
from transfer_strategies.kv_blocks import KVBlocks
from transfer_strategies.tp import Placement
from transfer_strategies.transport import Message, as_bytes, open_channel
from transfer_strategies.transport.fan_out import FanOut


def open_sharded(place: Placement, kv: KVBlocks, rendezvous: str | list[str], opening: dict, on_open):
    """This worker's channels to the other engine's workers it shares heads with (tp.py), as one
    channel; on_open(channel) runs as each opens, in the order of place.my_shares() (again for
    each instance). rendezvous: one base, or (serving mode, several instances on the other side)
    one per instance: a prefill worker then sends through a FanOut of a ShardedSender per decode
    instance, a decode worker takes every prefill instance's parts into one inbox (a request's
    parts all come from the one instance that prefilled it). Each worker opens its channels by
    instance, then by share, so every channel opens in one order everywhere (_senders)."""
    if place.prefill_tp != place.decode_tp and not place.one_head and not kv.head_dim_certain:
        raise RuntimeError(f"cannot tell the KV head axis in this engine's KV shape {kv.layer_shape(-1)} "
                           f"({kv.n_heads} heads): prefill TP {place.prefill_tp} and decode TP {place.decode_tp} "
                           f"need it; use equal TP degrees or another block size")
    bases = [rendezvous] if isinstance(rendezvous, str) else list(rendezvous)
    shares = place.my_shares()
    if place.is_producer:
        first = place.heads.start
        opened = []  # (channel, its heads, slot, slots) per instance's share
        try:
            for base in bases:
                for s in shares:
                    channel = open_channel("sender", rendezvous=place.rendezvous(base, s), **opening, on_open=on_open)
                    opened.append((channel, range(s.heads.start - first, s.heads.stop - first), *place.slot(s)))
        except BaseException:
            for channel, *_ in opened:
                channel.close()
            raise
        per = len(shares)
        senders = [ShardedSender(kv, opened[i * per:(i + 1) * per]) for i in range(len(bases))]
        return senders[0] if len(senders) == 1 else FanOut(senders)
    paths = [place.rendezvous(base, s) for base in bases for s in shares]
    channel = open_channel("receiver", rendezvous=paths if len(paths) > 1 else paths[0], **opening, on_open=on_open)
    return channel if len(shares) == 1 else HeadJoinReceiver(kv, channel, len(shares))


def use_codec(channel, codec) -> None:
    """A lossy strategy's codec, to every ShardedSender or HeadJoinReceiver `channel` is or holds
    (a FanOut of them: one per decode instance), which cut and join its payloads by head."""
    for one in channel.senders if isinstance(channel, FanOut) else [channel]:
        if isinstance(one, (ShardedSender, HeadJoinReceiver)):
            one.codec = codec


class ShardedSender:
    def __init__(self, kv: KVBlocks, targets: list[tuple[object, range, int, int]]):
        """targets: (channel, local heads it takes, slot, slots) per decode peer."""
        self.kv, self.targets = kv, targets
        self.whole = len(targets) == 1 and len(targets[0][1]) == kv.n_heads  # no cutting: build in place
        self.codec = None  # a lossy strategy's (worker.use_codec): its payloads are cut by head too
        self.last_written = None

    @property
    def _one(self):
        return self.targets[0][0]

    def alloc(self, nbytes: int) -> torch.Tensor:
        if self.whole:
            return self._one.alloc(nbytes)
        return torch.empty(nbytes, dtype=torch.uint8, device=self.kv.device)

    def owns(self, payload: torch.Tensor) -> bool:
        return self.whole and self._one.owns(payload)

    def discard(self, payload: torch.Tensor) -> None:
        if self.whole:
            self._one.discard(payload)

    def send(self, transfer_id: str, index: int, count: int, payload: torch.Tensor, background: bool = False,
             **meta) -> int:
        sent = 0
        kv = payload.dtype == self.kv.dtype  # blocks: each peer takes its heads
        size = payload.numel() * payload.element_size()
        # blocks of a compressed payload as its header describes it (a fault may have cut it short: then whole)
        n = self.codec.blocks_in(size, self.kv.n_heads) if self.codec is not None and meta.get("nbytes") == size \
            else None
        codec = n is not None
        rows = self.kv.per_head(payload) if kv and not self.whole and not codec else None
        for channel, heads, slot, slots in self.targets:
            # heads: for the joining side
            part, part_meta = payload, dict(meta, heads=len(heads)) if kv or codec else meta
            if rows is not None:
                mine = rows[:, heads.start:heads.stop]
                part = self.kv.typed(channel.alloc(mine.numel() * mine.element_size())).view(mine.shape).copy_(mine)
            elif codec and not self.whole:
                part = self.codec.cut(payload, heads, out=channel.alloc(self.codec.head_nbytes(n, len(heads))))
            if part is not payload:
                part_meta["nbytes"] = part.numel() * part.element_size()
                if "checksum" in meta:
                    part_meta["checksum"] = payload_checksum(as_bytes(part))
            sent += channel.send(transfer_id, slot * count + index, slots * count, part, background=background,
                                 **part_meta)
            self.last_written = channel.last_written
        return sent

    def flush(self) -> None:
        for channel, *_ in self.targets:
            channel.flush()

    def held(self) -> int:
        return sum(channel.held() for channel, *_ in self.targets)

    def close(self) -> None:
        for channel, *_ in self.targets:
            channel.close()


class HeadJoinReceiver:
    def __init__(self, kv: KVBlocks, channel, slots: int):
        """channel: the fan-in of the `slots` prefill workers' channels, in head order."""
        self.kv, self.channel, self.slots = kv, channel, slots
        self.codec = None  # a lossy strategy's (worker.use_codec): parts join as compressed payloads
        self.inbox = channel.inbox

    def wait(self, transfer_id: str, index: int | None = None) -> list[Message]:
        if index is None:
            msgs = self.channel.wait(transfer_id)
            count = len(msgs) // self.slots
            return [self._join([msgs[s * count + i] for s in range(self.slots)]) for i in range(count)]
        (first,) = self.channel.wait(transfer_id, index)
        count = first.count // self.slots
        return [self._join([first] + [self.channel.wait(transfer_id, s * count + index)[0]
                                      for s in range(1, self.slots)])]

    def _join(self, parts: list[Message]) -> Message:
        first = parts[0]
        meta = {k: v for k, v in first.meta.items() if k not in ("heads", "checksum")}
        damage = next(filter(None, map(check_message, parts)), None)
        if damage:  # joined, a part's truncation or bit flip would not show: the strategy sees it here
            meta["damage"] = damage
        if "heads" not in first.meta or damage:  # whole to every decode worker: any copy will do
            payload = first.payload
        elif self.codec is not None:
            payload = self.codec.join([(m.payload, m.meta["heads"]) for m in parts])
            meta["parts"] = [m.payload for m in parts]  # as they arrived: the receiver checksums each
        else:
            inner = self.kv.head_inner()
            payload = as_bytes(torch.cat([self.kv.typed(m.payload).view(-1, m.meta["heads"], inner) for m in parts],
                                         dim=1))
        meta["nbytes"] = payload.numel()
        # what came over the wire, for the record: every part, a whole payload once per prefill worker
        meta["wire"] = (len(parts), sum(m.payload.numel() for m in parts))
        return Message(first.transfer_id, first.index % (first.count // self.slots), first.count // self.slots,
                       payload, meta, max(m.delivered for m in parts), max(m.arrived for m in parts))

    def ready(self, transfer_ids: set[str], timeout_s: float = 0.0) -> set[str]:
        return self.channel.ready(transfer_ids, timeout_s)

    def when_complete(self, transfer_id: str, fn) -> None:
        self.channel.when_complete(transfer_id, fn)

    def release(self, transfer_id: str) -> None:
        self.channel.release(transfer_id)

    def close(self) -> None:
        self.channel.close()
