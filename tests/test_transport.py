"""The channel between two worker processes, without vLLM engines: real gloo and shared memory."""

import multiprocessing as mp
import os

import pytest
import torch

from tests.conftest import TRANSPORT_KINDS
from transfer_strategies.connector_config import TransportSettings
from transfer_strategies.transport import open_channel, remove_leftovers

MiB = 2**20


def _open(role, rendezvous, kind, device="cpu", timeout_s=60):
    return open_channel(role, torch.device(device), TransportSettings(kind, staging_mb=8), rendezvous, "127.0.0.1",
                        timeout_s)


def _run_pair(tmp_path, sender, receiver, *args, results=1, timeout=90):
    """Sender and receiver in two spawned processes (as the engines' workers are); returns what the
    receiver put on its queue."""
    ctx = mp.get_context("spawn")
    rendezvous, out = str(tmp_path / "port"), ctx.Queue()
    rx = ctx.Process(target=receiver, args=(rendezvous, out, *args))
    tx = ctx.Process(target=sender, args=(rendezvous, out, *args))
    rx.start()
    tx.start()
    try:
        got = [out.get(timeout=timeout) for _ in range(results)]
    finally:
        tx.join(30)
        rx.join(30)
        for p in (tx, rx):
            if p.is_alive():
                p.kill()
        remove_leftovers(rendezvous)  # in case a side died before both mapped the buffer
    assert tx.exitcode == 0 and rx.exitcode == 0
    return got


def _fill(n, i):
    return torch.arange(n, dtype=torch.float32) + i


# --------------------------------------------------------------------------- messages arrive whole
def _sender(rendezvous, out, kind, sizes, devices=("cpu", "cpu")):
    device = devices[0]
    ch = _open("sender", rendezvous, kind, device)
    for i, n in enumerate(sizes):
        buf = ch.alloc(n * 4).view(torch.float32)  # built in the channel's buffer: no staging copy
        buf.copy_(_fill(n, i).to(device))
        ch.send(f"t{i}", 0, 2, buf, background=True, t0=1.0)  # a GPU's doorbell rings from the channel's thread
        ch.send(f"t{i}", 1, 2, torch.full((3,), float(i), device=device))  # built elsewhere: staged by the channel
        ch.flush()
        assert (ch.last_written is not None) == device.startswith("cuda")
    ch.alloc(8 * MiB)  # the whole buffer: free again once the receiver released every transfer
    os._exit(0)


def _receive_all(rendezvous, out, kind, sizes, devices=("cpu", "cpu")):
    ch = _open("receiver", rendezvous, kind, devices[1])
    for i, n in enumerate(sizes):
        first, second = ch.wait(f"t{i}")
        ok = first.payload.device == second.payload.device == torch.device(devices[1])
        ok = ok and torch.equal(first.payload.view(torch.float32).cpu(), _fill(n, i))
        ok = ok and torch.equal(second.payload.view(torch.float32).cpu(), torch.full((3,), float(i)))
        out.put((ok, first.payload.numel(), first.meta.get("t0"), first.count, first.delivered <= first.arrived))
        ch.release(f"t{i}")
    out.close()
    out.join_thread()
    os._exit(0)  # like the engines: no teardown race with gloo's threads while the peer exits


@pytest.mark.parametrize("kind", TRANSPORT_KINDS)
def test_messages_arrive_whole_and_in_place(kind, tmp_path):
    check_messages_arrive(tmp_path, kind)


def check_messages_arrive(tmp_path, kind, devices=("cpu", "cpu")):
    sizes = [0, 1, 1000, 300_000, 1_000_000]  # up to 4 MB; 8 MiB staging forces buffer reuse
    got = _run_pair(tmp_path, _sender, _receive_all, kind, sizes, devices, results=len(sizes))
    assert got == [(True, n * 4, 1.0, 2, True) for n in sizes]


# --------------------------------------------------------------------------- a full staging buffer
# What deadlocked full_cache at concurrency 4: one prefill step sends more than the buffer holds,
# and the decode worker uses none of it until that step is over.
PRESSURE = [(f"r{i}", j, 5, (i + 1) * 0.3 * MiB) for i in range(4) for j in range(5)]  # 4 requests, 5 messages


def _pressure_sender(rendezvous, out, sent, devices=("cpu", "cpu")):
    device = devices[0]
    ch = _open("sender", rendezvous, "staged", device, timeout_s=20)
    errors = []
    too_big = torch.empty(8 * MiB + 1, dtype=torch.uint8, device=device)
    for attempt in (lambda: ch.alloc(too_big.numel()), lambda: ch.send("big", 0, 1, too_big)):
        try:
            attempt()
        except ValueError as e:
            errors.append(str(e))
    # Like fused's prepare_send: three 3 MiB payloads allocated before any is sent (9 MiB > 8)
    prepared = [ch.alloc(3 * MiB) for _ in range(3)]
    for k, buf in enumerate(prepared):
        buf.fill_(k + 1)
    for k, buf in enumerate(prepared):
        ch.send(f"p{k}", 0, 1, buf)
    for tid, j, count, nbytes in PRESSURE:
        payload = _fill(int(nbytes) // 4, j).to(device)
        if j % 2:  # built elsewhere
            ch.send(tid, j, count, payload, background=j < count - 1)
        else:
            ch.send(tid, j, count, ch.alloc(payload.numel() * 4).view(torch.float32).copy_(payload))
    ch.send("whole", 0, 1, torch.full((8 * MiB,), 7, dtype=torch.uint8, device=device))  # the size of the whole buffer
    ch.flush()
    sent.set()
    out.put(("sender", errors))
    out.close()
    out.join_thread()
    os._exit(0)


def _pressure_receiver(rendezvous, out, sent, devices=("cpu", "cpu")):
    ch = _open("receiver", rendezvous, "staged", devices[1], timeout_s=20)
    sent.wait(60)  # nothing used before the sender has sent everything
    ok = []
    for k in range(3):
        (msg,) = ch.wait(f"p{k}")
        ok.append(bool((msg.payload == k + 1).all()))
        ch.release(f"p{k}")
    base, end = ch.staging.data_ptr(), ch.staging.data_ptr() + ch.staging.numel()
    moved = 0
    for tid in dict.fromkeys(t for t, *_ in PRESSURE):
        msgs = ch.wait(tid)
        for msg, (_, j, _, nbytes) in zip(msgs, [p for p in PRESSURE if p[0] == tid], strict=True):
            ok.append(msg.payload.device == ch.staging.device)  # moved out on the buffer's own device
            ok.append(torch.equal(msg.payload.view(torch.float32).cpu(), _fill(int(nbytes) // 4, j)))
            moved += not base <= msg.payload.data_ptr() < end
        ch.release(tid)
    (whole,) = ch.wait("whole")
    ok.append(bool((whole.payload == 7).all()) and whole.payload.numel() == 8 * MiB)
    out.put(("receiver", (all(ok), moved > 0)))
    out.close()
    out.join_thread()
    os._exit(0)


def test_more_than_the_buffer_holds_arrives_before_the_receiver_uses_any(tmp_path):
    check_staging_pressure(tmp_path)


def check_staging_pressure(tmp_path, devices=("cpu", "cpu")):
    sent = mp.get_context("spawn").Event()
    got = dict(_run_pair(tmp_path, _pressure_sender, _pressure_receiver, sent, devices, results=2))
    assert len(got["sender"]) == 2 and all("transport.staging_mb" in e for e in got["sender"]), got["sender"]
    # every message intact, and some were moved out of the staging buffer to make room
    assert got["receiver"] == (True, True)


# --------------------------------------------------------------------------- fan-in: 2 prefill workers, 1 decode
def _hello(k):
    def on_open(ch):
        ch.send("__layout__", 0, 1, torch.empty(0, dtype=torch.uint8), who=k)
    return on_open


def _fan_sender(rendezvous, out, kind, k, done):
    ch = open_channel("sender", torch.device("cpu"), TransportSettings(kind, staging_mb=8), rendezvous,
                      "127.0.0.1", 60,
                      on_open=_hello(k))
    for i in range(6):  # 18 MiB through an 8 MiB buffer: its space must come back to this sender
        ch.send(f"s{k}-t{i}", 0, 1, ch.alloc(3 * MiB).fill_(10 * k + i))
    ch.flush()
    if kind == "staged":
        ch.alloc(8 * MiB)  # the whole buffer again: every region acknowledged to this channel
    out.put(("sender", k))
    out.close()
    out.join_thread()
    done.wait(60)  # as an engine does, the channel stays open while the decode worker runs
    os._exit(0)


def _fan_receiver(rendezvous, out, kind, done):
    seen = []

    def on_open(ch):
        (msg,) = ch.wait("__layout__")
        seen.append(msg.meta["who"])
        ch.release("__layout__")
    ch = open_channel("receiver", torch.device("cpu"), TransportSettings(kind, staging_mb=8), rendezvous,
                      "127.0.0.1", 60, on_open=on_open)
    ok = []
    for i in range(6):
        for k in (1, 0):
            (msg,) = ch.wait(f"s{k}-t{i}")
            ok.append(bool((msg.payload == 10 * k + i).all()) and msg.payload.numel() == 3 * MiB)
            ch.release(f"s{k}-t{i}")
    out.put(("receiver", (seen, all(ok))))
    out.close()
    out.join_thread()
    done.set()
    os._exit(0)


@pytest.mark.parametrize("kind", TRANSPORT_KINDS)
def test_a_decode_worker_takes_kv_from_two_prefill_workers(kind, tmp_path):
    ctx = mp.get_context("spawn")
    paths, out, done = [str(tmp_path / f"port{k}") for k in (0, 1)], ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=_fan_receiver, args=(paths, out, kind, done)),
             *(ctx.Process(target=_fan_sender, args=(paths[k], out, kind, k, done)) for k in (0, 1))]
    for p in procs:
        p.start()
    try:
        got = dict(out.get(timeout=90) for _ in range(3))
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
        remove_leftovers(paths)
    assert all(p.exitcode == 0 for p in procs)
    # each channel's handshake in its own turn, every payload intact, each buffer's space returned to its sender
    assert got["receiver"] == ([0, 1], True) and got["sender"] in (0, 1)


# --------------------------------------------------------------------------- transfers nothing waits for
def _unwaited_sender(rendezvous, out, kind):
    import time

    ch = _open("sender", rendezvous, kind)
    while not os.path.exists(rendezvous + ".registered"):  # sent after the receiver asked, not before
        time.sleep(0.01)
    ch.send("drain", 0, 2, ch.alloc(3 * MiB).fill_(1))
    ch.send("drain", 1, 2, ch.alloc(3 * MiB).fill_(2))
    ch.flush()
    os._exit(0)


def _unwaited_receiver(rendezvous, out, kind):
    import threading

    ch = _open("receiver", rendezvous, kind)
    done = threading.Event()
    got = []

    def taken(msgs):  # what the decode worker does for a request that loads nothing: take it, free it
        got.append(([m.index for m in msgs], threading.current_thread().name, [float(m.payload[0]) for m in msgs]))
        ch.release("drain")
        done.set()
    ch.when_complete("drain", taken)  # before anything came, and no engine step polls afterwards
    open(rendezvous + ".registered", "w").close()
    assert done.wait(60)
    ch.when_complete("late", lambda msgs: got.append("late"))  # never comes: never called
    now = []
    ch.when_complete("drain-again", lambda msgs: now.append(msgs))
    out.put((got, ch.inbox.release("drain"), now))  # nothing left to release: the callback did
    out.close()
    out.join_thread()
    os._exit(0)


@pytest.mark.parametrize("kind", TRANSPORT_KINDS)
def test_a_transfer_nothing_waits_for_is_taken_by_the_receiver_thread_when_it_comes(kind, tmp_path):
    """A decode request whose blocks were all in the decode engine's prefix cache: its KV still
    comes, and must be checked and its staging space freed though no engine step may follow."""
    ((got, still_there, now),) = _run_pair(tmp_path, _unwaited_sender, _unwaited_receiver, kind)
    assert got == [([0, 1], "kv-recv", [1.0, 2.0])] and still_there == [] and now == []


# --------------------------------------------------------------------------- polling for parked requests
def _msg(tid, index, count):
    from transfer_strategies.transport.message import Message

    return Message(tid, index, count, torch.empty(0, dtype=torch.uint8), {}, 0.0, 0.0)


def test_ready_says_which_transfers_are_whole_and_waits_only_for_any_arrival():
    import threading
    import time

    from transfer_strategies.transport.inbox import Inbox

    inbox = Inbox(timeout_s=5)
    inbox.put(_msg("a", 0, 2))
    assert inbox.ready({"a", "b"}) == set()  # half of a, none of b: no wait asked for
    inbox.put(_msg("a", 1, 2))
    assert inbox.ready({"a", "b"}, timeout_s=5) == {"a"}
    t0 = time.monotonic()
    assert inbox.ready({"b"}, timeout_s=0.05) == set() and time.monotonic() - t0 >= 0.05
    # a message for a transfer nobody polls yet (its request not admitted) ends the wait at once
    threading.Timer(0.05, inbox.put, args=(_msg("c", 0, 1),)).start()
    t0 = time.monotonic()
    assert inbox.ready({"b"}, timeout_s=5) == set() and time.monotonic() - t0 < 2
    inbox.fail(ConnectionError("peer gone"))
    with pytest.raises(RuntimeError, match="peer gone"):
        inbox.ready({"b"})


def test_a_decode_worker_fed_by_two_channels_goes_on_when_one_closes():
    """Fan-in: the KV of a prefill worker that is gone ends as late KV does (the timeout), while
    the other prefill worker's keeps arriving; only when both are gone does every wait fail."""
    from transfer_strategies.transport.inbox import Inbox

    inbox = Inbox(timeout_s=0.2, channels=2)
    inbox.fail(ConnectionError("prefill 0 gone"))
    inbox.put(_msg("from-1", 0, 1))
    assert inbox.ready({"from-0", "from-1"}) == {"from-1"} and len(inbox.wait("from-1")) == 1
    with pytest.raises(TimeoutError):
        inbox.wait("from-0")
    inbox.fail(ConnectionError("prefill 1 gone"))
    with pytest.raises(RuntimeError, match="prefill 1 gone"):
        inbox.ready({"from-0"})
