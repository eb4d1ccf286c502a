"""The codec kernels (transfer_strategies/codec_kernel.py) run in Triton's interpreter on CPU
tensors against the torch codec they must equal: for int8 and int4, on vLLM's CPU layout and
FlashAttention's NHD and HND, bf16 and float32 KV, the payload (values and scales) byte for byte;
for float32 KV the blocks the receive kernel writes too, and the sender's check kernel against
its torch path (the payload's checksum, the reconstruction's digests, its errors:
scripts/bench_codecs.py's check_the_check, as on the GPU). Run as
`TRITON_INTERPRET=1 python -m tests.helpers.interpreted_codecs` (tests/test_codecs.py does);
prints what differs and exits 1, or 0 when nothing does.

What the interpreter cannot show, so not asked of it: FP8 (its float8 conversion is not the
GPU's), the bf16 rounding of a reconstruction (numpy's conversion, not round-to-nearest-even),
speed, and anything the GPU's compiler does (the FP8 check's alignment: README).
`libdevice.rint` has no interpreter version: round-to-nearest-even in float32 arithmetic stands
in for it (exact for the values the codecs round, |q| <= 128)."""

import os
import runpy
import sys
import types
from pathlib import Path

import torch
import triton
import triton.language as tl  # noqa: F401 (the interpreter wants it beside a jit function)

from transfer_strategies import codec_kernel
from transfer_strategies.codec_kernel import CodecKernel
from transfer_strategies.codecs import Codec, CodecParams
from transfer_strategies.kv_blocks import KVBlocks

check_the_check = runpy.run_path(str(Path(__file__).resolve().parents[2] / "scripts" / "bench_codecs.py"))[
    "check_the_check"]
CODECS = {"int8": CodecParams(), "int8/token": CodecParams("token"), "int4": CodecParams("token", 32)}
LAYOUTS = {"cpu": (20, 4, 16, 256), "NHD": (2, 20, 16, 4, 128), "HND": (2, 20, 4, 16, 128)}


@triton.jit
def _rint(x):
    return (x + 12582912.0) - 12582912.0  # 1.5 x 2^23: the sum keeps no fraction, rounded to even


def problems(checked: list[str]) -> list[str]:
    out = []
    ids, dst = [3, 4, 5, 11, 0], [13, 14, 15, 16, 17]
    for layout, shape in LAYOUTS.items():
        for dtype in (torch.bfloat16, torch.float32):
            g = torch.Generator().manual_seed(0)
            kv = KVBlocks({f"l{i}": (torch.randn(shape, generator=g) * (i + 1)).to(dtype) for i in range(3)}, 20, 4)
            kv.layers[0].view(-1)[::997] *= 50  # outliers, as K caches have
            for name, params in CODECS.items():
                where = f"{name} {layout} {dtype}"
                codec = Codec(name.split("/")[0], params).attach(kv, 16, 128)
                try:
                    kernel = CodecKernel(codec)
                except ValueError as e:
                    out.append(f"{where}: no kernel ({e})")
                    continue
                checked.append(where)
                buf = torch.empty(3, *kv.layer_shape(len(ids)), dtype=dtype)
                kv.gather(ids, buf, range(3))
                theirs = codec.encode(buf, torch.empty(codec.nbytes(3, len(ids)), dtype=torch.uint8))
                codec.kernel = kernel
                mine = codec.encode_plan(ids, torch.empty_like(theirs))()
                if not torch.equal(mine, theirs):
                    out.append(f"{where}: {(mine != theirs).sum().item()} of {mine.numel()} payload bytes differ")
                if dtype == torch.float32:
                    codec.decode_into(theirs, dst, first=1)
                    rebuilt = codec.decode(theirs, 3, len(ids)).narrow(1 + kv.block_dim, 1, len(ids) - 1)
                    got = torch.empty_like(rebuilt)
                    kv.gather(dst[1:], got, range(3))
                    if not torch.equal(got, rebuilt):
                        out.append(f"{where}: the blocks written differ from torch's reconstruction")
                    out += [f"{where}: {p}" for p in check_the_check(codec, kv, ids, theirs)]
    return out


def main() -> int:
    if os.environ.get("TRITON_INTERPRET") != "1":
        print("run with TRITON_INTERPRET=1")
        return 2
    CodecKernel.devices = ("cuda", "cpu")
    codec_kernel.libdevice = types.SimpleNamespace(rint=_rint)
    checked = []
    found = problems(checked)
    print("\n".join(found) or f"the kernels give torch's payloads and float32 blocks: {', '.join(checked)}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
