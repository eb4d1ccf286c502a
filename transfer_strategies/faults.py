"""Transport faults a scenario injects on purpose (conf/scenario/fault_*.yaml), and the checks
by which a decode worker catches a message that arrived broken.

The prefill worker injects one into each transfer whose prefill request asks for it
(kv_transfer_params' fault: the harness picks every `every`-th prompt, harness/offline/deployment.py):
    drop      no message of the transfer is sent (its staging space is given back)
    delay     every message is sent delay_s late (default: the transfer timeout + 2 s)
    truncate  the last message carries half its payload
    flip      one bit of the last message's payload is flipped after its checksum was taken
The decode worker catches drop and delay at run.transfer_timeout_s (as any late KV), truncate by
the length the sender put in the message's header, and flip by the payload's checksum there
(check.checksums, off by default: it reads the payload once more on each side). A caught
transfer's blocks are reported to vLLM as failed loads, so its kv_load_failure_policy decides:
fail the request, or recompute it. The send record names the fault, so the harness can tell a
fault caught from one missed.
"""

from __future__ import annotations

import torch

from transfer_strategies.kv_transfer_params import FAULT_KINDS
from transfer_strategies.transport.message import Message, as_bytes

KINDS = FAULT_KINDS
WITHHELD = ("drop", "delay")  # faults that keep the messages from leaving on time


class TransferFault(RuntimeError):
    """A transfer that arrived broken: its blocks are reported to vLLM as failed loads."""


def damage(fault: str | None, payload: torch.Tensor, index: int, count: int, own_copy: bool) -> torch.Tensor:
    """The payload as the fault sends it (its header already describes the intact one).
    own_copy: the payload is the sender's copy (built in the channel's send space), not its
    KV cache (full_cache posts the cache's own tensors), so a bit may be flipped in place."""
    if index != count - 1 or fault not in ("truncate", "flip"):
        return payload
    data = as_bytes(payload)
    if fault == "truncate":
        return data[: data.numel() // 2]
    if data.numel():
        data = data if own_copy else data.clone()
        data[data.numel() // 2] ^= 0x10
    return data


def header(payload: torch.Tensor, checksums: bool) -> dict:
    """What a message's header says about its payload, for the receiver to check."""
    out = {"nbytes": payload.numel() * payload.element_size()}  # no copy, whatever its layout
    if checksums:
        out["checksum"] = payload_checksum(payload)
    return out


def check_message(msg: Message) -> str | None:
    """Why a message's payload is not what its sender sent (None: nothing found)."""
    if msg.meta.get("damage"):  # found in a part before the parts were joined (head_shards.py)
        return msg.meta["damage"]
    nbytes = msg.meta.get("nbytes")
    got = msg.payload.numel()
    if nbytes is not None and got != nbytes:
        return f"truncated: {got} of {nbytes} bytes"
    want = msg.meta.get("checksum")
    if want is not None and payload_checksum(msg.payload) != want:
        return "payload checksum differs from the sender's"
    return None


def payload_checksum(data: torch.Tensor) -> str:
    """64-bit checksum of flat bytes, as 16 hex digits (`payload_sum`)."""
    return checksum_hex(int(payload_sum(data)))


def checksum_hex(total: int) -> str:
    return format(total & (2**64 - 1), "016x")


def payload_sum(data: torch.Tensor, chunk: int = 1 << 24) -> torch.Tensor:
    """The checksum of flat bytes as a 0-dim int64 tensor on their device, queued there: int32
    words times odd position weights, summed in int64 (the per-block digests' scheme,
    digests.py), the odd tail bytes added as they are. On CUDA one kernel reads the words once
    (digest_kernel.py); elsewhere torch, a chunk at a time."""
    data = as_bytes(data)
    n = data.numel() // 4
    total = torch.zeros((), dtype=torch.int64, device=data.device)
    words = data[: 4 * n].view(torch.int32)
    if data.is_cuda:
        from transfer_strategies.digest_kernel import weighted_word_sum
        weighted_word_sum(words, total)
    else:
        for start in range(0, n, chunk):
            w = words[start:start + chunk].to(torch.int64)
            i = torch.arange(start, start + w.numel(), dtype=torch.int64, device=data.device)
            total += (w * (((i * 2654435761 + 40503) % (2**31)) | 1)).sum()
    total += data[4 * n:].to(torch.int64).sum()
    return total
