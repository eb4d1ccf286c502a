"""The bandwidth ceiling a transfer is judged against: one large tensor copy, measured in the
same run (bytes copied / time, GB/s = 1e9 B/s): within one device, or from one GPU to another
(peer copy over NVLink or PCIe). Timed on the host's clock on CPU, with CUDA events on a GPU
(the copy is issued on the source GPU's current stream)."""

from __future__ import annotations

import statistics
import time


def copy_ceiling_gbps(device: str = "cpu", nbytes: int | None = None, repeats: int = 7,
                      to_device: str | None = None) -> float:
    import torch

    nbytes = nbytes or (1 << 30 if device.startswith("cuda") else 256 << 20)
    src = torch.randint(0, 255, (nbytes,), dtype=torch.uint8, device=device)
    dst = torch.empty(nbytes, dtype=torch.uint8, device=to_device or device)

    def sync():
        if device.startswith("cuda"):
            for d in {src.device, dst.device}:
                torch.cuda.synchronize(d)

    times = []
    for _ in range(repeats + 1):  # the first copy pays page faults and peer mapping: dropped
        sync()
        if device.startswith("cuda"):  # the GPU's clock, as transfers on a GPU are timed
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            dst.copy_(src)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
            continue
        t0 = time.perf_counter()
        dst.copy_(src)
        times.append(time.perf_counter() - t0)
    src = dst = None  # freed before the cache is emptied
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return nbytes / statistics.median(times[1:]) / 1e9


def _link_end(rank: int, host: str, netns: str | None, ifname: str | None, nbytes: int, repeats: int, ports, out):
    """One end of the link probe, in the engine's network namespace: rank 0 (the prefill's
    place) listens on host and sends, rank 1 receives and times."""
    import os
    import socket

    import torch

    from harness.engine_process import enter_netns
    from transfer_strategies.transport.gloo import _process_group

    try:
        if netns:
            enter_netns(netns)
        os.environ.pop("GLOO_SOCKET_IFNAME", None)
        if ifname:
            os.environ["GLOO_SOCKET_IFNAME"] = ifname
        data = torch.empty(nbytes, dtype=torch.uint8)
        if rank == 0:
            listener = socket.socket()
            listener.bind((host, 0))
            listener.listen()
            ports.put(listener.getsockname()[1])
            pg = _process_group(host, listener.getsockname()[1], 0, 60, listener)
            for _ in range(repeats + 1):
                pg.send([data], 1, 0).wait()
            pg.recv([data[:1]], 1, 1).wait()  # the receiver has everything: the group may go
            return
        pg = _process_group(host, ports.get(timeout=60), 1, 60)
        times = []
        for _ in range(repeats + 1):
            t0 = time.perf_counter()
            pg.recv([data], 0, 0).wait()
            times.append(time.perf_counter() - t0)
        pg.send([data[:1]], 0, 1).wait()
        out.put(nbytes / statistics.median(times[1:]) / 1e9)
    except Exception as e:  # noqa: BLE001 - reported to the parent, which goes on without a ceiling
        out.put(f"{type(e).__name__}: {e}")
    finally:
        out.close()
        out.join_thread()


def link_ceiling_gbps(host: str, netns: dict, ifname: str | None, nbytes: int = 64 << 20,
                      repeats: int = 5) -> float | str:
    """GB/s of one large message over gloo's TCP from where the prefill engine runs (listening on
    `host`, in netns["prefill"] if given) to where the decode engine runs: the ceiling of a
    transfer between engines that do not share memory (transport=gloo with transport.address).
    Measured before the engines start; the first message is dropped. A str says why it failed."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    ports, out = ctx.Queue(), ctx.Queue()
    ends = [ctx.Process(target=_link_end, args=(rank, host, netns.get(role), ifname, nbytes, repeats, ports, out))
            for rank, role in enumerate(("prefill", "decode"))]
    for p in ends:
        p.start()
    try:
        return out.get(timeout=120)
    except Exception as e:  # noqa: BLE001 - no answer in time
        return f"no measurement: {type(e).__name__}"
    finally:
        for p in ends:
            p.join(10)
            if p.is_alive():
                p.kill()
