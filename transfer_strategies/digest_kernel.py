"""The per-block, per-head digest sum (digests.py) as one Triton kernel for all of a request's
blocks, on CUDA.

torch computes a block's weighted sum in three passes over the KV (read, write the products,
read them again to sum) with a launch or two per piece of KV and run of blocks; this kernel
reads each requested block once, by id, in one launch for every piece: at 8k tokens of the
Llama-3-8B shape, 64 launches of a 16 MiB piece each cost more in launching than in reading. The
decode side's digests sit between the KV's arrival and the request's first step, so their cost
is the harness's own share of the TTFT overhead. Same arithmetic as torch (int64 products,
summed in int64 modulo 2^64, in any order: integers), so both paths give the same digest bit for bit
(tests/test_digests.py runs the kernel in Triton's interpreter on CPU).

A block of a piece is [heads, tokens, words] (HND, and the CPU backend's layout) or [tokens,
heads, words] (NHD): the kernel walks one head's (token, word) positions through two strides.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

CHUNK = 4096  # words of a head's share of a block per program


@triton.jit
def _weighted_block_sums(base, piece_offsets, ids, out, block_words, n_heads, head_words, row_words, stride_h,
                         stride_t, chunks, CHUNK: tl.constexpr):
    # program (b, k, h * chunks + s): words [s * CHUNK, (s + 1) * CHUNK) of head h of block ids[b] in piece k
    b = tl.program_id(0)
    k = tl.program_id(1)
    h = tl.program_id(2) // chunks
    i = (tl.program_id(2) % chunks) * CHUNK + tl.arange(0, CHUNK).to(tl.int64)
    row = base + tl.load(piece_offsets + k) + tl.load(ids + b).to(tl.int64) * block_words + h * stride_h
    x = tl.load(row + (i // row_words) * stride_t + i % row_words, mask=i < head_words, other=0)
    w = ((i * 2654435761 + (k + 1) * 40503) % 2147483648) | 1  # digests._weights_for
    tl.atomic_add(out + b * n_heads + h, tl.sum(x.to(tl.int64) * w, axis=0))


class DigestKernel:
    """The weighted sums of blocks per head over a fixed list of pieces ([num_blocks, ...] each,
    contiguous, all alike), each addressed from the first as a word offset."""

    def __init__(self, pieces: Sequence[torch.Tensor], head_axis: int | None):
        """head_axis: the axis of a piece that holds the heads (None: a block is one unit)."""
        words = [p.view(p.shape[0], -1).view(torch.int32) for p in pieces]
        self.base = words[0]
        self.words = words[0].shape[1]
        starts = [w.data_ptr() - self.base.data_ptr() for w in words]
        if any(s % 4 for s in starts) or any(w.shape != self.base.shape for w in words):
            raise ValueError("pieces are not alike and word-aligned")
        self.offsets = torch.tensor([s // 4 for s in starts], dtype=torch.int64, device=self.base.device)
        block = list(pieces[0].shape[1:])  # one block of a piece, in elements
        if head_axis is None:  # one head, one row of every word
            self.n_heads, self.row_words, self.stride_h, self.stride_t = 1, self.words, 0, 0
        elif len(block) == 3 and head_axis in (1, 2):
            per_word = max(1, 4 // pieces[0].element_size())  # elements in an int32 word
            if pieces[0].element_size() > 4 or block[2] % per_word:
                raise ValueError("a head's row is not whole int32 words")
            self.row_words = block[2] // per_word
            if head_axis == 1:  # [heads, tokens, words]
                self.n_heads, self.stride_h, self.stride_t = block[0], block[1] * self.row_words, self.row_words
            else:  # [tokens, heads, words]
                self.n_heads, self.stride_h, self.stride_t = block[1], self.row_words, block[1] * self.row_words
        else:
            raise ValueError(f"a block of shape {block} with heads on axis {head_axis}: not [heads|tokens, ..., words]")
        self.head_words = self.words // self.n_heads
        self.chunk = min(CHUNK, triton.next_power_of_2(self.head_words))
        self.chunks = triton.cdiv(self.head_words, self.chunk)

    def add_to(self, total: torch.Tensor, ids: torch.Tensor) -> None:
        """total[j, h] += the weighted sum of head h of block ids[j] over every piece."""
        grid = (ids.numel(), self.offsets.numel(), self.n_heads * self.chunks)
        _weighted_block_sums[grid](self.base, self.offsets, ids, total, self.words, self.n_heads, self.head_words,
                                   self.row_words, self.stride_h, self.stride_t, self.chunks,
                                   CHUNK=self.chunk, num_warps=4)
