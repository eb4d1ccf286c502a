"""What a lossy strategy's two sides check (codecs.py), queued on the device's stream and read
back off the engine's step, as the digests are (digests.py: records.RecordQueue's thread
waits for them and writes the record).

The sender checks what it should have sent, from its blocks in the step that sent them (no
forward pass has written them since; the payload itself belongs to the receiver now, and a
fault may have damaged it): the payload's checksum, the digests of the blocks the receiver
should reconstruct, and the reconstruction's error against the original, per layer. The
receiver checksums the payload as it arrived. A value or scale changed on the way changes the
receiver's checksum or its digests: records.digests_agree fails the transfer.

On CUDA the sender's check is one kernel over its blocks (codec_kernel.py's `_check`: the
compression's arithmetic, the checksum, the reconstruction's digests and error, nothing stored)
and the receiver's one pass over the payload (digest_kernel.py): at 8k tokens of the
Llama-3-8B shape on an H200 the torch path (compress again, reconstruct, the error in float32,
digest the reconstruction, wait for all of it) held the prefill's token 34-49 ms and the
receiver's scatter 13 ms (results/gpu/2026-12-04-s22/ttft). Elsewhere torch computes them at once.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from transfer_strategies.clock import DeviceTimer
from transfer_strategies.codecs import Codec, device_ids, reconstruction_error
from transfer_strategies.digests import BlockDigests, PendingDigests
from transfer_strategies.faults import checksum_hex, payload_sum


class Readback:
    """Device tensors copied into pinned host memory without waiting (`get` waits for them); on
    a CPU the tensors themselves."""

    def __init__(self, **tensors: torch.Tensor):
        self.event = None
        self.host = {}
        for name, t in tensors.items():
            if t.is_cuda:
                self.host[name] = torch.empty(t.shape, dtype=t.dtype, pin_memory=True).copy_(t, non_blocking=True)
                self.event = torch.cuda.Event()
            else:
                self.host[name] = t
        if self.event is not None:
            self.event.record()

    def get(self) -> dict[str, torch.Tensor]:
        if self.event is not None:
            self.event.synchronize()  # releases the GIL: the engine's thread runs meanwhile
        return self.host


class PayloadCheck:
    """The receiver's checksum of a payload as it arrived, queued on its device; of each part
    (by the prefill worker's rank) where several prefill workers' parts joined into it."""

    def __init__(self, payload: torch.Tensor | dict[str, torch.Tensor]):
        self.keys = list(payload) if isinstance(payload, dict) else None
        parts = list(payload.values()) if isinstance(payload, dict) else [payload]
        self._sums = Readback(total=torch.stack([payload_sum(p) for p in parts]) if parts else torch.zeros(0))

    def fill(self, record) -> None:
        sums = [checksum_hex(int(v)) for v in self._sums.get()["total"].tolist()]
        record.payload_digest = sums[0] if self.keys is None else dict(zip(self.keys, sums, strict=True))


class SendCheck:
    """A lossy sender's check of blocks `block_ids` (the module's docstring), launched now.
    shares: between engines of different TP degrees, (decode worker's rank, this worker's heads it
    takes) of each part the payload was cut into (head_shards.py): the checksum of each part,
    by that rank. The kernel checksums a whole payload only: such a check runs on torch."""

    def __init__(self, codec: Codec, digests: BlockDigests, block_ids: Sequence[int],
                 shares: list[tuple[str, range]] | None = None):
        kv = codec.kv
        self.n_values = kv.nbytes(len(block_ids), 1) // kv.dtype.itemsize  # per layer
        self.empty = not block_ids
        timer = DeviceTimer(kv.device)
        kernel = codec.kernel if shares is None else None
        got = kernel.check(device_ids(block_ids, kv.device)) if kernel is not None else None
        if got is None:  # torch: compress again, reconstruct, compare, digest the reconstruction
            n = len(block_ids)
            original = kv.gather(block_ids, torch.empty(kv.n_layers, *kv.layer_shape(n), dtype=kv.dtype,
                                                        device=kv.device), range(kv.n_layers))
            payload = codec.encode_plan(block_ids, torch.empty(codec.nbytes(kv.n_layers, n), dtype=torch.uint8,
                                                               device=kv.device))()
            reconstructed = codec.decode(payload, kv.n_layers, n)
            self.error = reconstruction_error(original, reconstructed)
            if shares is None:
                self.payload_digest = checksum_hex(int(payload_sum(payload)))
            else:
                self.payload_digest = {rank: checksum_hex(int(payload_sum(codec.cut(payload, heads))))
                                       for rank, heads in shares}
            self.digests, self._stats = digests.launch(block_ids, reconstructed), None
            return
        cols = got["digests"].t().contiguous()  # [heads, blocks], as BlockDigests.launch leaves them
        self._stats = Readback(total=got["payload_sums"].sum(), error_max=got["error_max"], error_sum=got["error_sum"],
                               digests=cols)
        self.digests = PendingDigests(digests.keys, self._stats.host["digests"], timer.stop())

    def fill(self, record) -> None:
        record.digests = self.digests.result()
        record.digest_ms = self.digests.ms  # the whole check's: one kernel
        if self._stats is not None:
            host = self._stats.get()
            self.payload_digest = checksum_hex(int(host["total"]))
            self.error = None if self.empty else _error(host["error_max"], host["error_sum"], self.n_values)
        record.payload_digest, record.codec_error = self.payload_digest, self.error


def _error(largest: torch.Tensor, sums: torch.Tensor, n: int) -> dict[str, list[float]]:
    """codecs.reconstruction_error's figures from the kernel's per-layer [error, magnitude]
    largest values and sums over n values each."""
    out = {"max_abs": [], "mean_abs": [], "max_rel": [], "mean_rel": []}
    for (e_max, m_max), (e_sum, m_sum) in zip(largest.tolist(), sums.tolist()):
        out["max_abs"].append(e_max)
        out["mean_abs"].append(e_sum / n)
        out["max_rel"].append(e_max / m_max if m_max > 0 else 0.0)
        out["mean_rel"].append(e_sum / m_sum if m_sum > 0 else 0.0)
    return out
