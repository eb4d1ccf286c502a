"""The decode worker's requests that wait inside vLLM for their KV (early submission, see
scheduler.py): which are parked, which vLLM may release, which were cancelled, and which waited
longer than the timeout (their blocks are reported to vLLM as failed loads).
"""

from __future__ import annotations

import time

from transfer_strategies.scheduler import TransferRequest

IDLE_WAIT_S = 0.02  # a decode step with nothing to compute waits this long for KV to arrive


class ParkedRequests:
    def __init__(self, timeout_s: float):
        self.timeout_s = timeout_s
        self._parked: dict[str, tuple[TransferRequest, float]] = {}  # req id -> (request, parked at)
        self._released: set[str] = set()  # req ids vLLM may release (loaded, failed or cancelled)
        self._unscheduled: set[str] = set()  # released, not scheduled yet: no step may wait before it is
        self._failed_blocks: set[int] = set()

    def park(self, req: TransferRequest) -> None:
        self._parked[req.req_id] = (req, time.monotonic())

    def cancel(self, req_id: str) -> str | None:
        """vLLM finished the request while it was parked (aborted, or failed): it frees its blocks
        once told. Returns its transfer id if it was parked (its KV, if it still comes, is to be
        dropped)."""
        parked = self._parked.pop(req_id, None)
        self._unscheduled.discard(req_id)
        if parked is None:
            return None
        self._released.add(req_id)
        return parked[0].transfer_id

    def scheduled(self, req_ids) -> None:
        self._unscheduled.difference_update(req_ids)

    def poll(self, channel, idle: bool) -> tuple[list[TransferRequest], list[TransferRequest]]:
        """(parked requests whose messages have all arrived, those past the timeout). In a step
        with nothing to compute (idle) it waits a little for a message first, unless a released
        request is still to be scheduled (vLLM does that a step or two later). The arrived and
        expired parked requests are released; the expired ones' blocks become load errors."""
        waiting = [r for r, _ in self._parked.values()]
        if not waiting:
            return [], []
        wait = idle and not self._unscheduled
        ready = channel.ready({r.transfer_id for r in waiting}, IDLE_WAIT_S if wait else 0.0)
        late = time.monotonic() - self.timeout_s
        expired = [r for r, since in self._parked.values() if r.transfer_id not in ready and since < late]
        for r in expired:
            self._failed_blocks.update(r.block_ids[r.skip_blocks:])
        arrived = [r for r in waiting if r.transfer_id in ready]
        for r in arrived + expired:
            if self._parked.pop(r.req_id, None) is not None:
                self._released.add(r.req_id)
        return arrived, expired

    def released(self) -> set[str]:
        """The requests to report to vLLM as finished receiving (each once)."""
        done, self._released = self._released, set()
        self._unscheduled |= done
        return done

    def count(self) -> int:
        """Requests still waiting for their KV within the timeout. One past it is failed at the
        engine's next step, or vLLM has finished it already: under tensor parallelism another
        worker's timeout fails the request first, and the cancel reaches this worker with the
        next step's metadata, which an idle engine does not build (it comes before the next
        run's first poll)."""
        late = time.monotonic() - self.timeout_s
        return sum(since >= late for _, since in self._parked.values())

    def fail_blocks(self, block_ids) -> None:
        """Blocks a load left wrong (a transfer caught broken): reported with the next load errors."""
        self._failed_blocks.update(block_ids)

    def load_errors(self) -> set[int]:
        failed, self._failed_blocks = self._failed_blocks, set()
        return failed
