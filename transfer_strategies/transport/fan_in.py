"""A decode worker fed by several prefill workers (2P1D and up, serving mode): one channel per
prefill worker, all putting their messages into one inbox, so that the decode worker waits and
polls as with a single channel. Transfer ids are unique across prefill workers (the router
gives each request its own), so messages cannot collide; staging regions can (each channel has
its own buffer), so the inbox keys them by channel (tag). The other way round, a prefill worker
sending to several decode workers, is fan_out.py. A channel that closes (its prefill worker
gone) fails only the transfers it would have brought (inbox.py)."""

from __future__ import annotations

from transfer_strategies.transport.inbox import Inbox, InboxReceiver


class FanIn(InboxReceiver):
    def __init__(self, receivers: list, inbox: Inbox):
        self.receivers, self.inbox = receivers, inbox

    def acknowledge(self, keys: list) -> None:
        for r in self.receivers:  # each frees its own channel's regions among them
            r.acknowledge(keys)

    def close(self) -> None:
        for r in self.receivers:
            r.close()
