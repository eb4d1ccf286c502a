"""full_cache: the seed's approach. Every layer's entire KV cache tensor is sent, one message
per layer, whatever the request uses; the receiver takes the request's blocks out of it.

The sender's block ids go first, in a small message of their own, since the receiver must
know where in the sender's cache the request lives. Bytes moved = the whole cache, so size
the KV cache down for this strategy (conf/strategy/full_cache.yaml does) and read the size
in the records (kv_cache_bytes).
"""

import torch

from transfer_strategies.base import TransferConnector, TransferRequest


class FullCacheConnector(TransferConnector):
    def send(self, req: TransferRequest) -> None:
        n = self.n_layers
        self.post(req, torch.tensor(req.block_ids, dtype=torch.int64, device=self.kv.device), 0, n + 1)
        for layer in range(n):
            self.post(req, self.kv.layers[layer], layer + 1, n + 1)  # not in the staging buffer: the channel copies it

    def receive(self, req: TransferRequest) -> None:
        ids_msg, *layer_msgs = self.collect(req)
        sender_ids = ids_msg.payload.view(torch.int64)
        for layer, msg in enumerate(layer_msgs):
            whole = self.kv.view(msg.payload, n_layers=1)  # the sender's whole cache of this layer
            self.scatter(req, self.kv.take(whole, sender_ids), [layer])
