"""The per-block digest sum (digests.py) as one Triton kernel per piece of KV, for CUDA.

torch computes a block's weighted sum in three passes over the KV (read, write the products,
read them again to sum) and a launch or two per run of blocks; this kernel reads each requested
block once, by id, and never writes the products: at 8k tokens of the Llama-3-8B shape the
decode side's digests sit between the KV's arrival and the request's first step, so their
cost is the harness's own share of the TTFT overhead. Same arithmetic as torch (int32 products
that wrap, summed in int64), so both paths give the same digest, bit for bit
(tests/test_digests.py runs the kernel in Triton's interpreter on CPU).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

CHUNK = 2048  # words per program per loop iteration


@triton.jit
def _weighted_block_sums(piece, ids, out, words, row_stride, piece_salt, CHUNK: tl.constexpr):
    # one program per requested block: out[b] += sum_i words[i] * weight(i, piece)
    b = tl.program_id(0)
    row = piece + tl.load(ids + b).to(tl.int64) * row_stride
    acc = tl.zeros([CHUNK], dtype=tl.int64)
    for start in range(0, words, CHUNK):
        i = start + tl.arange(0, CHUNK).to(tl.int64)
        mask = i < words
        x = tl.load(row + i, mask=mask, other=0)
        w = (((i * 2654435761 + piece_salt) % 2147483648) | 1).to(tl.int32)  # digests._weights_for
        acc += (x * w).to(tl.int64)
    tl.store(out + b, tl.load(out + b) + tl.sum(acc, axis=0))


def add_block_sums(total: torch.Tensor, piece: torch.Tensor, ids: torch.Tensor, piece_index: int) -> None:
    """total[j] += the weighted sum of block ids[j] of piece ([num_blocks, ...], contiguous)."""
    words = piece[0].numel() * piece.element_size() // 4
    grid = (ids.numel(),)
    _weighted_block_sums[grid](piece.view(piece.shape[0], -1).view(torch.int32), ids, total, words, words,
                               (piece_index + 1) * 40503, CHUNK=min(CHUNK, triton.next_power_of_2(words)),
                               num_warps=8)
