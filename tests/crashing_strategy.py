"""Strategies whose worker dies on its third transfer (the run's warm-up request and one
measured request come first), on either side: the harness must notice, stop in bounded time,
keep what it recorded and leave no engine process behind."""

import os

from transfer_strategies.fused import FusedConnector
from transfer_strategies.per_request_blocks import PerRequestBlocksConnector


class CrashOnThirdReceive(FusedConnector):
    received = 0

    def receive(self, req):
        CrashOnThirdReceive.received += 1
        if CrashOnThirdReceive.received == 3:
            os._exit(17)
        super().receive(req)


class DiesMidSend(PerRequestBlocksConnector):
    """The prefill worker dies halfway through its third transfer's messages (one per layer): the
    decode worker holds part of a transfer that will never complete."""

    sent = 0

    def begin_send(self, req, streaming: bool = False) -> None:
        DiesMidSend.sent += 1
        super().begin_send(req, streaming)

    def post(self, req, payload, index: int = 0, count: int = 1) -> None:
        if DiesMidSend.sent == 3 and index == count // 2:
            self.worker.channel.flush()  # the first half is out
            os._exit(19)
        super().post(req, payload, index, count)
