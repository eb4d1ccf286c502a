"""The bandwidth ceiling a transfer is judged against: one large tensor copy on the device,
measured in the same run (bytes copied / time, GB/s = 1e9 B/s)."""

from __future__ import annotations

import statistics
import time


def copy_ceiling_gbps(device: str = "cpu", nbytes: int | None = None, repeats: int = 7) -> float:
    import torch

    nbytes = nbytes or (1 << 30 if device.startswith("cuda") else 256 << 20)
    src = torch.randint(0, 255, (nbytes,), dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    times = []
    for _ in range(repeats + 1):  # the first copy pays page faults: dropped
        sync()
        t0 = time.perf_counter()
        dst.copy_(src)
        sync()
        times.append(time.perf_counter() - t0)
    del src, dst
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return nbytes / statistics.median(times[1:]) / 1e9
