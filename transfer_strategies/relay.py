"""MLA's latent into a decode engine of several tensor-parallel workers, crossing the link once.

Every worker of an MLA engine holds the whole latent (vLLM counts it as one KV head: tp.py), so
the prefill engine sends it to decode worker 0 alone, and worker 0 relays each message, as it
arrives, to the engine's other workers over staged channels of their own (shared memory on CPU,
CUDA IPC on a GPU: the workers of one engine share a host). Those read their channel as they
would a prefill worker's, so a strategy sees no difference. Each relayed message costs one copy
into the other worker's staging buffer, on worker 0's receiver thread before worker 0's engine
can take it (once taken, its staging space may carry the next payload); the other worker's
receive record shows it (`relayed_bytes`, its link `bytes` and `messages` 0), and its
`transfer_ms` runs from the prefill worker's start to the relayed copy in its memory.

    relay = open_relay(place, rendezvous, opening, on_open)  # decode worker 0, its link open
    channel.inbox.forward = relay.forward
    open_relayed(place, rendezvous, opening, on_open)        # decode workers 1.., their channel
"""

from __future__ import annotations

import threading

from transfer_strategies.connector_config import TransportSettings
from transfer_strategies.tp import Placement
from transfer_strategies.transport import Message, open_channel


def _relay_opening(opening: dict) -> dict:
    """The link's opening settings for a relay channel: staged, on this host."""
    link = opening.get("transport") or TransportSettings()
    return dict(opening, transport=TransportSettings(kind="staged", staging_mb=link.staging_mb), host="127.0.0.1")


def _base(rendezvous: str | list[str]) -> str:
    """The link's rendezvous the relay's are named after (serving mode: the first instance's)."""
    return rendezvous if isinstance(rendezvous, str) else rendezvous[0]


class Relay:
    """Decode worker 0's channels to the engine's other workers."""

    def __init__(self, senders: list):
        self.senders = senders
        self._lock = threading.Lock()  # a fan-in's receiver threads (serving mode) forward one at a time

    def forward(self, msg: Message) -> None:
        """Each message as it arrives, on the receiver thread, before worker 0's engine can take it."""
        meta = dict(msg.meta, wire=(0, 0), relayed=msg.payload.numel())
        with self._lock:
            for sender in self.senders:
                sender.send(msg.transfer_id, msg.index, msg.count, msg.payload, **meta)

    def held(self) -> int:
        """Regions of the other workers' staging buffers still taken (0 once they released all)."""
        return sum(sender.held() for sender in self.senders)

    def close(self) -> None:
        for sender in self.senders:
            sender.close()


def open_relay(place: Placement, rendezvous: str | list[str], opening: dict, on_open) -> Relay:
    """Decode worker 0's relay to workers 1..decode_tp-1; on_open(channel) as each opens (the
    layout handshake, this worker in the prefill worker's place)."""
    senders = []
    try:
        for q in range(1, place.decode_tp):
            senders.append(open_channel("sender", rendezvous=place.relay_rendezvous(_base(rendezvous), q),
                                        on_open=on_open, **_relay_opening(opening)))
    except BaseException:
        for sender in senders:
            sender.close()
        raise
    return Relay(senders)


def open_relayed(place: Placement, rendezvous: str | list[str], opening: dict, on_open):
    """Decode worker q > 0's channel: the receiving end of worker 0's relay to it."""
    return open_channel("receiver", rendezvous=place.relay_rendezvous(_base(rendezvous), place.rank),
                        on_open=on_open, **_relay_opening(opening))
