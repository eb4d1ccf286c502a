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

from transfer_strategies import codecs
from transfer_strategies.digest_kernel import alignment, block_start, odd_weight

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
def _packed(k, n_blocks, j, block_elems, stride_t, stride_h, h, BLOCK_T: tl.constexpr, S: tl.constexpr):
    # int4's bytes of head h of a block: [BLOCK_T, S // 2], each a pair of values. Counted in bytes
    # from the start (every stride and block even), not halved from the values' offsets, so Triton
    # sees runs of S // 2 bytes and moves 8 a thread, not one at a time (which took the send to
    # 3.4x int8's at 8k tokens, results/gpu/2026-12-04-s21; not timed on a GPU since)
    t = tl.arange(0, BLOCK_T)
    c = tl.arange(0, S // 2)
    return ((k * n_blocks + j).to(tl.int64) * (block_elems // 2) + t[:, None] * (stride_t // 2) + h * (stride_h // 2)
            + c[None, :])


@triton.jit
def _encode(cache, piece_offsets, ids, values, scales, n_blocks, block_elems, stride_t, stride_h,
            scales_per_block, scale_t, scale_h, T: tl.constexpr, S: tl.constexpr, BLOCK_T: tl.constexpr,
            C: tl.constexpr, QMAX: tl.constexpr, FMT: tl.constexpr, PER_TOKEN: tl.constexpr, ALIGN: tl.constexpr):
    j = tl.program_id(0)
    k = tl.program_id(1)
    h = tl.program_id(2)
    G: tl.constexpr = S // C
    t = tl.arange(0, BLOCK_T)
    c = tl.arange(0, S)
    within = t[:, None] * stride_t + h * stride_h + c[None, :]  # [BLOCK_T, S]
    mask = (t < T)[:, None]
    src = block_start(ids, j, block_elems, piece_offsets, k, ALIGN)
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
        tl.store(values + _packed(k, n_blocks, j, block_elems, stride_t, stride_h, h, BLOCK_T, S), lo | (hi << 4),
                 mask=mask)


@triton.jit
def _decode(cache, piece_offsets, ids, values, scales, n_blocks, first, block_elems, stride_t, stride_h,
            scales_per_block, scale_t, scale_h, T: tl.constexpr, S: tl.constexpr, BLOCK_T: tl.constexpr,
            C: tl.constexpr, FMT: tl.constexpr, PER_TOKEN: tl.constexpr, ALIGN: tl.constexpr):
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
        b = tl.load(values + _packed(k, n_blocks, j, block_elems, stride_t, stride_h, h, BLOCK_T, S), mask=mask,
                    other=0)
        q = tl.reshape(tl.join(b & 15, b >> 4), (BLOCK_T, S)).to(tl.float32) - 8
    g = tl.arange(0, G)
    if PER_TOKEN:
        s_at = (k * n_blocks + j).to(tl.int64) * scales_per_block + t[:, None] * scale_t + h * scale_h + g[None, :]
        scale = tl.load(scales + s_at, mask=(t < T)[:, None], other=1.0)[:, :, None]
    else:
        scale = tl.load(scales + (k * n_blocks + j).to(tl.int64) * scales_per_block + h * scale_h + g)[None, :, None]
    x = tl.reshape(tl.reshape(q, (BLOCK_T, G, C)) * scale, (BLOCK_T, S))
    dst = block_start(ids, j, block_elems, piece_offsets, k, ALIGN)
    tl.store(cache + dst + within, x.to(cache.dtype.element_ty), mask=mask)  # round to nearest even


@triton.jit
def _digit_sum(v, place, w, BITS: tl.constexpr):
    # the sum of word x weight (int32 words, as torch views them, times their int32 weights; modulo
    # 2^64) over the words that digits v make, without making them: v [rows, n] holds each digit's
    # bits (0 to 2^BITS - 1, in int32), `place` its place in its word from the low end, w its
    # word's weight. A word's product is the sum of its digits' products, the top digit taken as
    # signed. Joining the digits into words instead moved them between threads (the kernel
    # was bound by those shuffles: 5.3 ms for 8k tokens of the Llama-3-8B shape on an H200).
    if BITS < 32:
        v = tl.where((place == 32 // BITS - 1) & (v >= (1 << (BITS - 1))), v - (1 << BITS), v)
    products = (v.to(tl.int64) * w.to(tl.int64)) << (place * BITS).to(tl.int64)
    return tl.sum(tl.sum(products, axis=1), axis=0)


@triton.jit
def _e4m3_value(b):
    # an FP8 e4m3 byte's value (in int32, 0 to 255): exponent field e, mantissa m; subnormal
    # (e = 0) m * 2^-9, else (8 + m) * 2^(e - 10); the sign bit on top (0x80: -0.0)
    e = (b >> 3) & 15
    m = (b & 7).to(tl.float32)
    power = ((e + 117) << 23).to(tl.float32, bitcast=True)  # 2^(e - 10)
    v = tl.where(e == 0, m * 0.001953125, (m + 8.0) * power)
    # times -1, not -v: Triton negates as 0 - v, which makes 0x80's -0.0 a +0.0 (the digests differ)
    return v * tl.where((b & 128) != 0, -1.0, 1.0)


@triton.jit
def _check(cache, piece_offsets, ids, digests, payload_sums, error_max, error_sum, n_blocks, block_elems,
           stride_t, stride_h, scales_per_block, scale_t, scale_h, value_words, n_heads, pieces_per_layer,
           T: tl.constexpr, S: tl.constexpr, BLOCK_T: tl.constexpr, C: tl.constexpr, QMAX: tl.constexpr,
           FMT: tl.constexpr, PER_TOKEN: tl.constexpr, ELEMENT_BYTES: tl.constexpr, ALIGN: tl.constexpr):
    # A lossy sender's check of what it sent, in one pass over its blocks: _encode's arithmetic, but
    # instead of storing the payload, its checksum (faults.payload_checksum: words weighted by
    # their place in the payload, values then scales); the value each reconstructs (_decode's
    # arithmetic) digested as the receiver digests its blocks (digest_kernel.py: words weighted by
    # their place in the head's share of the block and by the piece); and its error against the
    # original, per layer: largest error and magnitude (error_max[layer, 0|1]), their sums (error_sum).
    j = tl.program_id(0)
    k = tl.program_id(1)
    h = tl.program_id(2)
    G: tl.constexpr = S // C
    t = tl.arange(0, BLOCK_T)
    c = tl.arange(0, S)
    within = t[:, None] * stride_t + h * stride_h + c[None, :]
    mask = (t < T)[:, None]
    src = block_start(ids, j, block_elems, piece_offsets, k, ALIGN)
    x = tl.load(cache + src + within, mask=mask, other=0.0).to(tl.float32)
    x3 = tl.reshape(x, (BLOCK_T, G, C))
    g = tl.arange(0, G)
    row = (k * n_blocks + j).to(tl.int64) * block_elems + t * stride_t + h * stride_h  # [BLOCK_T] payload elements
    if PER_TOKEN:
        amax = tl.max(tl.abs(x3), axis=2)
        q, scale = _quantize(x3, amax[:, :, None], QMAX, FMT)
        s_at = (k * n_blocks + j).to(tl.int64) * scales_per_block + t[:, None] * scale_t + h * scale_h + g[None, :]
        s_words = tl.where(mask, scale.reshape(BLOCK_T, G).to(tl.int32, bitcast=True), 0)
        s_sum = tl.sum(tl.sum(s_words.to(tl.int64) * odd_weight((value_words + s_at).to(tl.int32), 0).to(tl.int64),
                              axis=1), axis=0)
    else:
        amax = tl.max(tl.max(tl.abs(x3), axis=2), axis=0)
        q, scale = _quantize(x3, amax[None, :, None], QMAX, FMT)
        s_at = (k * n_blocks + j).to(tl.int64) * scales_per_block + h * scale_h + g
        s_words = tl.reshape(scale, (G,)).to(tl.int32, bitcast=True)
        s_sum = tl.sum(s_words.to(tl.int64) * odd_weight((value_words + s_at).to(tl.int32), 0).to(tl.int64), axis=0)
    if FMT == 0:  # the payload's bits, and the value they hold decoded with integer arithmetic: on an
        # H200 a float8 register made here converted back to float32 wrong, read from its bits as
        # _decode does (bitcast) or not (results/gpu/2026-12-05-s24, 2026-12-05-s25); the bits were right
        b = q.to(tl.float8e4nv, fp_downcast_rounding="rtne").to(tl.uint8, bitcast=True).to(tl.int32)
        q = _e4m3_value(b)
    elif FMT == 1:
        b = q.to(tl.int8).to(tl.uint8, bitcast=True).to(tl.int32)
        q = q.to(tl.int8).to(tl.float32)  # as the receiver reads it: a -0.0 rounded here is a 0 there
    else:
        b = (q + 8).to(tl.int32)  # value c is nibble c % 8 of its word (row: a multiple of 8 values)
        q = q.to(tl.int8).to(tl.float32)
    q = tl.reshape(q, (BLOCK_T, G, C))
    b = tl.where(mask, tl.reshape(b, (BLOCK_T, S)), 0)
    PER_WORD: tl.constexpr = 8 if FMT == 2 else 4
    w_at = row[:, None] // PER_WORD + c[None, :] // PER_WORD
    p_sum = _digit_sum(b, c[None, :] % PER_WORD, odd_weight(w_at.to(tl.int32), 0), 32 // PER_WORD)
    tl.atomic_add(payload_sums + j, p_sum + s_sum)
    # the reconstruction, as _decode writes it into the receiver's blocks, digested as the receiver
    # digests them: weights by place in the head's share of the block and by piece
    r = tl.reshape(q * scale, (BLOCK_T, S)).to(cache.dtype.element_ty)
    if ELEMENT_BYTES == 2:
        bits = tl.where(mask, r.to(tl.int16, bitcast=True).to(tl.int32) & 65535, 0)
        d_sum = _digit_sum(bits, c[None, :] % 2, odd_weight(t[:, None] * (S // 2) + c[None, :] // 2, k), 16)
    else:
        bits = tl.where(mask, r.to(tl.int32, bitcast=True), 0)
        d_sum = _digit_sum(bits, c[None, :] * 0, odd_weight(t[:, None] * S + c[None, :], k), 32)
    tl.atomic_add(digests + j * n_heads + h, d_sum)
    err = tl.abs(r.to(tl.float32) - x)  # padded rows: both 0
    mag = tl.abs(x)
    layer = k // pieces_per_layer
    tl.atomic_max(error_max + layer * 2, tl.max(tl.max(err, axis=1), axis=0))
    tl.atomic_max(error_max + layer * 2 + 1, tl.max(tl.max(mag, axis=1), axis=0))
    tl.atomic_add(error_sum + layer * 2, tl.sum(tl.sum(err, axis=1), axis=0).to(tl.float64))
    tl.atomic_add(error_sum + layer * 2 + 1, tl.sum(tl.sum(mag, axis=1), axis=0).to(tl.float64))


class CodecKernel:
    """The two kernels bound to one engine's KV layout (codecs.Codec.attach makes it where it can:
    CUDA, contiguous pieces of [tokens, heads, head size] or [heads, tokens, head size], a head
    size and channels per scale that are powers of two)."""

    warps = 4  # a program's warps (scripts/bench_codecs.py --warps tries others)

    def __init__(self, codec):
        kv = codec.kv
        pieces = kv.pieces(range(kv.n_layers))
        head = kv.head_dim_in_piece()  # axes of a piece [blocks, ...]
        token = None if codec.token_axis is None else codec.token_axis - kv.block_dim
        block = list(pieces[0].shape[1:])
        if kv.device.type not in codecs.KERNEL_DEVICES or not kv.contiguous or len(block) != 3 \
                or {head, token} != {1, 2}:
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
        self.align = alignment(block[0] * block[1] * block[2], *(st // size for st in starts))
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

    def _check_consts(self) -> dict:
        # FP8: with the blocks' alignment told, the check's reconstruction errors came out wrong on
        # the H200 (session 26, .gpu diag: right with ALIGN=1, its payload checksum right either way)
        consts = self._consts()
        return dict(consts, ALIGN=1) if consts["FMT"] == FORMAT_IDS["fp8"] else consts

    def _consts(self) -> dict:
        return {"T": self.T, "S": self.S, "BLOCK_T": triton.next_power_of_2(self.T), "C": self.codec.channels,
                "FMT": FORMAT_IDS[self.codec.format.name], "PER_TOKEN": self.per_token, "ALIGN": self.align}

    def encode(self, ids: torch.Tensor, values: torch.Tensor, scales: torch.Tensor) -> None:
        """Blocks `ids` (int64, on the device) of every piece into values (uint8) and scales (float32)."""
        n = ids.numel()
        if n:
            _encode[(n, len(self.pieces), self.H)](self.base, self.offsets, ids, values, scales, *self._args(n),
                                                   QMAX=self.codec.format.qmax, **self._consts(),
                                                   num_warps=self.warps)

    def check(self, ids: torch.Tensor) -> dict[str, torch.Tensor] | None:
        """A lossy sender's check of blocks `ids` (int64, on the device), queued on its stream:
        the payload's checksum as a sum per block (`payload_sums`, int64: faults.payload_checksum's
        modulo 2^64 once summed), the reconstruction's digest sums [blocks, heads] (`digests`:
        digests.BlockDigests'), and per layer the largest error and magnitude (`error_max`,
        [layers, 2]) and their sums (`error_sum`, float64). None where the kernel cannot: KV of
        1-byte values, or a head of fewer than 8 values (its 4-bit row is not a whole word)."""
        if self.S < 8 or self.base.element_size() not in (2, 4):
            return None
        n, dev = ids.numel(), ids.device
        n_layers = self.kv.n_layers
        out = {"payload_sums": torch.zeros(n, dtype=torch.int64, device=dev),
               "digests": torch.zeros(n, self.H, dtype=torch.int64, device=dev),
               "error_max": torch.zeros(n_layers, 2, dtype=torch.float32, device=dev),
               "error_sum": torch.zeros(n_layers, 2, dtype=torch.float64, device=dev)}
        if n:
            value_words = self.codec.value_bytes(n_layers, n) // 4
            _check[(n, len(self.pieces), self.H)](self.base, self.offsets, ids, out["digests"], out["payload_sums"],
                                                  out["error_max"], out["error_sum"], *self._args(n), value_words,
                                                  self.H, len(self.pieces) // n_layers, QMAX=self.codec.format.qmax,
                                                  ELEMENT_BYTES=self.base.element_size(), **self._check_consts(),
                                                  num_warps=self.warps, enable_fp_fusion=False)  # the error: no FMA
        return out

    def decode(self, values: torch.Tensor, scales: torch.Tensor, ids: torch.Tensor, n_blocks: int, first: int) -> None:
        """Blocks [first, n_blocks) of a payload into this engine's blocks ids[first:]."""
        if n_blocks > first:
            n = n_blocks
            _decode[(n_blocks - first, len(self.pieces), self.H)](self.base, self.offsets, ids, values, scales,
                                                                  n, first, *self._args(n)[1:], **self._consts(),
                                                                  num_warps=self.warps)
