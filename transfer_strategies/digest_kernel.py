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

CHUNK = 4096  # most words of a head's share of a block read at once
PIECES = 8  # pieces of KV (layers' K or V) one program sums: fewer atomic adds, more reading each
A32 = tl.constexpr(2654435761 - 2**32)  # digests._weights_for's multiplier as an int32 (the same low 32 bits)


@triton.jit
def odd_weight(i, piece):
    # digests._weights_for's weight of word i of a piece, (i * 2654435761 + (piece + 1) * 40503)
    # mod 2^31 | 1, in int32 (i: int32): the low 31 bits of a product do not depend on what wraps above
    return ((i * A32 + (piece + 1) * 40503) & 2147483647) | 1


@triton.jit
def block_start(ids, j, block_size, piece_offsets, k, ALIGN: tl.constexpr):
    # where block ids[j] of piece k begins, counted from the first piece. ALIGN, a power of two
    # that divides every piece's offset and the block size (alignment()), tells the compiler so:
    # an offset read from memory is otherwise taken as unaligned, and every load and store of a
    # block is then one element wide (2 bytes of bf16 an instruction; the codec kernels ran at half
    # of HBM's bandwidth on an H200 so, results/gpu/2026-12-04-s24)
    return tl.multiple_of(tl.load(ids + j).to(tl.int64) * block_size + tl.load(piece_offsets + k), ALIGN)


def alignment(*sizes: int, most: int = 16) -> int:
    """The largest power of two up to `most` that divides every size: block_start's ALIGN."""
    align = most
    while align > 1 and any(s % align for s in sizes):
        align //= 2
    return align


@triton.jit
def _weighted_block_sums(base, piece_offsets, ids, out, n_pieces, block_words, n_heads, head_words, stride_h,
                         stride_t, ROW_WORDS: tl.constexpr, CHUNK: tl.constexpr, PIECES: tl.constexpr,
                         ALIGN: tl.constexpr):
    # program (b, h, g): head h of block ids[b], summed over pieces [g * PIECES, (g + 1) * PIECES).
    # Word i of a head's share is at (i // ROW_WORDS) * stride_t + i % ROW_WORDS: ROW_WORDS is a
    # compile-time constant, so that is a shift or a multiply, not a 64-bit division by a run-time
    # value (the per-head kernel's: 0.43 ms against 0.30 for 8k tokens of the Llama-3-8B shape on
    # an H200, results/gpu/2026-12-02-s14).
    b = tl.program_id(0)
    h = tl.program_id(1)
    acc = tl.zeros([CHUNK], dtype=tl.int64)
    for p in range(PIECES):
        k = tl.program_id(2) * PIECES + p
        if k < n_pieces:
            row = base + block_start(ids, b, block_words, piece_offsets, k, ALIGN) + h * stride_h
            for start in range(0, head_words, CHUNK):
                i = start + tl.arange(0, CHUNK)  # int32: a head's share of a block is far below 2^31 words
                x = tl.load(row + (i // ROW_WORDS) * stride_t + i % ROW_WORDS, mask=i < head_words, other=0)
                acc += x.to(tl.int64) * odd_weight(i, k).to(tl.int64)  # 32 x 32 -> 64 bits: it cannot wrap
    tl.atomic_add(out + b * n_heads + h, tl.sum(acc, axis=0))


@triton.jit
def _weighted_word_sum(words, n_words, out, CHUNK: tl.constexpr):
    # faults.payload_checksum over flat int32 words: word i times digests._weights_for's weight
    # of i (piece 0), summed in int64 (modulo 2^64)
    i = tl.program_id(0).to(tl.int64) * CHUNK + tl.arange(0, CHUNK)
    x = tl.load(words + i, mask=i < n_words, other=0)
    tl.atomic_add(out, tl.sum(x.to(tl.int64) * odd_weight(i.to(tl.int32), 0).to(tl.int64), axis=0))


def weighted_word_sum(words: torch.Tensor, out: torch.Tensor) -> None:
    """out (a 0-dim int64 tensor) += the weighted sum of flat int32 `words`, on their CUDA device."""
    n = words.numel()
    if n:
        _weighted_word_sum[(triton.cdiv(n, 8192),)](words, n, out, CHUNK=8192, num_warps=8)


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
        self.align = alignment(self.words, *(s // 4 for s in starts), most=4)  # 4 words: 16 bytes

    def add_to(self, total: torch.Tensor, ids: torch.Tensor) -> None:
        """total[j, h] += the weighted sum of head h of block ids[j] over every piece."""
        n_pieces = self.offsets.numel()
        grid = (ids.numel(), self.n_heads, triton.cdiv(n_pieces, PIECES))
        _weighted_block_sums[grid](self.base, self.offsets, ids, total, n_pieces, self.words, self.n_heads,
                                   self.head_words, self.stride_h, self.stride_t, ROW_WORDS=self.row_words,
                                   CHUNK=self.chunk, PIECES=PIECES, ALIGN=self.align, num_warps=4)
