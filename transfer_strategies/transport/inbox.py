"""The decode worker's side of a channel: messages parked by transfer id until it uses them
(Inbox), and the calls it makes of the channel, answered from them (InboxReceiver: every
receiver, and a fan-in of them)."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch

from transfer_strategies.transport.message import Message


@dataclass
class _Parked:
    message: Message
    region: int | None  # where its payload sits in the staging buffer; None once it is elsewhere
    taken: bool = False  # handed out by `wait`: the decode worker may be reading it in place


@dataclass
class _Transfer:
    parked: dict[int, _Parked] = field(default_factory=dict)
    count: int | None = None


class Inbox:
    """Filled by the receiver thread (`put`), emptied by the decode worker (`wait`, `release`).
    Every wait is bounded by timeout_s. Fed by `channels` receiver threads (fan-in: one per
    prefill worker); once every one has failed (`fail`), every waiter wakes with the cause. While
    one still runs, the others' transfers that never came end as any late KV does: at the timeout,
    reported to vLLM as failed loads, while the other prefill workers' KV goes on arriving."""

    def __init__(self, timeout_s: float, channels: int = 1):
        self.timeout_s = timeout_s
        self._channels_left = channels
        self._cond = threading.Condition()
        self._transfers: dict[str, _Transfer] = {}
        self._staged: dict[int, _Parked] = {}  # staging region -> the message whose payload is there
        self._error: BaseException | None = None
        self._puts = 0  # messages put so far
        self._on_complete: dict[str, Callable[[list[Message]], None]] = {}  # see when_complete
        # each message on to other workers before it is parked (relay.py: once parked, the decode
        # worker may take it and release its staging space to the next payload)
        self.forward: Callable[[Message], None] | None = None

    def put(self, msg: Message, region: int | None = None) -> None:
        if self.forward is not None:
            self.forward(msg)
        done = None
        with self._cond:
            transfer = self._transfers.setdefault(msg.transfer_id, _Transfer())
            parked = transfer.parked[msg.index] = _Parked(msg, region)
            if msg.count:  # 0: more messages follow, their number not known yet (chunkwise)
                transfer.count = msg.count
            self._puts += 1
            if region is not None:
                self._staged[region] = parked
            if msg.transfer_id in self._on_complete and self._complete(msg.transfer_id):
                done = self._on_complete.pop(msg.transfer_id), self._take(msg.transfer_id)
            self._cond.notify_all()
        if done is not None:  # outside the lock: it releases the transfer
            fn, msgs = done
            fn(msgs)

    def when_complete(self, transfer_id: str, fn: Callable[[list[Message]], None]) -> None:
        """fn(messages) once every message of this transfer has arrived: at once if they have,
        else from the receiver thread as it puts the last one. For transfers no engine step
        waits for (a request that loads nothing, a cancelled one): the engine may not step
        again, and the sender's staging space must come back all the same."""
        with self._cond:
            if not self._complete(transfer_id):
                self._on_complete[transfer_id] = fn
                return
            msgs = self._take(transfer_id)
        fn(msgs)

    def _take(self, transfer_id: str) -> list[Message]:
        transfer = self._transfers[transfer_id]
        parked = [transfer.parked[i] for i in range(transfer.count)]
        for p in parked:
            p.taken = True
        return [p.message for p in parked]

    def fail(self, error: BaseException) -> None:
        with self._cond:
            self._channels_left -= 1
            if self._channels_left <= 0:
                self._error = error
                self._cond.notify_all()
                return
        print(f"[kv] a KV channel closed ({error}); {self._channels_left} still open", file=sys.stderr, flush=True)

    def _complete(self, transfer_id: str, index: int | None = None) -> bool:
        transfer = self._transfers.get(transfer_id)
        if transfer is None:
            return False
        if index is not None:
            return index in transfer.parked
        return transfer.count is not None and len(transfer.parked) == transfer.count

    def ready(self, transfer_ids: set[str], timeout_s: float = 0.0) -> set[str]:
        """The transfers among these whose every message has arrived; if none has, wait up to
        timeout_s for any message to arrive (the decode worker polls this once per engine step;
        a message for a request its engine has not admitted yet ends the wait too, so that the
        engine goes on to admit it)."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            puts = self._puts
            while True:
                if self._error is not None:
                    raise RuntimeError(f"KV channel closed while waiting for KV: {self._error}")
                done = {t for t in transfer_ids if self._complete(t)}
                left = deadline - time.monotonic()
                if done or left <= 0 or self._puts != puts:
                    return done
                self._cond.wait(left)

    def wait(self, transfer_id: str, index: int | None = None) -> list[Message]:
        """Block until message `index` (or every message) of a transfer has arrived."""
        deadline = time.monotonic() + self.timeout_s

        def ready() -> bool:
            return self._complete(transfer_id, index)

        with self._cond:
            while not ready():
                if self._error is not None:
                    raise RuntimeError(f"KV channel closed while waiting for {transfer_id}: {self._error}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no KV arrived for transfer {transfer_id} within {self.timeout_s:.0f} s")
                self._cond.wait(min(left, 1.0))
            if index is None:
                return self._take(transfer_id)
            parked = self._transfers[transfer_id].parked[index]
            parked.taken = True
            return [parked.message]

    def held(self) -> int:
        """Transfers with messages still here (0 once every transfer was used or dropped)."""
        with self._cond:
            return len(self._transfers)

    def release(self, transfer_id: str) -> list[int]:
        """Drop a transfer's messages once they have been used; returns the staging regions they
        held, now free."""
        with self._cond:
            transfer = self._transfers.pop(transfer_id, None)
            regions = [p.region for p in transfer.parked.values() if p.region is not None] if transfer else []
            for r in regions:
                del self._staged[r]
            return regions

    def evict(self, regions: Iterable[int], move: Callable[[torch.Tensor], torch.Tensor]) -> list[int]:
        """Move the payloads in these staging regions out (`move` returns a copy in memory of
        our own) unless the decode worker already has them; returns the regions now free.
        A region no message holds any more (released meanwhile) is skipped: its release freed it."""
        freed = []
        with self._cond:
            for r in regions:
                parked = self._staged.get(r)
                if parked is None or parked.taken:
                    continue
                parked.message.payload = move(parked.message.payload)
                parked.region = None
                del self._staged[r]
                freed.append(r)
        return freed


class InboxReceiver:
    """The calls a decode worker makes of its channel, answered from the channel's inbox (a
    receiver's own, or the one a fan-in's receivers share). Releasing a transfer hands the
    staging regions it freed to `acknowledge`: staged.py gives its own back to the prefill
    worker, fan_in.py asks each of its channels to."""

    inbox: Inbox

    def wait(self, transfer_id: str, index: int | None = None) -> list[Message]:
        """Block until message `index` (or every message) of a transfer has arrived."""
        return self.inbox.wait(transfer_id, index)

    def ready(self, transfer_ids: set[str], timeout_s: float = 0.0) -> set[str]:
        """Those transfers whose messages have all arrived (waiting up to timeout_s for one)."""
        return self.inbox.ready(transfer_ids, timeout_s)

    def when_complete(self, transfer_id: str, fn: Callable[[list[Message]], None]) -> None:
        self.inbox.when_complete(transfer_id, fn)

    def release(self, transfer_id: str) -> None:
        """Drop a transfer's messages once they have been used (their staging space is free again)."""
        self.acknowledge(self.inbox.release(transfer_id))

    def acknowledge(self, keys: list) -> None:
        """Free the staging regions among these inbox keys; a channel without a staging buffer has none."""
        return None
