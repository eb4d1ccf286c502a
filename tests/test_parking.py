"""The decode worker's parked requests (early submission), on a real inbox: what arrives is
released once, a released request is not waited for, a cancelled one is released and names the
KV to drop, and one the scheduler side finds past the timeout fails with its blocks as load errors."""

import time

import torch

from transfer_strategies.parking import IDLE_WAIT_S, ParkedRequests
from transfer_strategies.scheduler import TransferRequest
from transfer_strategies.transport.inbox import Inbox
from transfer_strategies.transport.message import Message


def req(rid: str, blocks=(4, 5, 6), skip: int = 0) -> TransferRequest:
    return TransferRequest(f"t-{rid}", rid, list(blocks), 3 * 16, skip)


def put(inbox: Inbox, rid: str) -> None:
    inbox.put(Message(f"t-{rid}", 0, 1, torch.empty(0, dtype=torch.uint8), {}, 0.0, 0.0))


def test_an_arrived_request_is_released_once_and_not_waited_for_until_scheduled():
    inbox, parking = Inbox(timeout_s=5), ParkedRequests()
    parking.park(req("a"))
    parking.park(req("b"))
    put(inbox, "a")
    arrived = parking.poll(inbox, idle=True)
    assert [r.req_id for r in arrived] == ["a"]
    assert parking.released() == {"a"} and parking.released() == set()
    t0 = time.monotonic()
    parking.poll(inbox, idle=True)  # "a" is not scheduled yet: this idle step must not wait for "b"
    assert time.monotonic() - t0 < IDLE_WAIT_S / 2
    parking.scheduled(["a"])
    t0 = time.monotonic()
    assert parking.poll(inbox, idle=True) == []  # now it waits a little for "b"
    assert time.monotonic() - t0 >= IDLE_WAIT_S * 0.9


def test_a_cancelled_request_is_released_and_names_the_kv_to_drop():
    parking = ParkedRequests()
    parking.park(req("a"))
    assert parking.cancel("a") == "t-a"  # the worker drops its KV when it comes (transport: when_complete)
    assert parking.released() == {"a"}
    assert parking.poll(Inbox(timeout_s=5), idle=False) == []
    assert parking.cancel("a") is None  # a second cancel (vLLM finishing it again) reports nothing
    assert parking.released() == set()


def test_an_expired_request_is_released_with_its_blocks_as_load_errors_once():
    """The scheduler side lists a parked request as expired (its clock, the same step for every
    worker): released, the blocks the transfer was to write are load errors; a worker whose KV
    had arrived already (released then) does nothing more; the later cancel finds nothing."""
    parking = ParkedRequests()
    parking.park(req("a", blocks=(4, 5, 6), skip=1))  # block 4 came from this engine's prefix cache
    assert parking.count() == 1
    assert parking.expire("a").req_id == "a" and parking.count() == 0
    assert parking.released() == {"a"} and parking.load_errors() == {5, 6} and parking.load_errors() == set()
    assert parking.expire("a") is None and parking.cancel("a") is None and parking.released() == set()
