"""Times each tree's per-block digests (transfer_strategies/digests.py + digest_kernel.py) on one
synthetic KV cache of the Llama-3-8B shape, on CUDA: the decode side's `check` part of the TTFT
overhead, and the prefill side's digests before its token, without starting vLLM.

    python3 digest_ab.py TREE [TREE ...] [--tokens 8192] [--layout NHD] [--reps 20] [--out FILE]

e.g. (on the GPU machine, repo root): python3 .bench/digest_ab.py .bench/old .bench/int64 .bench/new

Each tree is measured in a process of its own (its own transfer_strategies on PYTHONPATH, its own
Triton kernel). The KV cache: 32 layers, each [2, num_blocks, block_size, 8, 128] bf16 (NHD, vLLM's
FlashAttention layout; --layout HND puts heads before tokens), 4096 blocks of 32 tokens (16 GiB,
conf/experiment/gpu_ttft.yaml's engine.kv_cache_gib and conf/config.yaml's block_size), random
bf16 values; the request's blocks: ceil((tokens - 1) / block_size) consecutive ids (the blocks
holding prompt tokens [0, n-1), as both workers digest them), or scattered ids with --scattered.

Per tree, medians of --reps timed calls after 3 warm-up calls:
  kernel_ms   the Triton kernel alone (CUDA events around DigestKernel.add_to)
  call_ms     BlockDigests(block_ids) as the worker calls it: ids to the GPU, kernel, .cpu(), hex
              strings (host clock, GPU idle before); the `check` part's own cost
  launch_ms   where the digests are launched off the step (digests.launch): queuing them, the step's
              only share of their cost (host clock, GPU idle before; launch_ms_max the slowest call)
  hex_ms      the hex formatting alone (one string per block, per KV head in new trees)
  record_ms   json.dumps(TransferRecord(...).to_dict()) with those digests (and block_ids where the
              record has them): what the receive record's write costs right before the decode
              engine's first step, and the send record's before the prefill's token
  write_ms    TransferRecordWriter.write of that record to a file in /tmp (open, append, close)
  GB/s        KV bytes digested / kernel_ms
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trees", nargs="+", help="source trees (each holding transfer_strategies/)")
    ap.add_argument("--tokens", type=int, nargs="+", default=[8192, 2048])
    ap.add_argument("--layout", choices=["NHD", "HND"], default="NHD")
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--head-size", type=int, default=128)
    ap.add_argument("--block-size", type=int, default=32)
    ap.add_argument("--num-blocks", type=int, default=4096)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--scattered", action="store_true", help="random block ids instead of one run")
    ap.add_argument("--torch-path", action="store_true", help="also time the torch path (kernel=False)")
    ap.add_argument("--device", default="cuda", help="cuda (the point); cpu only to smoke-test this script")
    ap.add_argument("--out", default=None, help="also write the table and the JSON lines here")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return ap.parse_args()


# ----------------------------------------------------------------------------- in one tree's process
def host_ms(reps: int, fn, *args) -> list[float]:
    """fn(*args)'s host time per call, reps calls."""
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn(*args)
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def worker(args: argparse.Namespace) -> None:
    import torch

    from transfer_strategies import records as rec_mod
    from transfer_strategies.digests import BlockDigests
    from transfer_strategies.kv_blocks import KVBlocks

    dev = torch.device(args.device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    torch.manual_seed(0)
    nb, bs, h, d = args.num_blocks, args.block_size, args.heads, args.head_size
    shape = (2, nb, bs, h, d) if args.layout == "NHD" else (2, nb, h, bs, d)
    kv = {f"model.layers.{i}.self_attn.attn": torch.randn(shape, dtype=torch.bfloat16, device=dev)
          for i in range(args.layers)}
    sync()
    kv_kw = {"n_heads": h} if "n_heads" in inspect.signature(KVBlocks.__init__).parameters else {}
    blocks = KVBlocks(kv, nb, **kv_kw)
    results = []
    variants = [("kernel", None)] + ([("torch", False)] if args.torch_path else [])
    for name, kernel in variants:
        dg_kw = {"heads": range(h)} if "heads" in inspect.signature(BlockDigests.__init__).parameters else {}
        if kernel is not None:
            dg_kw["kernel"] = kernel
        digests = BlockDigests(blocks, **dg_kw)
        if name == "kernel" and digests.kernel is None:
            results.append({"path": name, "error": "no kernel (not CUDA, or pieces not contiguous)"})
            continue
        for tokens in args.tokens:
            n = -(-(tokens - 1) // bs)
            if args.scattered:
                import random
                ids = random.Random(0).sample(range(1, nb), n)
            else:
                ids = list(range(1, 1 + n))
            row = {"path": name, "tokens": tokens, "blocks": n, "layout": args.layout,
                   "kv_bytes": n * blocks.block_bytes() * blocks.n_layers,
                   "per_head": hasattr(digests, "keys")}
            # the whole call, as the worker makes it
            for _ in range(3):
                out = digests(ids)
            sync()
            times = []
            for _ in range(args.reps):
                sync()
                t0 = time.perf_counter()
                out = digests(ids)
                times.append((time.perf_counter() - t0) * 1e3)
            row["call_ms"] = statistics.median(times)
            row["call_ms_min"] = min(times)
            # the kernel alone
            if name == "kernel":
                idx = torch.tensor(ids, dtype=torch.int64, device=dev)
                cols = (len(digests.keys),) if hasattr(digests, "keys") else ()
                total = torch.zeros(n, *cols, dtype=torch.int64, device=dev)
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                ks = []
                for r in range(3 + args.reps):
                    total.zero_()
                    start.record()
                    digests.kernel.add_to(total, idx)
                    end.record()
                    end.synchronize()
                    if r >= 3:
                        ks.append(start.elapsed_time(end))
                row["kernel_ms"] = statistics.median(ks)
                row["gbps"] = row["kv_bytes"] / row["kernel_ms"] / 1e6
                if hasattr(digests, "_hex"):  # before the digests left the step
                    row["hex_ms"] = statistics.median(host_ms(args.reps, digests._hex, total))
            if hasattr(digests, "launch"):  # the step's share: queue them, no wait (GPU idle before)
                launch, hexed = [], []
                for _ in range(args.reps):
                    sync()
                    t0 = time.perf_counter()
                    pending = digests.launch(ids)
                    launch.append((time.perf_counter() - t0) * 1e3)
                    sync()
                    hexed += host_ms(1, pending.result)
                row["launch_ms"] = statistics.median(launch)
                row["launch_ms_max"] = max(launch)
                row["hex_ms"] = statistics.median(hexed)
            # the record that carries them
            fields = {f.name for f in __import__("dataclasses").fields(rec_mod.TransferRecord)}
            kw = {"transfer_id": "abcdef-7", "side": "receive", "strategy": "FusedConnector", "blocks": n,
                  "skip_blocks": 0, "tokens": tokens - 1, "kv_cache_blocks": nb,
                  "kv_cache_bytes": nb * blocks.block_bytes() * blocks.n_layers, "bytes": row["kv_bytes"],
                  "messages": 1, "digests": out, "digest_ms": row["call_ms"], "transfer_ms": 0.5, "notify_ms": 0.05,
                  "load_ms": 1.0, "ready_ms": 1.5, "t_admitted": 1.0, "t_arrived": 2.0, "t_load_start": 2.1,
                  "t_kv_ready": 2.2, "t_kv_checked": 2.3}
            if "block_ids" in fields:
                kw["block_ids"] = list(ids)
            record = rec_mod.TransferRecord(**{k: v for k, v in kw.items() if k in fields})
            row["record_ms"] = statistics.median(host_ms(args.reps, lambda r: json.dumps(r.to_dict()), record))
            row["record_bytes"] = len(json.dumps(record.to_dict()))
            with tempfile.TemporaryDirectory() as tmp:
                writer = rec_mod.TransferRecordWriter(Path(tmp) / "r.jsonl")
                row["write_ms"] = statistics.median(host_ms(args.reps, writer.write, record))
            results.append(row)
    for r in results:
        print("RESULT " + json.dumps(r), flush=True)


# ----------------------------------------------------------------------------- the parent
def main() -> int:
    args = parse()
    if args.worker:
        worker(args)
        return 0
    passthrough = [a for a in sys.argv[1:] if a not in args.trees]
    # drop --out FILE from what the workers get
    if "--out" in passthrough:
        i = passthrough.index("--out")
        del passthrough[i:i + 2]
    rows, log = [], []
    for tree in args.trees:
        tree = str(Path(tree).resolve())
        commit = (Path(tree) / "COMMIT").read_text().split()[0][:10] if (Path(tree) / "COMMIT").exists() else "?"
        env = dict(os.environ)
        rest = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        env["PYTHONPATH"] = os.pathsep.join([tree] + rest)
        t0 = time.monotonic()
        proc = subprocess.run([sys.executable, os.path.abspath(__file__), tree, "--worker", *passthrough],
                              cwd=tree, env=env, capture_output=True, text=True)
        log.append(f"--- {tree} ({commit}): exit {proc.returncode}, {time.monotonic() - t0:.1f} s")
        if proc.returncode:
            log.append(proc.stderr[-3000:])
        for line in proc.stdout.splitlines():
            if line.startswith("RESULT "):
                r = json.loads(line[7:])
                r.update(tree=Path(tree).name, commit=commit)
                rows.append(r)
    cols = ["tree", "commit", "path", "tokens", "blocks", "per_head", "kernel_ms", "gbps", "call_ms", "call_ms_min",
            "launch_ms", "launch_ms_max", "hex_ms", "record_ms", "record_bytes", "write_ms"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        cells = []
        for c in cols:
            v = r.get(c, r.get("error", "") if c == "kernel_ms" else "")
            cells.append(f"{v:.3f}" if isinstance(v, float) else str(v))
        lines.append("| " + " | ".join(cells) + " |")
    text = "\n".join(log + ["", f"layout {args.layout}, {args.layers} layers x [2, {args.num_blocks}, "
                                f"{args.block_size}, {args.heads}, {args.head_size}] bf16; "
                                f"{'scattered' if args.scattered else 'consecutive'} block ids; "
                                f"medians of {args.reps}", ""] + lines)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n\n" + "\n".join(json.dumps(r) for r in rows) + "\n")
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main())
