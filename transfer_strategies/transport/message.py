"""What the decode worker receives: one message of a transfer, its payload as flat bytes."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Message:
    transfer_id: str
    index: int
    count: int
    payload: torch.Tensor  # flat uint8; the receiver views it back as the dtype and shape it expects
    meta: dict  # the sender's keyword arguments
    delivered: float  # time.monotonic() when the whole payload was in memory the receiver reads
    arrived: float  # time.monotonic() when the receiver thread had the message (>= delivered)


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    """A flat uint8 view of a contiguous tensor (no copy)."""
    return t.contiguous().view(-1).view(torch.uint8)
