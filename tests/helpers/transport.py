"""The KV channel between two spawned processes, as the engines' workers are: a channel's end on
127.0.0.1 with an 8 MiB staging buffer, a sender and a receiver run as a pair, and the checks
test_transport.py makes on CPU and test_transport_gpu.py on CUDA, with the functions their
processes run (here, where a spawned process can import them)."""

import multiprocessing as mp
import os

import torch

from harness import process_group
from transfer_strategies.connector_config import TransportSettings
from transfer_strategies.transport import open_channel, remove_leftovers

MiB = 2**20


def open_end(role, rendezvous, kind, device="cpu", timeout_s=60):
    """kind: a transport's, or nixl-host (NIXL between pinned host buffers, as across a link from a GPU)."""
    settings = (TransportSettings("nixl", staging_mb=8, buffer_device="cpu") if kind == "nixl-host"
                else TransportSettings(kind, staging_mb=8))
    return open_channel(role, torch.device(device), settings, rendezvous, "127.0.0.1", timeout_s)


def run_pair(tmp_path, sender, receiver, *args, results=1, timeout=90):
    """Sender and receiver in two spawned processes (as the engines' workers are); returns what the
    receiver put on its queue."""
    ctx = mp.get_context("spawn")
    rendezvous, out = str(tmp_path / "port"), ctx.Queue()
    shm_before = set(os.listdir(process_group.SHM))
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
        # The pair ends with os._exit, as killed engines do, so on CUDA torch's IPC reference
        # counters (torch_<pid>_*) and the driver's IPC files (cuda.shm.*) stayed in /dev/shm;
        # removed as the harness removes what the engines it stopped left (no live process maps them).
        process_group.remove_unmapped({process_group.SHM + n for n in set(os.listdir(process_group.SHM)) - shm_before})
    assert tx.exitcode == 0 and rx.exitcode == 0
    return got


def _fill(n, i):
    return torch.arange(n, dtype=torch.float32) + i


# --------------------------------------------------------------------------- messages arrive whole
def _sender(rendezvous, out, kind, sizes, devices=("cpu", "cpu")):
    device = devices[0]
    ch = open_end("sender", rendezvous, kind, device)
    for i, n in enumerate(sizes):
        buf = ch.alloc(n * 4).view(torch.float32)  # built in the channel's buffer: no staging copy
        buf.copy_(_fill(n, i).to(device))
        ch.send(f"t{i}", 0, 2, buf, background=True, t0=1.0)  # a GPU's doorbell rings from the channel's thread
        ch.send(f"t{i}", 1, 2, torch.full((3,), float(i), device=device))  # built elsewhere: staged by the channel
        ch.flush()
        # the GPU's clock times a transfer where the GPU writes the receiver's memory itself
        assert (ch.last_written is not None) == (device.startswith("cuda") and kind == "staged")
    ch.alloc(8 * MiB)  # the whole buffer: free again once the receiver released every transfer
    os._exit(0)


def _receive_all(rendezvous, out, kind, sizes, devices=("cpu", "cpu")):
    ch = open_end("receiver", rendezvous, kind, devices[1])
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


def check_messages_arrive(tmp_path, kind, devices=("cpu", "cpu")):
    sizes = [0, 1, 1000, 300_000, 1_000_000]  # up to 4 MB; 8 MiB staging forces buffer reuse
    got = run_pair(tmp_path, _sender, _receive_all, kind, sizes, devices, results=len(sizes))
    assert got == [(True, n * 4, 1.0, 2, True) for n in sizes]


# --------------------------------------------------------------------------- a full staging buffer
# What deadlocked full_cache at concurrency 4: one prefill step sends more than the buffer holds,
# and the decode worker uses none of it until that step is over.
PRESSURE = [(f"r{i}", j, 5, (i + 1) * 0.3 * MiB) for i in range(4) for j in range(5)]  # 4 requests, 5 messages


def _pressure_sender(rendezvous, out, sent, devices=("cpu", "cpu"), kind="staged"):
    device = devices[0]
    ch = open_end("sender", rendezvous, kind, device, timeout_s=20)
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


def _pressure_receiver(rendezvous, out, sent, devices=("cpu", "cpu"), kind="staged"):
    ch = open_end("receiver", rendezvous, kind, devices[1], timeout_s=20)
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


def check_staging_pressure(tmp_path, devices=("cpu", "cpu"), kind="staged"):
    sent = mp.get_context("spawn").Event()
    got = dict(run_pair(tmp_path, _pressure_sender, _pressure_receiver, sent, devices, kind, results=2))
    assert len(got["sender"]) == 2 and all("transport.staging_mb" in e for e in got["sender"]), got["sender"]
    # every message intact, and some were moved out of the staging buffer to make room
    assert got["receiver"] == (True, True)
