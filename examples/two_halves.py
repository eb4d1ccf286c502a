"""A strategy from outside the project: each request's KV in two messages, the first half of
the layers and then the second half (between per-layer sends and `fused`).

    PYTHONPATH=$PWD python -m harness strategy=custom strategy.name=two_halves \
        strategy.module=examples.two_halves strategy.connector=TwoHalvesConnector
"""

from transfer_strategies.base import TransferConnector


class TwoHalvesConnector(TransferConnector):
    def halves(self):
        n = len(self.kv_layers)
        return range(0, n // 2), range(n // 2, n)

    def send(self, req):
        for i, layers in enumerate(self.halves()):
            buf = self.empty(len(layers), n_blocks=len(req.block_ids))
            for j, layer in enumerate(layers):
                self.gather(layer, req.block_ids, out=buf[j])
            self.post(req, i, 2, buf)

    def receive(self, req):
        for msg, layers in zip(self.collect(req), self.halves()):
            data = self.view_payload(msg.payload, len(layers), n_blocks=len(req.block_ids))
            for j, layer in enumerate(layers):
                self.scatter(req, layer, data[j])
