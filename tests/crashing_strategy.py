"""A strategy whose decode worker dies on its third transfer (the run's warm-up request and one
measured request come first): the harness must notice, stop in bounded time, keep what it
recorded and leave no engine process behind."""

import os

from transfer_strategies.fused import FusedConnector


class CrashOnThirdReceive(FusedConnector):
    received = 0

    def receive(self, req):
        CrashOnThirdReceive.received += 1
        if CrashOnThirdReceive.received == 3:
            os._exit(17)
        super().receive(req)
