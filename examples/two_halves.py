"""A strategy from outside the project: each request's KV in two messages, the first layers and
then the rest (between per-layer sends and `fused`); where it splits is its one parameter.

    PYTHONPATH=$PWD python -m harness strategy=custom strategy.name=two_halves \
        strategy.module=examples.two_halves strategy.connector=TwoHalvesConnector 'strategy.params={split:1}'
"""

from dataclasses import dataclass

from transfer_strategies.base import TransferConnector


class TwoHalvesConnector(TransferConnector):
    @dataclass(frozen=True)
    class Params:  # checked before any engine starts: strategy.params={split:x} is exit 2 and one line
        split: int | None = None  # layers in the first message (None: half of them)

    def halves(self):
        split = self.n_layers // 2 if self.params.split is None else self.params.split
        return range(0, split), range(split, self.n_layers)

    def send(self, req):
        for i, layers in enumerate(self.halves()):
            self.post(req, self.gather(req.block_ids, layers), i, 2)

    def receive(self, req):
        for msg, layers in zip(self.collect(req), self.halves()):
            self.scatter(req, msg.payload, layers)
