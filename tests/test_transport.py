"""The channel between two worker processes, without vLLM engines: real gloo, shared memory and
NIXL (UCX)."""

import multiprocessing as mp
import os
import time

import pytest
import torch

from tests.conftest import TRANSPORT_KINDS
from tests.helpers.transport import MiB, check_messages_arrive, check_staging_pressure, open_end, run_pair
from transfer_strategies.connector_config import TransportSettings
from transfer_strategies.transport import open_channel, remove_leftovers


# --------------------------------------------------------------------------- messages arrive whole
@pytest.mark.parametrize("kind", TRANSPORT_KINDS)
def test_messages_arrive_whole_and_in_place(kind, tmp_path):
    check_messages_arrive(tmp_path, kind)


# --------------------------------------------------------------------------- a full staging buffer
@pytest.mark.parametrize("kind", ["staged", "nixl"])  # gloo has no staging buffer
def test_more_than_the_buffer_holds_arrives_before_the_receiver_uses_any(kind, tmp_path):
    check_staging_pressure(tmp_path, kind=kind)


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


# --------------------------------------------------------------------------- 2 prefill workers, 2 decode (2P2D)
def _fan_out_sender(paths, out, kind, k, done):
    """Prefill worker k: a channel to each decode worker; transfer s{k}-t{i} goes to decode worker i % 2."""
    ch = open_channel("sender", torch.device("cpu"), TransportSettings(kind, staging_mb=8), paths, "127.0.0.1", 60,
                      on_open=_hello(k))
    for i in range(6):  # 9 MiB to each decode worker through its 8 MiB buffer: each space comes back to this channel
        peer = ch.to(i % 2)
        peer.send(f"s{k}-t{i}", 0, 1, ch.alloc(3 * MiB).fill_(10 * k + i))
    ch.flush()
    done.wait(60)  # both decode workers have taken their transfers: every region acknowledged back
    deadline = time.monotonic() + 10
    while ch.held() and time.monotonic() < deadline:
        time.sleep(0.05)
    out.put((f"sender{k}", ch.held()))
    out.close()
    out.join_thread()
    os._exit(0)


def _fan_in_receiver(paths, out, kind, j, done):
    """Decode worker j: a channel from each prefill worker; takes the transfers meant for it."""
    seen = []

    def on_open(ch):
        (msg,) = ch.wait("__layout__")
        seen.append(msg.meta["who"])
        ch.release("__layout__")
    ch = open_channel("receiver", torch.device("cpu"), TransportSettings(kind, staging_mb=8), paths, "127.0.0.1",
                      60, on_open=on_open)
    ok = []
    for i in range(j, 6, 2):
        for k in (0, 1):
            (msg,) = ch.wait(f"s{k}-t{i}")
            ok.append(bool((msg.payload == 10 * k + i).all()) and msg.payload.numel() == 3 * MiB)
            ch.release(f"s{k}-t{i}")
    others = {f"s{k}-t{i}" for k in (0, 1) for i in range(1 - j, 6, 2)}
    out.put((f"receiver{j}", (seen, all(ok), ch.ready(others, timeout_s=0.5))))
    out.close()
    out.join_thread()
    done.wait(60)
    os._exit(0)


@pytest.mark.parametrize("kind", TRANSPORT_KINDS)
def test_two_prefill_workers_each_send_to_the_decode_worker_a_transfer_names(kind, tmp_path):
    ctx = mp.get_context("spawn")
    path = {(k, j): str(tmp_path / f"port-p{k}-d{j}") for k in (0, 1) for j in (0, 1)}
    out, done = ctx.Queue(), ctx.Event()
    procs = [*(ctx.Process(target=_fan_in_receiver, args=([path[k, j] for k in (0, 1)], out, kind, j, done))
               for j in (0, 1)),
             *(ctx.Process(target=_fan_out_sender, args=([path[k, j] for j in (0, 1)], out, kind, k, done))
               for k in (0, 1))]
    for p in procs:
        p.start()
    try:
        got = dict(out.get(timeout=90) for _ in range(2))  # the decode workers'
        done.set()
        got.update(out.get(timeout=30) for _ in range(2))
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
        remove_leftovers(list(path.values()))
    assert all(p.exitcode == 0 for p in procs)
    # every pair's handshake, each decode worker's transfers intact and none of the other's, nothing held
    assert got["receiver0"] == ([0, 1], True, set()) and got["receiver1"] == ([0, 1], True, set())
    assert got["sender0"] == got["sender1"] == 0


# --------------------------------------------------------------------------- transfers nothing waits for
def _unwaited_sender(rendezvous, out, kind):
    import time

    ch = open_end("sender", rendezvous, kind)
    while not os.path.exists(rendezvous + ".registered"):  # sent after the receiver asked, not before
        time.sleep(0.01)
    ch.send("drain", 0, 2, ch.alloc(3 * MiB).fill_(1))
    ch.send("drain", 1, 2, ch.alloc(3 * MiB).fill_(2))
    ch.flush()
    os._exit(0)


def _unwaited_receiver(rendezvous, out, kind):
    import threading

    ch = open_end("receiver", rendezvous, kind)
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
    ((got, still_there, now),) = run_pair(tmp_path, _unwaited_sender, _unwaited_receiver, kind)
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


# --------------------------------------------------------------------------- NIXL's own ceiling
def test_the_nixl_probe_writes_intact_over_ucx_tcp_as_the_readme_shows():
    """scripts/nixl_probe.py as docs/transports.md runs it on a GPU, here on host memory."""
    import subprocess
    import sys

    pytest.importorskip("nixl._api")
    env = {**os.environ, "UCX_TLS": "tcp", "UCX_NET_DEVICES": "lo"}
    out = subprocess.run([sys.executable, "scripts/nixl_probe.py", "--mib", "8", "--repeat", "2"], env=env,
                         capture_output=True, text=True, timeout=120, cwd=os.path.dirname(os.path.dirname(__file__)))
    assert out.returncode == 0, out.stderr[-2000:]
    writes = [line for line in out.stdout.splitlines() if line.startswith("write ")]
    assert len(writes) == 2 and all(line.endswith("intact=True") for line in writes), out.stdout
    assert "Gbit/s over 2 writes" in out.stdout


def test_the_nixl_receivers_poller_ends_when_it_closes():
    """At exit (atexit calls close): a daemon thread still inside NIXL's binding when the
    interpreter finalizes aborts the process after its work is done (CI: exit -6)."""
    pytest.importorskip("nixl._api")
    from transfer_strategies.transport.nixl import NixlStaging

    staging = NixlStaging(torch.device("cpu"), 4096)
    assert staging._poller.is_alive()
    staging.close()
    assert not staging._poller.is_alive()
