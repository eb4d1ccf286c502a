"""layerwise: each layer's blocks leave as soon as the prefill forward pass has computed that
layer (vLLM's `save_kv_layer` hook), so the transfer overlaps the rest of the prefill; the
decode forward pass waits for each layer just before it needs it (`wait_for_layer_load`).

Sends are posted without waiting and completed in `wait_for_save`, after the last layer.
One message per layer, like `per_request_blocks`, but started L-1 layers earlier. Each layer's
staging region and copy are planned before the forward pass (`prepare_send`), so that the hook
inside it only launches a copy and rings a doorbell: planning there cost about 0.3 ms of
Python per layer and request (py-spy, results/gpu/session13); the hook now takes 0.16 ms per
layer and request on the H200 machine's host (hook_ms, the send record's sum over layers:
results/gpu/2026-12-04-s23/ttft/layerwise). A decode
request submitted early (parked in vLLM until its KV is in) is loaded whole by `receive`, as
every strategy's is: its forward pass only starts once the KV is there.
"""

import time

import torch

from transfer_strategies.base import TransferConnector, TransferRequest
from transfer_strategies.connector_config import ConnectorConfig


class LayerwiseConnector(TransferConnector):
    moves_hybrid = False  # streams by layer or by chunk: a hybrid model's pages are neither (kv_groups.py)

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config) -> bool:
        # A full CUDA-graph replay skips the per-layer hooks: a decode forward pass that loads
        # while it runs (the hand-off) would read KV that has not arrived (outputs wrong, digests
        # right), so vLLM must capture graphs piece by piece, between layers, where the hooks run.
        # Submitted early, a decode request runs only once its KV is whole (receive), and full
        # graphs only replay uniform decode batches, never the prefill engine's steps (where
        # save_kv_layer streams; a step without the hooks is sent whole by wait_for_save).
        return ConnectorConfig.parse(extra_config, cls.Params).harness.decode_submit != "early"

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]):
        super().register_kv_caches(kv_caches)
        self.layer_index = {name: i for i, name in enumerate(kv_caches)}
        self._loading: dict[str, list] = {}  # transfer id -> [request, layers scattered so far]

    # prefill side
    def prepare_send(self, req: TransferRequest) -> None:  # before the forward pass: off the clock
        req.prepared = [self.gather_plan(req.block_ids, [layer]) for layer in range(self.n_layers)]

    def send(self, req: TransferRequest) -> None:  # the forward pass ran no attention layer for it
        for layer, copy in enumerate(req.prepared):
            self.post(req, copy(), layer, self.n_layers)

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs) -> None:
        t0 = time.perf_counter()
        layer = self.layer_index[layer_name]
        sends = self.this_step().sends
        for req in sends:
            if layer == 0:
                self.begin_send(req, streaming=True)
            self.post(req, req.prepared[layer](), layer, self.n_layers)
        for req in sends:  # the hook's host time, shared by the requests it sent for
            req.progress.hook_ms += (time.perf_counter() - t0) * 1e3 / len(sends)

    # decode side
    def receive(self, req: TransferRequest) -> None:
        for layer, msg in enumerate(self.collect(req)):
            self.scatter(req, msg.payload, [layer])

    def start_load_kv(self, forward_context, **kwargs) -> None:
        self._loading = {req.transfer_id: [req, 0] for req in self.this_step().loads}
        for req, _ in self._loading.values():
            self.begin_receive(req)

    def wait_for_layer_load(self, layer_name: str) -> None:
        self._load_upto(self.layer_index[layer_name])

    def wait_for_save(self) -> None:
        if self.has_connector_metadata() and not self.is_producer:
            self._load_upto(self.n_layers - 1)  # a step whose forward pass skipped attention
            return
        super().wait_for_save()

    def _load_upto(self, layer: int) -> None:
        """Scatter every loading request's layers up to `layer`, waiting for each to arrive."""
        for tid, state in list(self._loading.items()):
            req, done = state
            for i in range(done, layer + 1):
                (msg,) = self.collect(req, i)
                # This step's new token already sits in its slot of the last block; the prefill
                # engine's copy of that token's KV lands on top of it: the same token.
                self.scatter(req, msg.payload, [i])
            state[1] = max(done, layer + 1)
            if state[1] == self.n_layers:
                self.end_receive(req)
                del self._loading[tid]
