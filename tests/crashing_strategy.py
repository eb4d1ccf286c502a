"""A strategy whose decode worker dies on its second transfer: the harness must notice, stop
in bounded time, keep what it recorded and leave no engine process behind."""

import os

from transfer_strategies.fused import FusedConnector


class CrashOnSecondReceive(FusedConnector):
    received = 0

    def receive(self, req):
        CrashOnSecondReceive.received += 1
        if CrashOnSecondReceive.received == 2:
            os._exit(17)
        super().receive(req)
