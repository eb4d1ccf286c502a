"""The per-block digest sum (digests.py) as one Triton kernel for all of a request's blocks, on
CUDA.

torch computes a block's weighted sum in three passes over the KV (read, write the products,
read them again to sum) with a launch or two per piece of KV and run of blocks; this kernel
reads each requested block once, by id, in one launch for every piece: at 8k tokens of the
Llama-3-8B shape, 64 launches of a 16 MiB piece each cost more in launching than in reading. The
decode side's digests sit between the KV's arrival and the request's first step, so their cost
is the harness's own share of the TTFT overhead. Same arithmetic as torch (int64 products,
summed in int64 modulo 2^64, in any order: integers), so both paths give the same digest bit for bit
(tests/test_digests.py runs the kernel in Triton's interpreter on CPU).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

CHUNK = 4096  # words of a block per program


@triton.jit
def _weighted_block_sums(base, piece_offsets, ids, out, words, row_stride, CHUNK: tl.constexpr):
    # program (b, k, s): words [s * CHUNK, (s + 1) * CHUNK) of block ids[b] in piece k
    b = tl.program_id(0)
    k = tl.program_id(1)
    i = tl.program_id(2) * CHUNK + tl.arange(0, CHUNK).to(tl.int64)
    row = base + tl.load(piece_offsets + k) + tl.load(ids + b).to(tl.int64) * row_stride
    x = tl.load(row + i, mask=i < words, other=0)
    w = ((i * 2654435761 + (k + 1) * 40503) % 2147483648) | 1  # digests._weights_for
    tl.atomic_add(out + b, tl.sum(x.to(tl.int64) * w, axis=0))


class DigestKernel:
    """The weighted sums of blocks over a fixed list of pieces ([num_blocks, ...] each, contiguous,
    all alike), each addressed from the first as a word offset."""

    def __init__(self, pieces: Sequence[torch.Tensor]):
        words = [p.view(p.shape[0], -1).view(torch.int32) for p in pieces]
        self.base = words[0]
        self.words = words[0].shape[1]
        starts = [w.data_ptr() - self.base.data_ptr() for w in words]
        if any(s % 4 for s in starts) or any(w.shape != self.base.shape for w in words):
            raise ValueError("pieces are not alike and word-aligned")
        self.offsets = torch.tensor([s // 4 for s in starts], dtype=torch.int64, device=self.base.device)
        self.chunk = min(CHUNK, triton.next_power_of_2(self.words))

    def add_to(self, total: torch.Tensor, ids: torch.Tensor) -> None:
        """total[j] += the weighted sum of block ids[j] over every piece."""
        grid = (ids.numel(), self.offsets.numel(), triton.cdiv(self.words, self.chunk))
        _weighted_block_sums[grid](self.base, self.offsets, ids, total, self.words, self.words,
                                   CHUNK=self.chunk, num_warps=4)
