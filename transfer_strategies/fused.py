"""fused: all of a request's blocks, across all layers, packed into one contiguous buffer and
sent as one message; the receiver scatters the blocks into its own block ids.

One message per request means one header and one wire transfer however many layers the model
has: the fewest messages any strategy can send. The cost is a gather on the sender and a
scatter on the receiver, each one pass over the request's KV.
"""

import torch

from transfer_strategies.base import TransferConnector, TransferRequest


class FusedConnector(TransferConnector):
    def send(self, req: TransferRequest) -> None:
        n_layers, n_blocks = len(self.kv_layers), len(req.block_ids)
        buf = torch.empty((n_layers, *self.layer_shape(n_blocks)), dtype=self.kv_layers[0].dtype,
                          device=self.device)
        for layer in range(n_layers):
            self.gather(layer, req.block_ids, out=buf[layer])
        self.post(req, 0, 1, buf)

    def receive(self, req: TransferRequest) -> None:
        (msg,) = self.collect(req)
        n_layers, n_blocks = len(self.kv_layers), len(req.block_ids)
        layers = self.view_payload(msg.payload, n_layers, n_blocks=n_blocks)
        keep = req.block_ids[req.skip_blocks:]
        for layer in range(n_layers):
            self.scatter(layer, keep, layers[layer].narrow(self.block_dim, req.skip_blocks, len(keep)))
