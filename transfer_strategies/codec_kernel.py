"""The codecs (codecs.py) as two Triton kernels on CUDA: gather + compress, reading each of a
request's blocks once from the KV cache by id and writing its values and scales straight into the
payload; and reconstruct + scatter, reading the payload once and writing the engine's blocks. The
torch path is several passes over the KV (a float32 copy, the reduction, the division, the
conversion, the copies): 7.4 ms against fused's 0.52 ms gather at 8k tokens of the Llama-3-8B
shape on an H200 (results/gpu/2026-12-04-s21).

Same arithmetic as torch, so both give the same bytes (the sender's check compresses again with
this kernel, reconstructs with torch; the receiver reconstructs with the kernel): the group's
largest magnitude, scale = amax x float32(1 / qmax) (at least 2^-126), each value times the
float32 reciprocal of its scale, then rounded to nearest even (FP8 e4m3 saturating at 448; int8
and int4 to the nearest integer, clamped), and back: q * scale in float32, rounded to the KV dtype.
One program per head of a block: programs of several heads (up to 16k values) were no faster
on the H200 (8-bit send at 8k tokens 0.68-0.73 ms either way) and made 4-bit's per-token send
1.5x slower (results/gpu/2026-12-04-s22/tune_codec_kernel.txt).

A piece of KV (a layer's K or V) holds blocks of [tokens, heads, head size] (NHD) or [heads,
tokens, head size] (HND); program (j, k, h) handles head h of the request's block j in piece k.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

FORMAT_IDS = {"fp8": 0, "int8": 1, "int4": 2}


@triton.jit
def _quantize(x, amax, QMAX: tl.constexpr, FMT: tl.constexpr):
    # codecs.Codec.encode's arithmetic exactly: the scale is amax times the float32 reciprocal of
    # qmax (at least float32's smallest normal), each value times the scale's reciprocal, taken in
    # IEEE division once per group (Triton's `/` is the approximate one: it differed from torch's)
    scale = tl.maximum(amax * (1.0 / QMAX), 1.1754943508222875e-38)  # codecs.SCALE_MIN
    q = x * tl.math.div_rn(tl.full(scale.shape, 1.0, tl.float32), scale)
    if FMT != 0:  # int8, int4: to the nearest integer, ties to even (torch.round)
        q = libdevice.rint(q)
    return tl.minimum(tl.maximum(q, -QMAX), QMAX), scale


@triton.jit
def _encode(cache, piece_offsets, ids, values, scales, n_blocks, block_elems, stride_t, stride_h,
            scales_per_block, scale_t, scale_h, T: tl.constexpr, S: tl.constexpr, BLOCK_T: tl.constexpr,
            C: tl.constexpr, QMAX: tl.constexpr, FMT: tl.constexpr, PER_TOKEN: tl.constexpr):
    j = tl.program_id(0)
    k = tl.program_id(1)
    h = tl.program_id(2)
    G: tl.constexpr = S // C
    t = tl.arange(0, BLOCK_T)
    c = tl.arange(0, S)
    within = t[:, None] * stride_t + h * stride_h + c[None, :]  # [BLOCK_T, S]
    mask = (t < T)[:, None]
    src = tl.load(ids + j).to(tl.int64) * block_elems + tl.load(piece_offsets + k)
    x = tl.load(cache + src + within, mask=mask, other=0.0).to(tl.float32)
    x3 = tl.reshape(x, (BLOCK_T, G, C))
    if PER_TOKEN:
        amax = tl.max(tl.abs(x3), axis=2)  # [BLOCK_T, G]
        q, scale = _quantize(x3, amax[:, :, None], QMAX, FMT)
        g = tl.arange(0, G)
        s_at = (k * n_blocks + j).to(tl.int64) * scales_per_block + t[:, None] * scale_t + h * scale_h + g[None, :]
        tl.store(scales + s_at, scale.reshape(BLOCK_T, G), mask=(t < T)[:, None])
    else:
        amax = tl.max(tl.max(tl.abs(x3), axis=2), axis=0)  # [G]
        q, scale = _quantize(x3, amax[None, :, None], QMAX, FMT)
        g = tl.arange(0, G)
        s_at = (k * n_blocks + j).to(tl.int64) * scales_per_block + h * scale_h + g
        tl.store(scales + s_at, tl.reshape(scale, (G,)))
    q = tl.reshape(q, (BLOCK_T, S))
    dst = (k * n_blocks + j).to(tl.int64) * block_elems + within  # the payload's element order: the buffer's
    if FMT == 0:
        tl.store(values + dst, q.to(tl.float8e4nv, fp_downcast_rounding="rtne").to(tl.uint8, bitcast=True),
                 mask=mask)
    elif FMT == 1:
        tl.store(values + dst, q.to(tl.int8).to(tl.uint8, bitcast=True), mask=mask)
    else:  # two values a byte, the even one in the low half
        lo, hi = tl.split(tl.reshape((q + 8).to(tl.uint8), (BLOCK_T, S // 2, 2)))
        even, _ = tl.split(tl.reshape(dst, (BLOCK_T, S // 2, 2)))
        tl.store(values + even // 2, lo | (hi << 4), mask=mask)


@triton.jit
def _decode(cache, piece_offsets, ids, values, scales, n_blocks, first, block_elems, stride_t, stride_h,
            scales_per_block, scale_t, scale_h, T: tl.constexpr, S: tl.constexpr, BLOCK_T: tl.constexpr,
            C: tl.constexpr, FMT: tl.constexpr, PER_TOKEN: tl.constexpr):
    j = first + tl.program_id(0)
    k = tl.program_id(1)
    h = tl.program_id(2)
    G: tl.constexpr = S // C
    t = tl.arange(0, BLOCK_T)
    c = tl.arange(0, S)
    within = t[:, None] * stride_t + h * stride_h + c[None, :]
    mask = (t < T)[:, None]
    src = (k * n_blocks + j).to(tl.int64) * block_elems + within
    if FMT == 0:
        q = tl.load(values + src, mask=mask, other=0).to(tl.float8e4nv, bitcast=True).to(tl.float32)
    elif FMT == 1:
        q = tl.load(values + src, mask=mask, other=0).to(tl.int8, bitcast=True).to(tl.float32)
    else:
        even, _ = tl.split(tl.reshape(src, (BLOCK_T, S // 2, 2)))
        b = tl.load(values + even // 2, mask=mask, other=0)
        q = tl.reshape(tl.join(b & 15, b >> 4), (BLOCK_T, S)).to(tl.float32) - 8
    g = tl.arange(0, G)
    if PER_TOKEN:
        s_at = (k * n_blocks + j).to(tl.int64) * scales_per_block + t[:, None] * scale_t + h * scale_h + g[None, :]
        scale = tl.load(scales + s_at, mask=(t < T)[:, None], other=1.0)[:, :, None]
    else:
        scale = tl.load(scales + (k * n_blocks + j).to(tl.int64) * scales_per_block + h * scale_h + g)[None, :, None]
    x = tl.reshape(tl.reshape(q, (BLOCK_T, G, C)) * scale, (BLOCK_T, S))
    dst = tl.load(ids + j).to(tl.int64) * block_elems + tl.load(piece_offsets + k)
    tl.store(cache + dst + within, x.to(cache.dtype.element_ty), mask=mask)  # round to nearest even


class CodecKernel:
    """The two kernels bound to one engine's KV layout (codecs.Codec.attach makes it where it can:
    CUDA, contiguous pieces of [tokens, heads, head size] or [heads, tokens, head size], a head
    size and channels per scale that are powers of two)."""

    def __init__(self, codec):
        kv = codec.kv
        pieces = kv.pieces(range(kv.n_layers))
        head = kv.head_dim_in_piece()  # axes of a piece [blocks, ...]
        token = None if codec.token_axis is None else codec.token_axis - kv.block_dim
        block = list(pieces[0].shape[1:])
        if kv.device.type != "cuda" or not kv.contiguous or len(block) != 3 or {head, token} != {1, 2}:
            raise ValueError(f"no codec kernel for blocks of shape {block} (heads on axis {head}, tokens on {token})")
        s, c = block[2], codec.channels
        if s & (s - 1) or c & (c - 1):
            raise ValueError(f"no codec kernel for a head size of {s} with {c} values per scale: not powers of two")
        self.codec, self.kv, self.pieces = codec, kv, pieces
        self.base = pieces[0]
        starts = [p.data_ptr() - self.base.data_ptr() for p in pieces]
        size = self.base.element_size()
        if any(st % size for st in starts) or any(p.shape != self.base.shape for p in pieces):
            raise ValueError("KV pieces are not alike and aligned")
        self.offsets = torch.tensor([st // size for st in starts], dtype=torch.int64, device=kv.device)
        self.T, self.H, self.S = block[token - 1], block[head - 1], s  # a piece's axis a is a block's a - 1
        self.block_elems = block[0] * block[1] * block[2]
        self.stride_t, self.stride_h = (self.H * s, s) if token == 1 else (s, self.T * s)
        g = s // c
        per_token = codec.params.scale == "token"
        if per_token:  # the scales' order is the buffer's: tokens and heads as the layout has them
            self.scales_per_block = self.T * self.H * g
            self.scale_t, self.scale_h = (self.H * g, g) if token == 1 else (g, self.T * g)
        else:
            self.scales_per_block, self.scale_t, self.scale_h = self.H * g, 0, g
        self.per_token = per_token

    def _args(self, n_blocks: int) -> tuple:
        return (n_blocks, self.block_elems, self.stride_t, self.stride_h, self.scales_per_block, self.scale_t,
                self.scale_h)

    def _consts(self) -> dict:
        return {"T": self.T, "S": self.S, "BLOCK_T": triton.next_power_of_2(self.T), "C": self.codec.channels,
                "FMT": FORMAT_IDS[self.codec.format.name], "PER_TOKEN": self.per_token}

    def encode(self, ids: torch.Tensor, values: torch.Tensor, scales: torch.Tensor) -> None:
        """Blocks `ids` (int64, on the device) of every piece into values (uint8) and scales (float32)."""
        n = ids.numel()
        if n:
            _encode[(n, len(self.pieces), self.H)](self.base, self.offsets, ids, values, scales, *self._args(n),
                                                   QMAX=self.codec.format.qmax, **self._consts(), num_warps=4)

    def decode(self, values: torch.Tensor, scales: torch.Tensor, ids: torch.Tensor, n_blocks: int, first: int) -> None:
        """Blocks [first, n_blocks) of a payload into this engine's blocks ids[first:]."""
        if n_blocks > first:
            n = n_blocks
            _decode[(n_blocks - first, len(self.pieces), self.H)](self.base, self.offsets, ids, values, scales,
                                                                  n, first, *self._args(n)[1:], **self._consts(),
                                                                  num_warps=4)
