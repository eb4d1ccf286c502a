"""Codecs of the lossy strategies: a request's KV blocks, laid out as `gather` lays them out
([layers, *layer_shape(n)], kv_blocks.py), compressed into one payload on the sender and
reconstructed on the receiver, both on the KV's own device.

Scales: one float32 per group of values, the group's largest magnitude mapped to the format's
largest value (symmetric, no zero point). A group is `channels` consecutive values of the
innermost axis (a KV head's features: `channels` = the head size keeps K and V apart on
vLLM's CPU layout, which puts both in that axis) of one KV head, taken over every token of a
block (scale="block") or of one token (scale="token"). Per block and head, as the digests
count blocks, so a block's scales travel with it; per token for the 4-bit codec, whose error
grows with the group's range (an outlier token or channel spends every other value's levels).

    fp8   FP8 e4m3 (vLLM's own FP8 KV format), scale per block, KV head and K/V: e4m3 keeps
          3 bits of mantissa at any magnitude, so a value's error is within 2^-4 of itself
          wherever its group's scale puts it; the scale only keeps the group inside +-448
          (one float32 per 16-32 tokens x head size: 0.1-0.4% of the payload)
    int8  symmetric int8, scale per block, KV head and K/V: error within 1/254 of the group's
          largest magnitude
    int4  symmetric 4-bit (levels -7..7, two a byte), scale per token, KV head and 32 features:
          error within 1/14 of the group's largest magnitude, 5 bits a value with its scale

The payload: the quantized values in the buffer's element order (packed for int4), then the
scales in theirs. No scale spans two KV heads, so the payload of some heads (`cut`) is what
encoding only those heads gives, and payloads of consecutive heads `join` into one: how a
lossy payload crosses engines of different tensor-parallel degrees (head_shards.py). A receiver
checks its size before reading it: a payload cut short (a scale gone missing) is refused, not
read. `max_rel_error` is what the codec guarantees: no value's error exceeds it times the largest
magnitude of its group, so of its layer (the records' `codec_max_rel`, measured on the sender, is
checked against it by the tests), except in groups whose largest magnitude is below qmax x 2^-126
(bf16 subnormals), whose values are kept to within 2^-127 (their scale is held at float32's
smallest normal).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch

from transfer_strategies.connector_config import ContractError
from transfer_strategies.kv_blocks import KVBlocks

FP8_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max
KERNEL_DEVICES = ("cuda",)  # where codec_kernel.py runs (Triton's interpreter runs it on CPU tensors too: tests)
SCALE_MIN = 2.0**-126  # torch.finfo(torch.float32).tiny: scales below it would have no finite reciprocal


@dataclass(frozen=True)
class CodecParams:
    """A lossy strategy's parameters (strategy.params): how finely its scales are kept."""

    scale: Literal["block", "token"] = "block"  # one scale per block and head, or per token and head
    channels: int = 0  # values of a head's features per scale (0: the head size, K and V apart; MLA: the rope's)

    def __post_init__(self):
        if self.channels < 0:
            raise ContractError(f"strategy.params.channels must be >= 0 (0: the head size), got {self.channels}")


@dataclass(frozen=True)
class Format:
    name: str
    bits: int
    qmax: float  # the largest quantized magnitude
    rel_error: float  # a value's largest error, relative to its group's largest magnitude


FORMATS = {
    "fp8": Format("fp8", 8, FP8_MAX, 2.0**-4),
    "int8": Format("int8", 8, 127.0, 1 / 254),
    "int4": Format("int4", 4, 7.0, 1 / 14),
}


class Codec:
    """A format and its scales, bound to one engine's KV layout (`attach`)."""

    def __init__(self, fmt: str, params: CodecParams = CodecParams()):
        self.format = FORMATS[fmt]
        self.params = params
        self.kv: KVBlocks | None = None

    @property
    def name(self) -> str:
        """What the records call it: fp8/block/64 (format, scale, values of a head's features per scale)."""
        return f"{self.format.name}/{self.params.scale}/{self.channels}"

    def attach(self, kv: KVBlocks, block_size: int, head_size: int) -> Codec:
        self.kv = kv
        shape = kv.layer_shape(1)
        inner = shape[-1]
        self.channels = self.params.channels or min(head_size, inner)
        if inner % self.channels or (self.format.bits == 4 and self.channels % 2):
            raise ValueError(f"codec {self.format.name}: channels={self.channels} must divide the KV's innermost axis "
                             f"({inner} values){' and be even' if self.format.bits == 4 else ''}")
        # the axis of a block's tokens: after the block axis, neither the head axis nor the innermost
        tokens = [d for d in range(kv.block_dim + 1, len(shape) - 1) if d != kv.head_dim and shape[d] == block_size]
        self.token_axis = tokens[0] if tokens else None
        self.kernel = None  # on CUDA, where the layout allows: codec_kernel.py (one pass each way)
        if kv.device.type in KERNEL_DEVICES:
            from transfer_strategies.codec_kernel import CodecKernel
            with contextlib.suppress(ValueError):  # this layout has none: the torch path
                self.kernel = CodecKernel(self)
        return self

    # ---------------------------------------------------------------- sizes
    def _grouped(self, n_layers: int, n_blocks: int) -> list[int]:
        """The buffer's shape with the innermost axis cut into groups of `channels`."""
        shape = [n_layers, *self.kv.layer_shape(n_blocks)]
        return [*shape[:-1], shape[-1] // self.channels, self.channels]

    def _reduced(self) -> list[int]:
        """The axes of `_grouped` that one scale spans."""
        dims = [-1]
        if self.params.scale == "block" and self.token_axis is not None:
            dims.append(1 + self.token_axis)
        return dims

    def scale_shape(self, n_layers: int, n_blocks: int) -> list[int]:
        shape = self._grouped(n_layers, n_blocks)
        for d in self._reduced():
            shape[d] = 1
        return shape

    def value_bytes(self, n_layers: int, n_blocks: int) -> int:
        return math.prod(self._grouped(n_layers, n_blocks)) * self.format.bits // 8

    def nbytes(self, n_layers: int, n_blocks: int) -> int:
        return self.value_bytes(n_layers, n_blocks) + math.prod(self.scale_shape(n_layers, n_blocks)) * 4

    def max_rel_error(self) -> float:
        """The codec's bound on |reconstructed - original| / the group's largest magnitude, with the
        reconstruction's rounding to the KV dtype (half its epsilon, of a value up to 1 + the bound)."""
        b = self.format.rel_error
        return b + torch.finfo(self.kv.dtype).eps / 2 * (1 + b) + 2.0**-20  # float32 arithmetic's own

    # ---------------------------------------------------------------- a request's blocks, both ways
    def encode_plan(self, block_ids: list[int], out: torch.Tensor) -> Callable[[], torch.Tensor]:
        """A function that compresses blocks `block_ids` of every layer of this engine's cache into
        out (uint8, nbytes): on CUDA one kernel reading each block once; elsewhere a gather into a
        buffer, then `encode`. What can be prepared is prepared now (before the forward pass)."""
        kv, n_layers, n = self.kv, self.kv.n_layers, len(block_ids)
        if self.kernel is not None:
            ids = device_ids(block_ids, kv.device)
            values, scales = self._parts(out, n_layers, n)
            return lambda: (self.kernel.encode(ids, values, scales), out)[1]
        buf = torch.empty(n_layers, *kv.layer_shape(n), dtype=kv.dtype, device=kv.device)
        gather = kv.gather_plan(block_ids, buf, range(n_layers))
        return lambda: (gather(), self.encode(buf, out))[1]

    def decode_into(self, payload: torch.Tensor, block_ids: list[int], first: int = 0) -> None:
        """The blocks a payload of every layer reconstructs, [first, n), written into this engine's
        blocks block_ids[first:] (the first ones its prefix cache already held)."""
        kv, n_layers, n = self.kv, self.kv.n_layers, len(block_ids)
        data = self._checked(payload, n_layers, n)
        if first >= n:
            return
        if self.kernel is not None:
            values, scales = self._parts(data, n_layers, n)
            self.kernel.decode(values, scales, device_ids(block_ids, kv.device), n, first)
            return
        blocks = self.decode(data, n_layers, n)
        kv.scatter(block_ids[first:], blocks.narrow(1 + kv.block_dim, first, n - first), range(n_layers))

    def _parts(self, payload: torch.Tensor, n_layers: int, n_blocks: int) -> tuple[torch.Tensor, torch.Tensor]:
        nv = self.value_bytes(n_layers, n_blocks)
        return payload[:nv], payload[nv:].view(torch.float32)

    def _checked(self, payload: torch.Tensor, n_layers: int, n_blocks: int) -> torch.Tensor:
        data = payload.view(-1).view(torch.uint8)
        want = self.nbytes(n_layers, n_blocks)
        if data.numel() != want:
            raise ValueError(f"a {self.name} payload of {n_blocks} block(s) x {n_layers} layer(s) is {want} bytes, "
                             f"got {data.numel()}")
        return data

    # ---------------------------------------------------------------- by KV head (tensor parallelism)
    def head_nbytes(self, n_blocks: int, heads: int) -> int:
        """Bytes of a payload of n_blocks blocks of every layer holding `heads` of this engine's heads."""
        return self.nbytes(self.kv.n_layers, n_blocks) // self.kv.n_heads * heads

    def blocks_in(self, nbytes: int, heads: int) -> int | None:
        """How many blocks a payload of nbytes holding `heads` heads has (None: no whole number)."""
        per = self.head_nbytes(1, heads)
        return nbytes // per if per and nbytes % per == 0 else None

    def _head_views(self, payload: torch.Tensor, n_blocks: int, heads: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        """A payload of `heads` heads as (values [..., heads, ..., bytes of a group], scales
        [..., heads, ...], the head axis): a head's values and scales are a slice of that axis."""
        if self.kv.head_dim is None:
            raise ValueError(f"codec {self.name}: this engine's KV has no head axis to cut its payload by")
        axis = 1 + self.kv.head_dim
        values = self._grouped(self.kv.n_layers, n_blocks)
        values[-1] = values[-1] * self.format.bits // 8  # int4: two values a byte, never across groups
        scales = self.scale_shape(self.kv.n_layers, n_blocks)
        values[axis] = scales[axis] = heads
        nv = math.prod(values)
        data = payload.view(-1).view(torch.uint8)
        return data[:nv].view(values), data[nv:].view(torch.float32).view(scales), axis

    def cut(self, payload: torch.Tensor, heads: range, out: torch.Tensor | None = None) -> torch.Tensor:
        """The payload of this engine's heads `heads` out of a payload of all of them (into out,
        uint8, head_nbytes(n, len(heads)), or a new tensor)."""
        n = self.blocks_in(payload.numel() * payload.element_size(), self.kv.n_heads)
        if n is None:
            raise ValueError(f"a {self.name} payload of {payload.numel()} bytes is not whole blocks")
        values, scales, axis = self._head_views(payload, n, self.kv.n_heads)
        if out is None:
            out = torch.empty(self.head_nbytes(n, len(heads)), dtype=torch.uint8, device=payload.device)
        v, s, _ = self._head_views(out, n, len(heads))
        v.copy_(values.narrow(axis, heads.start, len(heads)))
        s.copy_(scales.narrow(axis, heads.start, len(heads)))
        return out

    def join(self, parts: list[tuple[torch.Tensor, int]]) -> torch.Tensor:
        """One payload of this engine's heads from payloads of consecutive heads, in head order:
        (payload, how many heads it holds) each."""
        if sum(k for _, k in parts) != self.kv.n_heads:
            raise ValueError(f"parts of {[k for _, k in parts]} heads do not make this engine's {self.kv.n_heads}")
        n = {self.blocks_in(p.numel(), k) for p, k in parts}
        if len(n) != 1 or None in n:
            raise ValueError(f"{self.name} payloads of {[p.numel() for p, _ in parts]} bytes do not hold as many "
                             f"blocks each")
        n = n.pop()
        out = torch.empty(self.nbytes(self.kv.n_layers, n), dtype=torch.uint8, device=parts[0][0].device)
        values, scales, axis = self._head_views(out, n, self.kv.n_heads)
        views = [self._head_views(p, n, k) for p, k in parts]
        torch.cat([v for v, _, _ in views], dim=axis, out=values)
        torch.cat([s for _, s, _ in views], dim=axis, out=scales)
        return out

    # ---------------------------------------------------------------- a buffer of blocks, both ways (torch)
    def encode(self, blocks: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """blocks ([n_layers, *layer_shape(n)], the KV dtype) compressed into out (uint8, nbytes)."""
        n_layers, n_blocks = blocks.shape[0], blocks.shape[1 + self.kv.block_dim]
        if not blocks.numel():
            return out
        x = blocks.float().view(self._grouped(n_layers, n_blocks))
        amax = x.abs().amax(dim=self._reduced(), keepdim=True)
        # Products, not divisions: a value times its group's float32 reciprocal (one IEEE division
        # a group, not one a value: no faster on the H200, whose kernels are not bound by it, but
        # one rounding rule fewer to match), and the scale as amax times the reciprocal of qmax;
        # float32 products are the same on every device, so codec_kernel.py and this path give the
        # same bytes. The scale is at least float32's smallest normal (for a group of zeros too),
        # so that its reciprocal is finite.
        scale = (amax * (1.0 / self.format.qmax)).clamp_(min=SCALE_MIN)
        q = x * scale.reciprocal()
        nv = self.value_bytes(n_layers, n_blocks)
        values = out[:nv]
        if self.format.name == "fp8":
            values.view(torch.float8_e4m3fn).copy_(q.clamp_(-FP8_MAX, FP8_MAX).view(-1))
        elif self.format.name == "int8":
            values.view(torch.int8).copy_(q.round_().clamp_(-127, 127).view(-1))
        else:  # int4: two values a byte, the even one in the low half
            u = (q.round_().clamp_(-7, 7) + 8).to(torch.uint8).view(-1, 2)
            torch.bitwise_or(u[:, 0], u[:, 1] << 4, out=values)
        out[nv:].view(torch.float32).copy_(scale.view(-1))
        return out

    def decode(self, payload: torch.Tensor, n_layers: int, n_blocks: int) -> torch.Tensor:
        """The blocks a payload reconstructs ([n_layers, *layer_shape(n)], the KV dtype)."""
        data = self._checked(payload, n_layers, n_blocks)
        if not data.numel():
            return torch.empty(n_layers, *self.kv.layer_shape(n_blocks), dtype=self.kv.dtype, device=data.device)
        nv = self.value_bytes(n_layers, n_blocks)
        values = data[:nv]
        if self.format.name == "fp8":
            q = values.view(torch.float8_e4m3fn).float()
        elif self.format.name == "int8":
            q = values.view(torch.int8).float()
        else:
            q = torch.stack((values & 15, values >> 4), dim=1).view(-1).float() - 8
        scale = data[nv:].view(torch.float32).view(self.scale_shape(n_layers, n_blocks))
        x = q.view(self._grouped(n_layers, n_blocks)) * scale
        return x.to(self.kv.dtype).view(n_layers, *self.kv.layer_shape(n_blocks))


def reconstruction_error(original: torch.Tensor, reconstructed: torch.Tensor) -> dict[str, list[float]] | None:
    """Per layer (axis 0): the largest and mean absolute error, and each relative to the layer's
    values (largest error / largest magnitude, mean error / mean magnitude; 0 for a layer of zeros).
    None for no blocks (a one-token prompt moves none)."""
    if not original.numel():
        return None
    n = original.shape[0]
    x = original.float().reshape(n, -1)
    err = (reconstructed.float().reshape(n, -1) - x).abs()
    mag = x.abs()
    max_abs, mean_abs = err.amax(dim=1), err.mean(dim=1)
    max_rel = torch.where(mag.amax(dim=1) > 0, max_abs / mag.amax(dim=1), torch.zeros_like(max_abs))
    mean_rel = torch.where(mag.mean(dim=1) > 0, mean_abs / mag.mean(dim=1), torch.zeros_like(mean_abs))
    return {k: [float(v) for v in t.cpu()] for k, t in
            (("max_abs", max_abs), ("mean_abs", mean_abs), ("max_rel", max_rel), ("mean_rel", mean_rel))}


def device_ids(block_ids: list[int], device: torch.device) -> torch.Tensor:
    ids = torch.tensor(list(block_ids), dtype=torch.int64)
    # pinned and non_blocking: a plain copy would wait for the stream (the forward pass before it)
    return ids.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else ids
