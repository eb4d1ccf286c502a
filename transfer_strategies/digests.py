"""Per-block, per-head digests: how both engines check, bit for bit, that a request's KV arrived.

Each side computes one 64-bit checksum per block and KV head straight from its own KV cache
(never through a strategy's copy code), over that head's bytes of the block in every layer: the
bytes read as signed 32-bit words, each times an odd weight below 2^31 that depends on its
position within the head's share of the block and its piece of KV, in int64 (no product wraps),
summed modulo 2^64. A head's digest does not depend on which worker holds it, so engines of
different tensor-parallel degrees compare digests head by head. Any changed bit, and any two blocks or
words swapped, changes the sum. The products must not wrap at 32 bits: there a change of a
word's top bit (a float's sign) adds +-2^31 whatever its weight, so a block's signs flipped
could cancel out: 58 of 400 random test blocks of 12 words a layer kept their digest (the
negative control's damage unseen; fewer in real blocks, which have more words), now 0 of 400. On CUDA one
Triton kernel reads each block once (digest_kernel.py); elsewhere torch multiplies and sums.

`launch` only queues the work on the device's stream and hands back a `PendingDigests`: the
engine's step goes on (on the decode side the digests sat between the KV's arrival and the
request's first step: 1.4 ms of TTFT at 8k tokens of the Llama-3-8B shape on an H200), and
the stream's order still makes the kernel read the blocks before any later forward pass writes
into them. The worker turns them into hex off the step (records.RecordQueue).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator, Sequence

import torch

from transfer_strategies.clock import DeviceTimer
from transfer_strategies.kv_blocks import KVBlocks, few_runs, packed_runs


class BlockDigests:
    def __init__(self, kv: KVBlocks, heads: Sequence[int] | None = None, kernel: bool | None = None):
        """heads: the global ids of the KV heads this worker holds (default 0..n-1); kernel: use
        digest_kernel.py (default: on CUDA, when the pieces are contiguous)."""
        self.kv = kv
        # one digest per (block, KV head), each head named by its global id, so that engines of
        # any tensor-parallel degrees compare the same units; "all" where heads cannot be told apart
        if kv.head_dim is None:
            self.keys = ["all"]
        else:
            self.keys = [str(h) for h in (range(kv.n_heads) if heads is None else heads)]
            if len(self.keys) != kv.n_heads:
                raise ValueError(f"{len(self.keys)} head ids for {kv.n_heads} heads")
        self._weights: dict[tuple[int, int], torch.Tensor] = {}
        self.kernel = None
        if kernel or (kernel is None and kv.device.type == "cuda" and kv.contiguous):
            from transfer_strategies.digest_kernel import DigestKernel
            try:
                self.kernel = DigestKernel(kv.pieces(range(kv.n_layers)), kv.head_dim_in_piece())
            except ValueError:
                if kernel:
                    raise

    def __call__(self, block_ids: Sequence[int]) -> dict[str, list[str]]:
        """{head: [digest of each block, in order]}."""
        return self.launch(block_ids).result()

    def launch(self, block_ids: Sequence[int], blocks: torch.Tensor | None = None) -> PendingDigests:
        """The digests of these blocks as they are at this point of the device's stream, queued
        there (on a CPU, computed now). blocks: the same blocks of every layer held in a buffer
        laid out as `gather` lays them out, digested instead of the cache's (a lossy strategy's
        sender digests what the receiver will reconstruct)."""
        device = self.kv.device
        if not block_ids:  # nothing for the device to do (a drained transfer, in the channel's thread)
            return PendingDigests(self.keys, torch.zeros(len(self.keys), 0, dtype=torch.int64), lambda: 0.0)
        timer = DeviceTimer(device)
        total = torch.zeros(len(block_ids), len(self.keys), dtype=torch.int64, device=device)
        if self.kernel is not None and blocks is None:
            ids = torch.tensor(list(block_ids), dtype=torch.int64)
            if device.type == "cuda":  # pinned and non_blocking: a plain copy would wait for the stream
                ids = ids.pin_memory().to(device, non_blocking=True)
            self.kernel.add_to(total, ids)
        else:
            pieces = self._block_words(block_ids) if blocks is None else self._buffer_words(blocks)
            for k, words in enumerate(pieces):
                for at, w in words:  # at: where these blocks sit in block_ids; w: [blocks, heads, words] int32
                    h = torch.mul(w, self._weights_for(w.shape[2], k)).sum(dim=2, dtype=torch.int64)
                    total[at:at + w.shape[0]] += h
        # [heads, blocks], read back into pinned host memory without waiting: in hand once the
        # stream gets there (PendingDigests.result waits for it)
        cols = total.t().contiguous()
        if device.type == "cuda":
            cols = torch.empty(cols.shape, dtype=cols.dtype, pin_memory=True).copy_(cols, non_blocking=True)
        return PendingDigests(self.keys, cols, timer.stop())

    def _per_head(self, blocks: torch.Tensor, head_axis: int | None) -> torch.Tensor:
        """[n, ...] blocks as [n, heads, int32 words of one head], a head's words in their order."""
        n = blocks.shape[0]
        if head_axis is None:
            return blocks.reshape(n, 1, -1).view(torch.int32)
        return blocks.movedim(head_axis, 1).reshape(n, self.kv.n_heads, -1).view(torch.int32)

    def _block_words(self, block_ids: Sequence[int]) -> Iterator[list[tuple[int, torch.Tensor]]]:
        """Per piece of KV (a layer, or a layer's K or V), the requested blocks as int32 words,
        [blocks, heads, words per head]: views of the cache, run by run, where pieces are
        contiguous (copied where the head axis is not the first after the block's); else
        gathered one layer at a time."""
        kv = self.kv
        head = kv.head_dim_in_piece()
        if kv.contiguous:
            runs = packed_runs(block_ids)
            if few_runs(len(runs), len(block_ids)):
                for p in kv.pieces(range(kv.n_layers)):
                    yield [(at, self._per_head(p.narrow(0, first, n), head)) for at, first, n in runs]
                return
            # Scattered blocks (a cache that has been used a while): one indexed gather per piece.
            # Per-run views would cost a few launches per run and piece: 0.7-0.9 s for a 16k-token
            # request of the Llama-3-8B shape on an H200, against 10-16 ms for the same blocks in
            # one run (results/gpu/2026-11-30-s5)
            idx = torch.tensor(list(block_ids), dtype=torch.int64, device=kv.device)
            for p in kv.pieces(range(kv.n_layers)):
                yield [(0, self._per_head(p.index_select(0, idx), head))]
            return
        for layer in range(kv.n_layers):
            out = torch.empty(1, *kv.layer_shape(len(block_ids)), dtype=kv.dtype, device=kv.device)
            blocks = kv.gather(block_ids, out, [layer])[0].movedim(kv.block_dim, 0)
            yield [(0, self._per_head(blocks, kv.head_dim))]  # the block axis moved first: the head's stays

    def _buffer_words(self, blocks: torch.Tensor) -> Iterator[list[tuple[int, torch.Tensor]]]:
        """As `_block_words`, from a buffer [n_layers, *layer_shape(n)]: each layer's pieces in
        the cache's order (its axes before the block axis, K/V on GPU backends)."""
        kv = self.kv
        head = kv.head_dim_in_piece()
        lead = blocks.shape[1:1 + kv.block_dim]
        for layer in blocks:
            for i in itertools.product(*(range(n) for n in lead)):
                yield [(0, self._per_head(layer[i].contiguous(), head))]

    def _weights_for(self, n: int, piece: int) -> torch.Tensor:
        key = (n, piece)
        if key not in self._weights:
            i = torch.arange(n, dtype=torch.int64, device=self.kv.device)
            w = ((i * 2654435761 + (piece + 1) * 40503) % (2**31)) | 1  # odd, below 2^31
            self._weights[key] = w  # int64: an int32 word times it cannot wrap
        return self._weights[key]


class PendingDigests:
    """Digests queued on the device: `result()` waits for them and writes them as hex."""

    def __init__(self, keys: list[str], cols: torch.Tensor, wait: Callable[[], float]):
        self.keys, self.cols, self._wait = keys, cols, wait
        self.ms: float | None = None  # once result() returned: the device's time plus the hex's

    def result(self) -> dict[str, list[str]]:
        device_ms = self._wait()
        t0 = time.perf_counter()
        # One hex string per head, cut into 16-digit digests: a format() per digest cost 0.96 ms
        # at 8k tokens of the Llama-3-8B shape (2048 of them; now 0.23) on the H200 machine's host
        cols = self.cols.numpy().astype(">u8")  # big-endian: hex digits in order
        out = {}
        for key, col in zip(self.keys, cols):
            text = col.tobytes().hex()
            out[key] = [text[i:i + 16] for i in range(0, len(text), 16)]
        self.ms = device_ms + (time.perf_counter() - t0) * 1e3
        return out

    def fill(self, record) -> None:
        """Into a transfer record (records.RecordQueue's thread)."""
        record.digests = self.result()
        record.digest_ms = self.ms
