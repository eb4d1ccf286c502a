"""Strategies whose worker dies on the second measured transfer (after the run's warm-up
requests and one measured request), on either side: the harness must notice, stop in bounded
time, keep what it recorded and leave no engine process behind."""

import os

from harness.workload import is_warmup
from transfer_strategies.fused import FusedConnector
from transfer_strategies.per_request_blocks import PerRequestBlocksConnector


class CrashOnSecondReceive(FusedConnector):
    received = 0

    def receive(self, req):
        if not is_warmup(req.transfer_id):
            CrashOnSecondReceive.received += 1
            if CrashOnSecondReceive.received == 2:
                os._exit(17)
        super().receive(req)


class DiesMidSend(PerRequestBlocksConnector):
    """The prefill worker dies halfway through its second measured transfer's messages (one per
    layer): the decode worker holds part of a transfer that will never complete."""

    sent = 0

    def begin_send(self, req, streaming: bool = False) -> None:
        self.measured = not is_warmup(req.transfer_id)
        DiesMidSend.sent += self.measured
        super().begin_send(req, streaming)

    def post(self, req, payload, index: int = 0, count: int = 1) -> None:
        if self.measured and DiesMidSend.sent == 2 and index == count // 2:
            self.worker.channel.flush()  # the first half is out
            os._exit(19)
        super().post(req, payload, index, count)
