"""What the harness removes from /dev/shm after stopping engines: what stopped processes left,
never what a live process uses (another test session's queues were removed under it once)."""

import multiprocessing as mp
import os
import uuid

from harness import process_group
from harness.process_group import SHM


def _put(q):
    q.put("through")


def test_a_live_processs_semaphores_are_not_taken_for_leftovers():
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    mine = SHM + "sem." + q._rlock._semlock.name.lstrip("/")  # a named semaphore, as spawn's children need
    assert os.path.exists(mine) and mine not in process_group.unmapped(process_group.semaphores())
    left = SHM + f"harness-test-{uuid.uuid4().hex}"
    with open(left, "w") as f:
        f.write("nobody maps this")
    try:
        assert process_group.unmapped({left, mine}) == {left}
        process_group.remove_unmapped(process_group.semaphores() | {left})
        assert not os.path.exists(left) and os.path.exists(mine)
        child = ctx.Process(target=_put, args=(q,))  # opens the queue's semaphores by name
        child.start()
        assert q.get(timeout=60) == "through"
        child.join(60)
        assert child.exitcode == 0
    finally:
        if os.path.exists(left):
            os.unlink(left)
