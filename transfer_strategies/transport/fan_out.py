"""A prefill worker that sends to several decode instances (1P2D, 2P2D, serving mode): one
channel per decode instance, in the order the router lists them, and each request's KV goes to
the one the router chose for its decode half (kv_transfer_params' peer, kv_transfer_params.py).

A push sender builds a payload in its receiver's staging buffer before it sends it, so the
request must be known before the space is: the worker points the fan-out at a request's peer
(`to`, which returns that channel) before the strategy allocates for it (prepare_send,
begin_send) and sends each message on the channel `to` returned. A payload built in one decode
instance's space and sent to another is refused (send_side.py): it would leave a region taken in the
first one's buffer for good."""

from __future__ import annotations

import torch


class FanOut:
    def __init__(self, senders: list):
        self.senders = senders
        self.peer = 0  # whose space alloc() hands out

    def to(self, peer: int):
        """The channel to decode instance `peer`, from now on also the one alloc() takes space from."""
        self.peer = peer
        return self.senders[peer]

    def alloc(self, nbytes: int) -> torch.Tensor:
        return self.senders[self.peer].alloc(nbytes)

    def owns(self, payload: torch.Tensor) -> bool:
        return any(s.owns(payload) for s in self.senders)

    def discard(self, payload: torch.Tensor) -> None:
        for s in self.senders:
            s.discard(payload)  # only its owner's region is given back

    def flush(self) -> None:
        for s in self.senders:
            s.flush()

    def held(self) -> int:
        return sum(s.held() for s in self.senders)

    def close(self) -> None:
        for s in self.senders:
            s.close()
