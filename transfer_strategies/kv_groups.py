"""A hybrid model's KV cache as vLLM's hybrid memory allocator keeps it (Qwen3-Next: Gated DeltaNet
layers beside full-attention layers), seen as the pages a transfer moves.

vLLM puts layers of one kind in a KV cache group, each group with a block table of its own, and
every group's blocks in shared pools of equal pages: one pool per layer position within a group,
each page a block of one group's layer there. A full-attention group's blocks hold tokens (the
attention block size, raised until a page holds a recurrent state: 160 tokens for tiny-hybrid,
asked for 16); a recurrent group's (vLLM's MambaSpec: Gated DeltaNet, Mamba) hold a request's
state whatever its length, one block per request without prefix caching (which the harness turns
off for these models). Two engines of one model have the same groups, so a request's blocks,
listed group after group (`KVGroups.request_blocks`), name the same pages on both: a strategy
moves those pages of every pool as it moves a Llama's blocks of every layer.

A recurrent state cannot be cut back by a token, and a decode engine computes a prompt's last
token itself (it must, for its first output): the prefill engine computes the prompt but its
last token (scheduler.py, `RequestTracker.new_request`), so its state and KV are those the
decode engine continues from, as vLLM's Mooncake connector does for these models.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


def blocks_for(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size) if num_tokens > 0 else 0


@dataclass(frozen=True)
class KVGroups:
    block_sizes: tuple[int, ...]  # tokens per block, per group
    states: tuple[bool, ...]  # per group: its blocks hold a request's recurrent state, not tokens

    @classmethod
    def of(cls, kv_cache_config, block_size: int) -> KVGroups:
        """The engine's groups (kv_cache_config: vLLM's, None where it passes none: one group)."""
        groups = getattr(kv_cache_config, "kv_cache_groups", None) or []
        if len(groups) <= 1:
            return cls((block_size,), (False,))
        from vllm.v1.kv_cache_interface import MambaSpec

        states = tuple(isinstance(g.kv_cache_spec, MambaSpec) for g in groups)
        if not any(states):  # the harness keeps these in one group (disable_hybrid_kv_cache_manager)
            raise NotImplementedError(f"{len(groups)} KV cache groups of attention layers (sliding windows beside "
                                      f"full attention?): these strategies move one, or a hybrid model's")
        return cls(tuple(g.kv_cache_spec.block_size for g in groups), states)

    @property
    def hybrid(self) -> bool:
        """Some layers keep a recurrent state instead of KV per token."""
        return any(self.states)

    @property
    def token_block_size(self) -> int:
        """Tokens per block of the groups that hold tokens."""
        return next(size for size, state in zip(self.block_sizes, self.states, strict=True) if not state)

    def request_blocks(self, per_group: Sequence[Sequence[int]], num_tokens: int) -> list[int]:
        """A request's blocks holding prompt tokens [0, num_tokens) and its recurrent states,
        group after group (vLLM's block ids, one list per group); none for no tokens."""
        if len(per_group) != len(self.block_sizes):
            raise RuntimeError(f"{len(per_group)} KV cache groups in a request, {len(self.block_sizes)} in the engine")
        if num_tokens <= 0:
            return []
        out: list[int] = []
        for ids, size, state in zip(per_group, self.block_sizes, self.states, strict=True):
            out += list(ids) if state else list(ids)[:blocks_for(num_tokens, size)]
        return out


def page_pools(kv_caches: dict[str, torch.Tensor], num_blocks: int) -> dict[str, torch.Tensor]:
    """The pools of pages every layer's KV cache views (a hybrid model's), each as [num_blocks,
    page bytes] uint8, named after the first layer seen in it: what a transfer moves."""
    pools: dict[int, tuple[str, torch.Tensor]] = {}
    for name, t in kv_caches.items():
        if not isinstance(t, torch.Tensor) or t.shape[0] != num_blocks:
            raise NotImplementedError(f"KV cache of layer {name}: {type(t).__name__} "
                                      f"{tuple(getattr(t, 'shape', ()))}, expected blocks first ({num_blocks})")
        page = t.stride(0) * t.element_size()
        if t.data_ptr() in pools:
            if pools[t.data_ptr()][1].shape[1] != page:
                raise RuntimeError(f"layer {name} views its pool in pages of {page} bytes, another layer in "
                                   f"{pools[t.data_ptr()][1].shape[1]}")
            continue
        storage = t.untyped_storage()
        offset = t.data_ptr() - storage.data_ptr()
        if offset + num_blocks * page > storage.nbytes():
            raise RuntimeError(f"layer {name}: {num_blocks} pages of {page} bytes pass its storage's end")
        pool = torch.empty(0, dtype=torch.uint8, device=t.device)
        pool.set_(storage, offset, (num_blocks, page), (page, 1))
        pools[t.data_ptr()] = (name, pool)
    return {f"pool:{name}": pool for name, pool in pools.values()}
