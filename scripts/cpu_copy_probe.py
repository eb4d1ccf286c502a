"""What bounds fused's small transfers on a CPU: a one-off copy of 1-8 MiB of KV blocks whose
caches were just flushed (as after a forward pass), timed like fused's gather, against the
ceiling the benchmark uses (a 256 MiB torch copy, all threads) and a 256 MiB copy on one
thread. fused copies on the calling thread below 4 MiB (waking OpenMP threads costs more),
with torch.cat above; both are shown.

    python scripts/cpu_copy_probe.py [--repeats 30]
"""

from __future__ import annotations

import argparse
import statistics
import time
from multiprocessing import shared_memory

import numpy as np
import torch

BLOCK = (4, 32, 64)  # tiny-llama's KV per block and layer on CPU: 4 heads x 32 tokens x 2*32 floats = 32 KiB
LAYERS = 4


def median_s(fn, repeats: int, before=None) -> float:
    times = []
    for _ in range(repeats):
        if before:
            before()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=30)
    args = ap.parse_args()
    big = 256 << 20
    src, dst = torch.randint(0, 255, (big,), dtype=torch.uint8), torch.empty(big, dtype=torch.uint8)
    dst.copy_(src)
    ceiling = big / median_s(lambda: dst.copy_(src), 7) / 1e9
    one = big / median_s(lambda: np.copyto(dst.numpy(), src.numpy()), 7) / 1e9
    print(f"ceiling (torch copy of 256 MiB, {torch.get_num_threads()} threads): {ceiling:.2f} GB/s")
    print(f"one thread (numpy copy of 256 MiB):            {one:.2f} GB/s = {one / ceiling:.2f} of the ceiling")
    src = dst = None  # 512 MiB freed before the KV copies

    kv = [torch.randn(4096, *BLOCK) for _ in range(LAYERS)]
    shm = shared_memory.SharedMemory(create=True, size=64 << 20)  # fused writes into shared memory
    try:
        staging = torch.frombuffer(shm.buf, dtype=torch.uint8)
        staging.zero_()
        flush = torch.empty(64 << 20, dtype=torch.uint8)  # more than this machine's caches

        def evict():
            flush.add_(1)
            time.sleep(0.002)

        print(f"\none-off copies of KV blocks of {LAYERS} layers into shared memory, caches flushed before each "
              f"(median of {args.repeats}):")
        print("  KV MiB | one thread ms  GB/s  of ceiling | torch.cat ms  GB/s  of ceiling | hot, one thread GB/s")
        for mib in (1, 2, 4, 8):
            n = (mib << 20) // LAYERS // kv[0][0].nbytes
            pieces = [layer[100:100 + n] for layer in kv]
            nbytes = sum(p.nbytes for p in pieces)
            out = staging[:nbytes]
            srcs = [p.view(torch.uint8).numpy().reshape(-1) for p in pieces]
            flat = [p.reshape(-1) for p in pieces]
            out_f = out.view(torch.float32)
            def one_thread(srcs=srcs, out=out):
                np.concatenate(srcs, out=out.numpy())

            def cat(flat=flat, out_f=out_f):
                torch.cat(flat, out=out_f)

            t_np = median_s(one_thread, args.repeats, evict)
            t_cat = median_s(cat, args.repeats, evict)
            t_hot = median_s(one_thread, args.repeats)
            g_np, g_cat, g_hot = nbytes / t_np / 1e9, nbytes / t_cat / 1e9, nbytes / t_hot / 1e9
            print(f"  {mib:6d} | {t_np * 1e3:13.3f} {g_np:5.2f} {g_np / ceiling:11.2f} | {t_cat * 1e3:12.3f} "
                  f"{g_cat:5.2f} {g_cat / ceiling:11.2f} | {g_hot:5.2f}")
    finally:
        shm.close()
        shm.unlink()


if __name__ == "__main__":
    main()
