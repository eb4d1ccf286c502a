"""A strategy whose prefill worker never sends: the decode request, submitted early and parked
in vLLM, must fail within run.transfer_timeout_s with its reason, and leave no block held. It
prepares nothing either, so that it holds no staging space (nothing left for the run to wait on)."""

from transfer_strategies.fused import FusedConnector


class NeverSends(FusedConnector):
    def prepare_send(self, req):
        return

    def send(self, req):
        return
