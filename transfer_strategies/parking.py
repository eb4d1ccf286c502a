"""The decode worker's requests that wait inside vLLM for their KV (early submission, see
scheduler.py): which are parked, which vLLM may release, which were cancelled, and which the
scheduler side found past the timeout (their blocks are reported to vLLM as failed loads). The
timeout is judged by the scheduler side's clock, not each worker's: under tensor parallelism one
worker failing a request before the others made vLLM wait for the others' report, which an idle
engine never asked for (a block stayed held after the last request).
"""

from __future__ import annotations

from transfer_strategies.scheduler import TransferRequest

IDLE_WAIT_S = 0.02  # a decode step with nothing to compute waits this long for KV to arrive


class ParkedRequests:
    def __init__(self):
        self._parked: dict[str, TransferRequest] = {}  # req id -> request
        self._released: set[str] = set()  # req ids vLLM may release (loaded, failed or cancelled)
        self._unscheduled: set[str] = set()  # released, not scheduled yet: no step may wait before it is
        self._failed_blocks: set[int] = set()

    def park(self, req: TransferRequest) -> None:
        self._parked[req.req_id] = req

    def cancel(self, req_id: str) -> str | None:
        """vLLM finished the request while it was parked (aborted, or failed): it frees its blocks
        once told. Returns its transfer id if it was parked (its KV, if it still comes, is to be
        dropped)."""
        parked = self._parked.pop(req_id, None)
        self._unscheduled.discard(req_id)
        if parked is None:
            return None
        self._released.add(req_id)
        return parked.transfer_id

    def expire(self, req_id: str) -> TransferRequest | None:
        """The scheduler side found the request past the timeout: released, its blocks load
        errors. Returns it if it was still parked here (its KV had not arrived at this worker)."""
        req = self._parked.pop(req_id, None)
        if req is None:
            return None
        self._failed_blocks.update(req.block_ids[req.skip_blocks:])
        self._released.add(req_id)
        return req

    def scheduled(self, req_ids) -> None:
        self._unscheduled.difference_update(req_ids)

    def poll(self, channel, idle: bool) -> list[TransferRequest]:
        """Parked requests whose messages have all arrived, released. In a step with nothing to
        compute (idle) it waits a little for a message first, unless a released request is still
        to be scheduled (vLLM does that a step or two later)."""
        waiting = list(self._parked.values())
        if not waiting:
            return []
        wait = idle and not self._unscheduled
        ready = channel.ready({r.transfer_id for r in waiting}, IDLE_WAIT_S if wait else 0.0)
        arrived = [r for r in waiting if r.transfer_id in ready]
        for r in arrived:
            del self._parked[r.req_id]
            self._released.add(r.req_id)
        return arrived

    def released(self) -> set[str]:
        """The requests to report to vLLM as finished receiving (each once)."""
        done, self._released = self._released, set()
        self._unscheduled |= done
        return done

    def count(self) -> int:
        """Requests still waiting for their KV."""
        return len(self._parked)

    def fail_blocks(self, block_ids) -> None:
        """Blocks a load left wrong (a transfer caught broken): reported with the next load errors."""
        self._failed_blocks.update(block_ids)

    def load_errors(self) -> set[int]:
        failed, self._failed_blocks = self._failed_blocks, set()
        return failed
