"""The lossy strategies' codecs on their own (transfer_strategies/codecs.py), against fused's copies,
on one device and one KV geometry: per request of N tokens, fused's gather and scatter beside each
codec's gather + compress and reconstruct + scatter, the bytes each moves, and the link bandwidth
below which a codec pays for itself (COMPUTED from these times and bytes, not measured on a link:
at bandwidth B a transfer takes copies + bytes / B, so the codec pays where
(fused bytes - its bytes) / B > its extra copy time).

    python scripts/bench_codecs.py                                   # CPU: vLLM's CPU layout, tiny-llama's shape
    python scripts/bench_codecs.py --device cuda --preset llama3_8b --tokens 2048 8192 16384

Times are medians over --repeats (with the 25th and 75th percentiles): CUDA events on a GPU, the
host's clock on CPU.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from transfer_strategies.codecs import Codec, CodecParams  # noqa: E402
from transfer_strategies.kv_blocks import KVBlocks  # noqa: E402

PRESETS = {  # layers, KV heads, head size, block size, dtype
    "tiny_llama": (4, 2, 64, 32, torch.float32),
    "llama3_8b": (32, 8, 128, 16, torch.bfloat16),
}
CODECS = {"fused_fp8": ("fp8", CodecParams()), "fused_int8": ("int8", CodecParams()),
          "fused_int4": ("int4", CodecParams("token", 32))}


def make_kv(device: str, layers: int, heads: int, head_size: int, block: int, dtype, num_blocks: int) -> KVBlocks:
    """An engine's KV cache in its backend's layout: vLLM's CPU backend [blocks, heads, tokens, K|V],
    FlashAttention's [K/V, blocks, tokens, heads, head size] on CUDA."""
    shape = ((2, num_blocks, block, heads, head_size) if device == "cuda"
             else (num_blocks, heads, block, 2 * head_size))
    caches = {f"l{i}": torch.randn(shape, device=device).to(dtype) for i in range(layers)}
    return KVBlocks(caches, num_blocks, heads)


def timed(device: str, fn, repeats: int) -> list[float]:
    fn()  # once untimed: first-call costs
    out = []
    for _ in range(repeats):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            out.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t0) * 1e3)
    return out


def quartiles(xs: list[float]) -> str:
    q = statistics.quantiles(xs, n=4) if len(xs) > 1 else [xs[0]] * 3
    return f"{q[1]:.3f} [{q[0]:.3f}, {q[2]:.3f}]"


def bench(device: str, preset: str, tokens: int, repeats: int) -> list[dict]:
    layers, heads, head_size, block, dtype = PRESETS[preset]
    n = -(-tokens // block)
    kv = make_kv(device, layers, heads, head_size, block, dtype, 2 * n + 8)
    src, dst = list(range(1, n + 1)), list(range(n + 4, 2 * n + 4))  # a request's blocks on each engine
    buf = torch.empty(layers, *kv.layer_shape(n), dtype=dtype, device=device)
    gather = kv.gather_plan(src, buf, range(layers))
    rows = []
    fused_bytes = buf.numel() * buf.element_size()
    copies = {"send": timed(device, gather, repeats),
              "receive": timed(device, lambda: kv.scatter(dst, buf, range(layers)), repeats)}
    rows.append({"strategy": "fused", "tokens": tokens, "bytes": fused_bytes, "send": copies["send"],
                 "receive": copies["receive"]})
    for name, (fmt, params) in CODECS.items():
        codec = Codec(fmt, params).attach(kv, block, head_size)
        payload = torch.empty(codec.nbytes(layers, n), dtype=torch.uint8, device=device)

        def send(codec=codec, payload=payload):
            gather()
            codec.encode(buf, payload)

        def receive(codec=codec, payload=payload):
            kv.scatter(dst, codec.decode(payload, layers, n), range(layers))
        rows.append({"strategy": name, "tokens": tokens, "bytes": payload.numel(), "send": timed(device, send, repeats),
                     "receive": timed(device, receive, repeats)})
    fused_ms = statistics.median(rows[0]["send"]) + statistics.median(rows[0]["receive"])
    for r in rows:
        extra_ms = statistics.median(r["send"]) + statistics.median(r["receive"]) - fused_ms
        saved = fused_bytes - r["bytes"]
        # bytes / (GB/s) in ms = bytes / (GB/s * 1e6): pays below saved / extra_ms * 1e-6 GB/s
        r["pays_below_gbps"] = (saved / extra_ms / 1e6 if extra_ms > 0 else float("inf")) if saved else None
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--preset", default=None, choices=list(PRESETS),
                    help="default: tiny_llama on CPU, llama3_8b on CUDA")
    ap.add_argument("--tokens", type=int, nargs="+", default=[256, 1024])
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args()
    preset = args.preset or ("llama3_8b" if args.device == "cuda" else "tiny_llama")
    torch.manual_seed(0)
    print(f"device {args.device} ({torch.cuda.get_device_name(0) if args.device == 'cuda' else 'CPU'}), "
          f"{preset}'s KV, {args.repeats} repeats; ms as median [25th, 75th percentile]")
    print("| strategy | tokens | MiB moved | send: gather (+ compress) ms | receive: (reconstruct +) scatter ms | "
          "pays below (GB/s, computed) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for tokens in args.tokens:
        for r in bench(args.device, preset, tokens, args.repeats):
            pays = r["pays_below_gbps"]
            pays = "-" if pays is None else ("always" if pays == float("inf") else f"{pays:.3g}")
            print(f"| {r['strategy']} | {r['tokens']} | {r['bytes'] / 2**20:.2f} | {quartiles(r['send'])} | "
                  f"{quartiles(r['receive'])} | {pays} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
