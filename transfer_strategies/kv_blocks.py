"""The block copy engine: one engine's KV cache seen as blocks, and the copies of any blocks of
any layers into a flat buffer (gather) and back (scatter), whatever layout the attention
backend chose.

Layouts: each layer is one tensor with a block axis (sized num_blocks); the axes before it
(K/V on some GPU backends) split a layer into "pieces". In memory order (see
`in_memory_order`) every piece is contiguous with blocks first, so a run of consecutive blocks
is one contiguous range: gathering a request's blocks of every layer is then one batched copy
of all (piece, run) slices, and scattering one split copy. Fragmented block ids, or a layout
whose pieces are not contiguous, fall back to indexed copies per layer.

A buffer of blocks is laid out [layers, *layer_shape(n_blocks)]: the layers in the order asked
for, each as this engine holds one layer, with n_blocks in place of num_blocks.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence

import numpy as np
import torch

# Below this, a CPU gather is one memcpy per piece on the calling thread: waking OpenMP's
# sleeping threads for torch's parallel copy cost more than it saved (1 MiB: 0.29 vs 0.50 ms).
SMALL_CPU_COPY = 4 << 20


def in_memory_order(t: torch.Tensor) -> torch.Tensor:
    """A view of t with its axes in memory order (largest stride first). Some GPU backends
    allocate the KV cache in one axis order and hand it out permuted; in memory order every
    per-block slice is contiguous, and both engines agree on the bytes of a block."""
    order = sorted(range(t.dim()), key=lambda d: -t.stride(d))
    view = t.permute(order)
    return view if view.is_contiguous() else t


def block_runs(block_ids: Sequence[int]) -> list[tuple[int, int]]:
    """Consecutive block ids as (first, count) runs: [4, 5, 6, 9] -> [(4, 3), (9, 1)]."""
    runs: list[tuple[int, int]] = []
    for b in block_ids:
        if runs and b == runs[-1][0] + runs[-1][1]:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((b, 1))
    return runs


def packed_runs(block_ids: Sequence[int]) -> list[tuple[int, int, int]]:
    """(position in block_ids, first block, count) per run of consecutive ids."""
    out, at = [], 0
    for first, n in block_runs(block_ids):
        out.append((at, first, n))
        at += n
    return out


def few_runs(n_runs: int, n_blocks: int) -> bool:
    # A slice copy per run beats one indexed copy when runs are long; with many short runs the
    # launches (on a GPU) cost more than the indexed kernel's slower element loop.
    return n_runs <= max(4, n_blocks // 8)


class KVBlocks:
    """One engine's KV cache (one tensor per layer) as blocks."""

    def __init__(self, kv_caches: dict[str, torch.Tensor], num_blocks: int, n_heads: int | None = None):
        """n_heads: the KV heads this worker holds (its tensor-parallel share), to find the head
        axis; None: blocks are not split by head (digests then cover a block's every head)."""
        for name, t in kv_caches.items():
            if not isinstance(t, torch.Tensor):
                raise NotImplementedError(f"KV cache of layer {name} is a {type(t).__name__}: "
                                          f"expected one tensor per layer")
        self.names = list(kv_caches)
        self.layers = [in_memory_order(kv_caches[n]) for n in self.names]
        self.num_blocks = num_blocks
        first = self.layers[0]
        # The attention backend decides the layout; the block axis is the one sized num_blocks.
        dims = [d for d, s in enumerate(first.shape) if s == num_blocks]
        if not dims:
            raise RuntimeError(f"no axis of size num_blocks={num_blocks} in KV shape {tuple(first.shape)}")
        self.block_dim = dims[0]
        self.device, self.dtype = first.device, first.dtype
        self._block_rest = tuple(first.shape[self.block_dim + 1:])  # a block's axes after the block axis
        lead = list(itertools.product(*(range(n) for n in first.shape[:self.block_dim])))
        self._pieces = [[t[i] for i in lead] for t in self.layers]  # per layer: [blocks, *rest] each
        self.contiguous = all(p.is_contiguous() for ps in self._pieces for p in ps)
        # The head axis: after the block axis, before the last (head size), sized n_heads. Where
        # two axes qualify (as many heads as tokens in a block) the first is taken: heads before
        # tokens, as the CPU backend and the HND layout hold them; `head_dim_certain` says so.
        candidates = [d for d in range(self.block_dim + 1, first.dim() - 1) if first.shape[d] == n_heads]
        self.head_dim = candidates[0] if candidates else None
        self.head_dim_certain = len(candidates) == 1
        self.n_heads = n_heads if candidates else 1

    # ---------------------------------------------------------------- shapes
    @property
    def n_layers(self) -> int:
        return len(self.layers)

    def layer_shape(self, n_blocks: int) -> list[int]:
        """Shape of n_blocks blocks of one layer."""
        shape = list(self.layers[0].shape)
        shape[self.block_dim] = n_blocks
        return shape

    def block_bytes(self) -> int:
        """Bytes of one block of one layer."""
        return math.prod(self.layer_shape(1)) * self.dtype.itemsize

    def nbytes(self, n_blocks: int, n_layers: int) -> int:
        return n_layers * n_blocks * self.block_bytes()

    def cache_bytes(self) -> int:
        return self.nbytes(self.num_blocks, self.n_layers)

    def layout(self) -> dict:
        """What two engines must agree on to exchange blocks (not num_blocks)."""
        return {"layers": self.n_layers, "block_shape": self.layer_shape(-1), "block_dim": self.block_dim,
                "head_dim": self.head_dim, "dtype": str(self.dtype)}

    def head_dim_in_piece(self) -> int | None:
        """The head axis of a piece ([blocks, ...], see `pieces`)."""
        return None if self.head_dim is None else self.head_dim - self.block_dim

    def head_inner(self) -> int:
        """Elements of one head in one row: the axes after the head axis."""
        return math.prod(self.layers[0].shape[self.head_dim + 1:]) if self.head_dim is not None else 1

    def per_head(self, data: torch.Tensor) -> torch.Tensor:
        """Blocks in the KV dtype (any number of layers and blocks, this engine's layout) as
        [rows, heads, elements of one head in a row]: a head's share of them is a slice of axis 1."""
        if self.head_dim is None:
            return data.reshape(-1, 1, 1)
        return data.reshape(-1, self.n_heads, self.head_inner())

    def typed(self, data: torch.Tensor) -> torch.Tensor:
        """Flat bytes (or a tensor of the KV dtype) as a flat tensor of the KV dtype."""
        return data.view(-1).view(torch.uint8).view(self.dtype) if data.dtype != self.dtype else data.view(-1)

    def view(self, data: torch.Tensor, n_layers: int) -> torch.Tensor:
        """Bytes (or a tensor of the KV dtype) viewed as [n_layers, *layer_shape(n)], n from the size."""
        typed = data.view(torch.uint8).view(self.dtype) if data.dtype != self.dtype else data
        n = typed.numel() // max(n_layers * math.prod(self.layer_shape(1)), 1)
        return typed.view(n_layers, *self.layer_shape(n))

    def take(self, blocks: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """Blocks `ids` (positions along the block axis) of a [layers, *layer_shape(n)] tensor."""
        return blocks.index_select(1 + self.block_dim, ids.to(blocks.device))

    def pieces(self, layers: Sequence[int]) -> list[torch.Tensor]:
        """The contiguous [blocks, *rest] pieces of these layers, in buffer order."""
        return [p for layer in layers for p in self._pieces[layer]]

    # ---------------------------------------------------------------- copies
    def gather_plan(self, block_ids: Sequence[int], out: torch.Tensor, layers: Sequence[int]) -> Callable[[], None]:
        """A function that copies blocks `block_ids` of `layers` into out ([len(layers),
        *layer_shape(len(block_ids))]). The slicing is done now, so a caller can plan before
        the KV exists (before the forward pass) and copy when it does. `out` may live on
        another device (a peer GPU's buffer): the copy then crosses the link."""
        if not block_ids or not layers:
            return lambda: None
        runs = block_runs(block_ids)
        if self.contiguous and out.device == self.device and few_runs(len(runs), len(block_ids)):
            srcs = [p.narrow(0, first, n) for p in self.pieces(layers) for first, n in runs]
            flat = out.view(-1, *self._block_rest)
            if self.device.type == "cpu" and out.nbytes < SMALL_CPU_COPY:
                np_srcs = [s.view(torch.uint8).numpy() for s in srcs]
                np_dst = flat.view(torch.uint8).numpy()
                return lambda: np.concatenate(np_srcs, out=np_dst)
            return lambda: torch.cat(srcs, out=flat)
        idx = torch.tensor(list(block_ids), dtype=torch.long, device=self.device)

        def per_layer() -> None:
            for j, layer in enumerate(layers):
                if out.device == self.device:  # straight into the buffer, no temporary
                    torch.index_select(self.layers[layer], self.block_dim, idx, out=out[j])
                else:
                    out[j].copy_(torch.index_select(self.layers[layer], self.block_dim, idx))
        return per_layer

    def gather(self, block_ids: Sequence[int], out: torch.Tensor, layers: Sequence[int]) -> torch.Tensor:
        self.gather_plan(block_ids, out, layers)()
        return out

    def scatter(self, block_ids: Sequence[int], src: torch.Tensor, layers: Sequence[int]) -> None:
        """The inverse of `gather`: src ([len(layers), *layer_shape(len(block_ids))]) into this
        engine's blocks `block_ids` of `layers`."""
        if not block_ids or not layers:
            return
        runs = block_runs(block_ids)
        if self.contiguous and src.device == self.device and few_runs(len(runs), len(block_ids)):
            flat = src.reshape(-1, *self._block_rest)  # a view unless src was cut from a larger buffer
            dst = [p.narrow(0, first, n) for p in self.pieces(layers) for first, n in runs]
            torch.split_with_sizes_copy(flat, [d.shape[0] for d in dst], out=dst)
            return
        idx = torch.tensor(list(block_ids), dtype=torch.long, device=self.device)
        for j, layer in enumerate(layers):
            self.layers[layer].index_copy_(self.block_dim, idx, src[j].to(self.device))
