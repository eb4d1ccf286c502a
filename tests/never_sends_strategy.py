"""A strategy whose prefill worker never sends: the decode request, submitted early and parked
in vLLM, must fail within run.transfer_timeout_s with its reason, and leave no block held."""

from transfer_strategies.fused import FusedConnector


class NeverSends(FusedConnector):
    def send(self, req):
        return
