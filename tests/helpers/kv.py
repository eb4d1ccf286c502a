"""KV caches in memory, in the layouts vLLM's backends use (block axis first on CPU, after a K/V
axis on GPU)."""

import torch

from transfer_strategies.kv_blocks import KVBlocks

NUM_BLOCKS = 32


def layer_shape(block_dim: int) -> list[int]:
    return [NUM_BLOCKS, 4, 3, 8] if block_dim == 0 else [2, NUM_BLOCKS, 4, 3]


def make_kv(block_dim: int, n_layers: int = 3, fill=torch.randn) -> KVBlocks:
    return KVBlocks({f"layer.{i}": fill(layer_shape(block_dim)) for i in range(n_layers)}, NUM_BLOCKS)
