"""The negative control (`check.corrupt=true`): every request's KV is damaged after the strategy
has received it through its own, unchanged path, so the run must fail its digests and most of
its outputs. If it did not, the checks would be proving nothing.

The damage: the signs of the first block this engine received (past its own prefix-cache hits)
flipped in the last layer. The last layer, so that the decode step that follows reads it even
for a strategy that receives layer by layer inside the forward pass (layerwise finishes a
request just before the last layer's attention runs).
"""

from __future__ import annotations

from transfer_strategies.kv_blocks import KVBlocks
from transfer_strategies.scheduler import TransferRequest


def corrupt_received(kv: KVBlocks, req: TransferRequest) -> None:
    if req.skip_blocks >= len(req.block_ids):
        return  # nothing was received: every block came from this engine's own cache
    block = req.block_ids[req.skip_blocks]
    kv.layers[-1].narrow(kv.block_dim, block, 1).neg_()
