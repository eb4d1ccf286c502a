"""fused: all of a request's blocks, across all layers, packed into one contiguous buffer and
sent as one message; the receiver scatters the blocks into its own block ids.

One message per request means one header and one wire transfer however many layers the model
has: the fewest messages any strategy can send. The cost is a gather on the sender and a
scatter on the receiver, each one pass over the request's KV.
"""

from transfer_strategies.base import TransferConnector, TransferRequest


class FusedConnector(TransferConnector):
    def prepare_send(self, req: TransferRequest) -> None:  # before the forward pass: off the clock
        req.prepared = self.gather_plan(req.block_ids)

    def send(self, req: TransferRequest) -> None:
        self.post(req, req.prepared())

    def receive(self, req: TransferRequest) -> None:
        (msg,) = self.collect(req)
        self.scatter(req, msg.payload)
