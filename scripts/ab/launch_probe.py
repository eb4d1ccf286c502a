"""Where the host time of launching the digests goes (digests.BlockDigests.launch: the step's only
share of their cost since the digests left the engines' steps), step by step, on CUDA, without vLLM.

    python3 scripts/ab/launch_probe.py [--tokens 8192 2048] [--reps 50]    (PYTHONPATH: the repository root)

The cache: 32 layers of [2, num_blocks, 32, 8, 128] bf16 (the Llama-3-8B shape, NHD), random. Each
step is timed on the host (perf_counter) after a device synchronize, median of --reps, with the
whole launch() for comparison. Prints one table.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from transfer_strategies.digests import BlockDigests
from transfer_strategies.kv_blocks import KVBlocks


def timed(reps: int, fn) -> float:
    out = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e3)
    torch.cuda.synchronize()
    return statistics.median(out)


def launch_steps(digests: BlockDigests, ids: list[int], dev: torch.device) -> dict:
    """What launch() does, one step a function."""
    cpu_ids = torch.tensor(ids, dtype=torch.int64)
    pinned = cpu_ids.pin_memory()
    on_dev = pinned.to(dev)
    total = torch.zeros(len(ids), 8, dtype=torch.int64, device=dev)
    return {
        "torch.tensor(ids)": lambda: torch.tensor(ids, dtype=torch.int64),
        "pin_memory()": lambda: cpu_ids.pin_memory(),
        "to(cuda, non_blocking) from pinned": lambda: pinned.to(dev, non_blocking=True),
        "to(cuda, non_blocking) from pageable": lambda: cpu_ids.to(dev, non_blocking=True),
        "torch.zeros on cuda": lambda: torch.zeros(len(ids), 8, dtype=torch.int64, device=dev),
        "two timing events recorded": lambda: (torch.cuda.Event(enable_timing=True).record(),
                                               torch.cuda.Event(enable_timing=True).record()),
        "kernel launch (add_to)": lambda: digests.kernel.add_to(total, on_dev),
        "t().contiguous()": lambda: total.t().contiguous(),
        "empty(pin_memory=True)": lambda: torch.empty(8, len(ids), dtype=torch.int64, pin_memory=True),
        "launch(), whole": lambda: digests.launch(ids),
        "launch().result(), whole": lambda: digests.launch(ids).result(),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, nargs="+", default=[8192, 2048])
    ap.add_argument("--num-blocks", type=int, default=1024)
    ap.add_argument("--reps", type=int, default=50)
    args = ap.parse_args()
    dev = torch.device("cuda")
    kv = {f"model.layers.{i}.self_attn.attn": torch.randn(2, args.num_blocks, 32, 8, 128, dtype=torch.bfloat16,
                                                          device=dev) for i in range(32)}
    blocks = KVBlocks(kv, args.num_blocks, n_heads=8)
    digests = BlockDigests(blocks, heads=range(8))
    print("| step | " + " | ".join(f"{t} tokens (ms)" for t in args.tokens) + " |")
    print("|---|" + "---|" * len(args.tokens))
    rows: dict[str, list[float]] = {}
    for tokens in args.tokens:
        ids = list(range(1, 1 + -(-(tokens - 1) // 32)))
        for _ in range(3):
            digests.launch(ids).result()
        for name, fn in launch_steps(digests, ids, dev).items():
            rows.setdefault(name, []).append(timed(args.reps, fn))
    for name, values in rows.items():
        print(f"| {name} | " + " | ".join(f"{v:.3f}" for v in values) + " |")


if __name__ == "__main__":
    main()
