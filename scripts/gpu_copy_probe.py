"""Why a GPU transfer is slower than the device-copy ceiling: the same 1 GiB of KV blocks
(Llama-3-8B shape, 8k tokens: 32 layers x K/V x 256 blocks of 32 tokens) copied several ways,
into memory of this process and into a buffer another process shared through CUDA IPC (where
the KV strategies write). Prints one line per way: ms (CUDA events), GB/s, share of a plain
1 GiB local copy. With --peer the IPC buffer lives on GPU 1 and is opened twice: in GPU 1's
context (where torch.multiprocessing opens it) and in GPU 0's, where the copying runs.

    python3 scripts/gpu_copy_probe.py          # one GPU
    python3 scripts/gpu_copy_probe.py --peer   # the IPC buffer on GPU 1

On one GPU it also times the way back (fused's scatter: one split copy of the buffer into the
64 runs) and the per-block digests of those blocks, torch's path against the Triton kernel
(the two must agree).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.multiprocessing as mp

LAYERS, BLOCKS, NB, BS, HEADS, HEAD = 32, 256, 1024, 32, 8, 128


def owner(q, done, device):
    from torch.multiprocessing.reductions import reduce_tensor

    bufs = [torch.zeros(LAYERS * 2 * BLOCKS * BS * HEADS * HEAD * 2 + (1 << 20), dtype=torch.uint8, device=device)
            for _ in range(2)]
    q.put([reduce_tensor(b) for b in bufs])
    done.wait()


def open_on(handle, device_index: int) -> torch.Tensor:
    rebuild, args = handle
    args = list(args)
    args[6] = device_index  # the CUDA context the IPC memory is mapped into
    return rebuild(*args)


def timed(fn, repeats=5):
    fn()
    torch.cuda.synchronize()
    ms, wall = [], []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        a.record()
        fn()
        b.record()
        b.synchronize()
        wall.append((time.perf_counter() - t0) * 1e3)
        ms.append(a.elapsed_time(b))
    return statistics.median(ms), statistics.median(wall)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--peer", action="store_true")
    args = ap.parse_args()
    ctx = mp.get_context("spawn")
    q, done = ctx.Queue(), ctx.Event()
    p = ctx.Process(target=owner, args=(q, done, "cuda:1" if args.peer else "cuda:0"))
    p.start()
    handles = q.get()
    dev = torch.device("cuda:0")
    targets = [("same GPU (IPC)", open_on(handles[0], 0))]
    if args.peer:
        targets = [("GPU 1, opened on 1", open_on(handles[0], 1)), ("GPU 1, opened on 0", open_on(handles[1], 0))]
        peer_local = torch.empty(targets[0][1].numel(), dtype=torch.uint8, device="cuda:1")
    kv = [torch.randn(2, NB, BS, HEADS, HEAD, device=dev).to(torch.bfloat16) for _ in range(LAYERS)]
    shape = (LAYERS, 2, BLOCKS, BS, HEADS, HEAD)
    nbytes = torch.Size(shape).numel() * 2
    local = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    first = 100  # blocks [100, 356): one run
    idx = torch.arange(first, first + BLOCKS, device=dev)

    def runs_into(buf):
        out = buf[:nbytes].view(torch.bfloat16).view(shape)

        def f():
            for layer in range(LAYERS):
                for kvi in range(2):
                    out[layer, kvi].copy_(kv[layer][kvi].narrow(0, first, BLOCKS))
        return f

    def index_select_into(buf):
        out = buf[:nbytes].view(torch.bfloat16).view(shape)

        def f():
            for layer in range(LAYERS):
                torch.index_select(kv[layer], 1, idx, out=out[layer]) if out.device == dev else \
                    out[layer].copy_(torch.index_select(kv[layer], 1, idx))
        return f

    def flat_into(buf):
        src = torch.empty(nbytes, dtype=torch.uint8, device=dev)
        return lambda: buf[:nbytes].copy_(src)

    parts = [kv[layer][kvi] for layer in range(LAYERS) for kvi in range(2)]  # contiguous [NB, ...] each

    def foreach_into(buf):  # one multi-tensor kernel for all 64 runs
        outs = buf[:nbytes].view(torch.bfloat16).view(LAYERS * 2, BLOCKS, BS, HEADS, HEAD).unbind(0)
        runs = [x.narrow(0, first, BLOCKS) for x in parts]  # sliced before the clock, as fused does
        return lambda: torch._foreach_copy_(outs, runs)

    def cat_into(buf):  # one batched concatenation kernel
        out = buf[:nbytes].view(torch.bfloat16).view(LAYERS * 2 * BLOCKS, BS, HEADS, HEAD)
        runs = [x.narrow(0, first, BLOCKS) for x in parts]  # sliced before the clock, as fused does
        return lambda: torch.cat(runs, out=out)

    def tiny_runs(buf):  # the same 64 copies of 1 block each: launch and Python overhead
        out = buf[:nbytes].view(torch.bfloat16).view(shape)

        def f():
            for layer in range(LAYERS):
                for kvi in range(2):
                    out[layer, kvi, :1].copy_(kv[layer][kvi].narrow(0, first, 1))
        return f

    base_ms, _ = timed(flat_into(local))
    print(f"ceiling: 1 GiB local copy {base_ms:.3f} ms = {nbytes / base_ms / 1e6:.0f} GB/s ({nbytes} B)")
    if args.peer:
        ms, _ = timed(flat_into(peer_local))
        print(f"peer ceiling: 1 GiB GPU 0 -> GPU 1 within this process {ms:.3f} ms = {nbytes / ms / 1e6:.0f} GB/s")
    for name, make in [("flat 1 GiB copy", flat_into), ("runs: 64 memcpys", runs_into),
                       ("index_select per layer", index_select_into), ("foreach_copy_ of 64 runs", foreach_into),
                       ("cat of 64 runs", cat_into), ("64 one-block copies", tiny_runs)]:
        for label, buf in [("local", local), *targets]:
            if args.peer and label == "local" and name != "flat 1 GiB copy":
                continue
            if name == "cat of 64 runs" and buf.device != dev:
                continue  # torch.cat writes on one device only
            ms, wall = timed(make(buf))
            moved = nbytes if name != "64 one-block copies" else 64 * BS * HEADS * HEAD * 2
            print(f"{name:24s} -> {label:18s} {ms:7.3f} ms (wall {wall:6.3f}) {moved / ms / 1e6:7.0f} GB/s "
                  f"{base_ms / ms * moved / nbytes:5.2f} of ceiling")
    if not args.peer:
        scatter_and_digests(local, kv, first, nbytes, base_ms)
    done.set()
    p.join()


def scatter_and_digests(buf, kv_layers, first, nbytes, base_ms):
    from transfer_strategies.digests import BlockDigests
    from transfer_strategies.kv_blocks import KVBlocks

    parts = [t[kvi] for t in kv_layers for kvi in range(2)]
    flat = buf[:nbytes].view(torch.bfloat16).view(LAYERS * 2 * BLOCKS, BS, HEADS, HEAD)
    runs = [x.narrow(0, first, BLOCKS) for x in parts]
    ms, wall = timed(lambda: torch.split_with_sizes_copy(flat, [BLOCKS] * len(runs), out=runs))
    print(f"{'split copy into 64 runs':24s} <- {'local':18s} {ms:7.3f} ms (wall {wall:6.3f}) "
          f"{nbytes / ms / 1e6:7.0f} GB/s {base_ms / ms:5.2f} of ceiling")
    kv = KVBlocks({f"layer.{i}": t for i, t in enumerate(kv_layers)}, NB)
    ids = list(range(first, first + BLOCKS))
    scattered = ids[::2] + ids[1::2]
    for label, block_ids in [("one run", ids), ("scattered", scattered)]:
        by_path = {}
        for path, kernel in [("torch", False), ("triton", True)]:
            digests = BlockDigests(kv, kernel=kernel)
            by_path[path] = digests(block_ids)
            ms, wall = timed(lambda d=digests, b=block_ids: d(b))
            print(f"digests of 1 GiB, {label:9s} {path:6s} {ms:7.3f} ms (wall {wall:6.3f}) "
                  f"{nbytes / ms / 1e6:7.0f} GB/s read")
        print(f"digests of 1 GiB, {label:9s} torch == triton: {by_path['torch'] == by_path['triton']}")


if __name__ == "__main__":
    main()
