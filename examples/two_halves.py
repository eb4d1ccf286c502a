"""A strategy from outside the project: each request's KV in two messages, the first half of
the layers and then the second half (between per-layer sends and `fused`).

    PYTHONPATH=$PWD python -m harness strategy=custom strategy.name=two_halves \
        strategy.module=examples.two_halves strategy.connector=TwoHalvesConnector
"""

from transfer_strategies.base import TransferConnector


class TwoHalvesConnector(TransferConnector):
    def halves(self):
        return range(0, self.n_layers // 2), range(self.n_layers // 2, self.n_layers)

    def send(self, req):
        for i, layers in enumerate(self.halves()):
            self.post(req, self.gather(req.block_ids, layers), i, 2)

    def receive(self, req):
        for msg, layers in zip(self.collect(req), self.halves()):
            self.scatter(req, msg.payload, layers)
