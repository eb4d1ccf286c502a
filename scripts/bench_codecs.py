"""The lossy strategies' codecs on their own (transfer_strategies/codecs.py), against fused's copies,
on one device and one KV geometry: per request of N tokens, fused's gather and scatter beside each
codec's gather + compress and reconstruct + scatter, the bytes each moves, and the link bandwidth
below which a codec pays for itself (COMPUTED from these times and bytes, not measured on a link:
at bandwidth B a transfer takes copies + bytes / B, so the codec pays where
(fused bytes - its bytes) / B > its extra copy time).

    python scripts/bench_codecs.py                                   # CPU: vLLM's CPU layout, tiny-llama's shape
    python scripts/bench_codecs.py --device cuda --preset llama3_8b --tokens 2048 8192 16384

Times are medians over --repeats (with the 25th and 75th percentiles): CUDA events on a GPU, the
host's clock on CPU. The checks' columns: what the harness's checks cost each side (check.digests):
the sender's (fused: its blocks' digests; a codec: codec_checks.SendCheck, compression's checksum,
reconstruction's digests and error) and a lossy receiver's payload checksum, launched and waited
for (the digests of the blocks it writes cost what fused's sender's do).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from transfer_strategies.codec_checks import PayloadCheck, SendCheck  # noqa: E402
from transfer_strategies.codec_kernel import CodecKernel  # noqa: E402
from transfer_strategies.codecs import Codec, CodecParams  # noqa: E402
from transfer_strategies.digests import BlockDigests  # noqa: E402
from transfer_strategies.faults import checksum_hex, payload_sum  # noqa: E402
from transfer_strategies.kv_blocks import KVBlocks  # noqa: E402
from transfer_strategies.records import TransferRecord  # noqa: E402

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


LAYOUTS = {"NHD": (2, 20, 16, 4, 128), "HND": (2, 20, 4, 16, 128)}  # FlashAttention's, 20 blocks of 4 heads


def check_against_torch(device: str, codecs: dict = CODECS, layouts: dict = LAYOUTS,
                        exact: tuple = (torch.bfloat16, torch.float32)) -> list[str]:
    """Where the codecs run as kernels (codec_kernel.py), they must give torch's bytes and blocks:
    the sender checks with the one, the receiver rebuilds with the other. What differs, per codec,
    layout and dtype (empty: all the same). Payloads are compared for bf16 and float32 KV; the
    blocks written and the sender's check for the dtypes in `exact` (Triton's interpreter rounds
    bf16 its own way: tests/helpers/interpreted_codecs.py)."""
    problems = []
    for layout, shape in layouts.items():
        for dtype in (torch.bfloat16, torch.float32):
            kv = KVBlocks({f"l{i}": (torch.randn(shape, device=device) * (i + 1)).to(dtype) for i in range(3)}, 20, 4)
            kv.layers[0].view(-1)[::997] *= 50  # outliers, as K caches have
            ids, dst = [3, 4, 5, 11, 0], [13, 14, 15, 16, 17]
            for name, (fmt, params) in codecs.items():
                codec = Codec(fmt, params).attach(kv, 16, 128)
                where = f"{name} {layout} {dtype}"
                if codec.kernel is None:
                    problems.append(f"{where}: no kernel")
                    continue
                buf = torch.empty(3, *kv.layer_shape(len(ids)), dtype=dtype, device=device)
                kv.gather(ids, buf, range(3))
                out = torch.empty(codec.nbytes(3, len(ids)), dtype=torch.uint8, device=device)
                mine = codec.encode_plan(ids, out)()
                theirs = codec.encode(buf, torch.empty_like(mine))
                if not torch.equal(mine, theirs):
                    problems.append(f"{where}: {(mine != theirs).sum().item()} of {mine.numel()} payload bytes differ")
                if dtype not in exact:
                    continue
                codec.decode_into(theirs, dst, first=1)
                rebuilt = codec.decode(theirs, 3, len(ids)).narrow(1 + kv.block_dim, 1, len(ids) - 1)
                got = torch.empty_like(rebuilt)
                kv.gather(dst[1:], got, range(3))
                if not torch.equal(got.view(torch.uint8), rebuilt.contiguous().view(torch.uint8)):
                    problems.append(f"{where}: the blocks written differ from torch's reconstruction")
                problems += [f"{where}: {p}" for p in check_the_check(codec, kv, ids, theirs)]
    return problems


def check_the_check(codec: Codec, kv: KVBlocks, ids: list[int], payload: torch.Tensor) -> list[str]:
    """The sender's check as one kernel (codec_checks.SendCheck) against its torch path, and the
    payload checksum's kernel against torch's on the host: the same checksum and digests, the
    same largest errors, the means within float32's rounding."""
    digests = BlockDigests(kv, kernel=False)
    record, reference = TransferRecord.__new__(TransferRecord), TransferRecord.__new__(TransferRecord)
    SendCheck(codec, digests, ids).fill(record)
    kernel, codec.kernel = codec.kernel, None
    try:
        SendCheck(codec, digests, ids).fill(reference)
    finally:
        codec.kernel = kernel
    problems = []
    if record.payload_digest != reference.payload_digest:
        problems.append("the check's payload checksum differs from torch's")
    if record.digests != reference.digests:
        problems.append("the check's digests of the reconstruction differ from torch's")
    for key, theirs in reference.codec_error.items():
        mine = record.codec_error[key]
        tol = 0 if key == "max_abs" else 1e-5  # the relative ones divide in float64 here, float32 in torch
        if any(abs(a - b) > tol * abs(b) for a, b in zip(mine, theirs)):
            problems.append(f"the check's {key} {mine} differs from torch's {theirs}")
    if checksum_hex(int(payload_sum(payload))) != checksum_hex(int(payload_sum(payload.cpu()))):
        problems.append("the payload checksum's kernel differs from torch's")
    return problems


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
    digests = BlockDigests(kv)  # the sender's check of a lossless transfer: its blocks' digests
    rows.append({"strategy": "fused", "kernel": None, "tokens": tokens, "bytes": fused_bytes, "send": copies["send"],
                 "receive": copies["receive"], "check": timed(device, lambda: digests.launch(src).result(), repeats),
                 "checksum": None})
    for name, (fmt, params) in CODECS.items():
        codec = Codec(fmt, params).attach(kv, block, head_size)
        payload = torch.empty(codec.nbytes(layers, n), dtype=torch.uint8, device=device)
        send = codec.encode_plan(src, payload)  # as the strategy's send runs it (on CUDA: codec_kernel.py)
        rows.append({"strategy": name, "kernel": codec.kernel is not None, "tokens": tokens, "bytes": payload.numel(),
                     "send": timed(device, send, repeats),
                     "receive": timed(device, lambda codec=codec, payload=payload: codec.decode_into(payload, dst),
                                      repeats),
                     # the lossy checks (codec_checks.py), launched and waited for
                     "check": timed(device, lambda codec=codec: SendCheck(codec, digests, src).fill(
                         TransferRecord.__new__(TransferRecord)), repeats),
                     "checksum": timed(device, lambda payload=payload: PayloadCheck(payload).fill(
                         TransferRecord.__new__(TransferRecord)), repeats)})
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
    ap.add_argument("--warps", type=int, default=None,
                    help="the codec kernels' warps a program (default: CodecKernel.warps)")
    ap.add_argument("--check", action="store_true",
                    help="first check the kernels against torch (exit 1 if any differ)")
    args = ap.parse_args()
    if args.warps:
        CodecKernel.warps = args.warps
    if args.check:
        problems = check_against_torch(args.device)
        print("\n".join(problems) or "the kernels give torch's bytes and blocks: every codec, NHD and HND, "
                                     "bf16 and float32")
        if problems:
            return 1
    preset = args.preset or ("llama3_8b" if args.device == "cuda" else "tiny_llama")
    torch.manual_seed(0)
    print(f"device {args.device} ({torch.cuda.get_device_name(0) if args.device == 'cuda' else 'CPU'}), "
          f"{preset}'s KV, {args.repeats} repeats, codec kernels of {CodecKernel.warps} warps; "
          "ms as median [25th, 75th percentile]")
    print("| strategy | kernel | tokens | MiB moved | send: gather (+ compress) ms | "
          "receive: (reconstruct +) scatter ms | pays below (GB/s, computed) | sender's check ms | "
          "receiver's payload checksum ms |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for tokens in args.tokens:
        for r in bench(args.device, preset, tokens, args.repeats):
            pays = r["pays_below_gbps"]
            pays = "-" if pays is None else ("always" if pays == float("inf") else f"{pays:.3g}")
            kernel = "-" if r["kernel"] is None else r["kernel"]
            print(f"| {r['strategy']} | {kernel} | {r['tokens']} | {r['bytes'] / 2**20:.2f} | {quartiles(r['send'])} | "
                  f"{quartiles(r['receive'])} | {pays} | {quartiles(r['check'])} | "
                  f"{'-' if r['checksum'] is None else quartiles(r['checksum'])} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
