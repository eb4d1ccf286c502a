"""layerwise: each layer's blocks leave as soon as the prefill forward pass has computed that
layer (vLLM's `save_kv_layer` hook), so the transfer overlaps the rest of the prefill; the
decode forward pass waits for each layer just before it needs it (`wait_for_layer_load`).

Sends are posted without waiting and completed in `wait_for_save`, after the last layer.
One message per layer, like `per_request_blocks`, but started L-1 layers earlier.
"""

import torch

from transfer_strategies.base import TransferConnector, TransferRequest


class LayerwiseConnector(TransferConnector):
    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]):
        super().register_kv_caches(kv_caches)
        self.layer_index = {name: i for i, name in enumerate(self.layer_names)}
        self._loading: dict[str, list] = {}  # transfer id -> [request, layers scattered so far]

    # prefill side
    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs) -> None:
        sends = self._meta().sends
        if not sends:
            return
        layer = self.layer_index[layer_name]
        for req in sends:
            if layer == 0:
                self.begin_send(req, sync=False)
            self.post(req, layer, len(self.kv_layers), self.gather_to_send(layer, req.block_ids))

    def wait_for_save(self) -> None:
        if not self.has_connector_metadata():
            return
        if not self.is_producer:
            self._load_upto(len(self.kv_layers) - 1)  # a step whose forward skipped attention
            return
        for req in self._meta().sends:
            if req.messages == 0:  # the forward pass ran no attention layer for it
                self.begin_send(req)
                for layer in range(len(self.kv_layers)):
                    self.post(req, layer, len(self.kv_layers), self.gather_to_send(layer, req.block_ids))
            self.end_send(req)

    # decode side
    def start_load_kv(self, forward_context, **kwargs) -> None:
        self._loading = {req.transfer_id: [req, 0] for req in self._meta().loads}
        for req, _ in self._loading.values():
            self.begin_receive(req)

    def wait_for_layer_load(self, layer_name: str) -> None:
        self._load_upto(self.layer_index[layer_name])

    def _load_upto(self, layer: int) -> None:
        """Scatter every loading request's layers up to `layer`, waiting for each to arrive."""
        for tid, state in list(self._loading.items()):
            req, done = state
            for i in range(done, layer + 1):
                (msg,) = self.collect(req, i)
                # This step's new token already sits in its slot of the last block; the prefill
                # engine's copy of that token's KV lands on top of it: the same token.
                self.scatter(req, i, self.view_payload(msg.payload, n_blocks=len(req.block_ids)))
            state[1] = max(done, layer + 1)
            if state[1] == len(self.kv_layers):
                self.end_receive(req)
                del self._loading[tid]
