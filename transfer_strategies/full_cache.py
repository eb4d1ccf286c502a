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
        n_layers = len(self.kv_layers)
        ids = torch.tensor(req.block_ids, dtype=torch.int64, device=self.device)
        self.post(req, 0, n_layers + 1, ids)
        for layer in range(n_layers):
            self.post(req, layer + 1, n_layers + 1, self.kv_layers[layer])

    def receive(self, req: TransferRequest) -> None:
        ids_msg, *layer_msgs = self.collect(req)
        sender_ids = ids_msg.payload.view(torch.int64)
        for layer, msg in enumerate(layer_msgs):
            whole = msg.payload.view(self.kv_layers[0].dtype).view(self.layer_shape(-1))
            self.scatter(req, layer, whole.index_select(self.block_dim, sender_ids))
