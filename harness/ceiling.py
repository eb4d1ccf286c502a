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
