"""The channel between two worker processes, without vLLM engines: real gloo and shared memory."""

import multiprocessing as mp
import os
from pathlib import Path

import pytest
import torch

from transfer_strategies.transport import open_channel, shm_name


def _sender(rendezvous, transport, sizes):
    ch = open_channel(0, "127.0.0.1", rendezvous, torch.device("cpu"), 60, {"transport": transport, "staging_mb": 8})
    for i, n in enumerate(sizes):
        buf = ch.alloc(n * 4).view(torch.float32)  # built in the channel's buffer: no staging copy
        buf.copy_(torch.arange(n, dtype=torch.float32) + i)
        ch.send(f"t{i}", 0, 2, buf, t0=1.0)
        ch.send(f"t{i}", 1, 2, torch.full((3,), float(i)))  # built elsewhere: staged by the channel
        ch.flush()
    ch.alloc(8 << 20)  # the whole buffer: free again only once the receiver released every transfer
    os._exit(0)


def _receive_all(rendezvous, transport, sizes, out):
    ch = open_channel(1, "127.0.0.1", rendezvous, torch.device("cpu"), 60, {"transport": transport, "staging_mb": 8})
    for i, n in enumerate(sizes):
        first, second = ch.wait(f"t{i}")
        ok = torch.equal(first.payload.view(torch.float32), torch.arange(n, dtype=torch.float32) + i)
        ok = ok and torch.equal(second.payload.view(torch.float32), torch.full((3,), float(i)))
        out.put((ok, first.payload.numel(), first.meta.get("t0"), first.count))
        ch.release(f"t{i}")
    out.close()
    out.join_thread()
    os._exit(0)  # like the engines: no teardown race with gloo's threads while the peer exits


@pytest.mark.parametrize("transport", ["staged", "gloo"])
def test_messages_arrive_whole_and_in_place(transport, tmp_path):
    sizes = [0, 1, 1000, 300_000, 1_000_000]  # up to 4 MB; 8 MiB staging forces buffer reuse
    ctx = mp.get_context("spawn")
    rendezvous, out = str(tmp_path / "port"), ctx.Queue()
    rx = ctx.Process(target=_receive_all, args=(rendezvous, transport, sizes, out))
    tx = ctx.Process(target=_sender, args=(rendezvous, transport, sizes))
    rx.start()
    tx.start()
    got = [out.get(timeout=60) for _ in sizes]
    tx.join(30)
    rx.join(30)
    if transport == "staged":  # the sender left like an engine does (os._exit): remove its buffer
        Path("/dev/shm", shm_name(int(Path(rendezvous).read_text()))).unlink(missing_ok=True)
    assert tx.exitcode == 0 and rx.exitcode == 0
    assert got == [(True, n * 4, 1.0, 2) for n in sizes]
