"""The codec kernels (transfer_strategies/codec_kernel.py) run in Triton's interpreter on CPU
tensors, judged as `scripts/bench_codecs.py --check` judges them on a GPU (check_against_torch):
int8 and int4 on vLLM's CPU layout and FlashAttention's NHD and HND, the payload (values and
scales) byte for byte for bf16 and float32 KV; for float32 KV the blocks the receive kernel
writes and the sender's check kernel against its torch path (the payload's checksum, the
reconstruction's digests, its errors). Run as
`TRITON_INTERPRET=1 python -m tests.helpers.interpreted_codecs [LAYOUT ...]` (tests/test_codecs.py
does; every layout when none is named); prints what differs and exits 1, or 0 when nothing does.

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

from transfer_strategies import codec_kernel, codecs
from transfer_strategies.codecs import CodecParams

bench_codecs = runpy.run_path(str(Path(__file__).resolve().parents[2] / "scripts" / "bench_codecs.py"))
CODECS = {"int8": ("int8", CodecParams()), "int8/token": ("int8", CodecParams("token")),
          "int4": ("int4", CodecParams("token", 32))}
LAYOUTS = {"cpu": (20, 4, 16, 256), **bench_codecs["LAYOUTS"]}  # vLLM's CPU layout: [blocks, heads, tokens, K|V]


@triton.jit
def _rint(x):
    return (x + 12582912.0) - 12582912.0  # 1.5 x 2^23: the sum keeps no fraction, rounded to even


def main(names: list[str]) -> int:
    if os.environ.get("TRITON_INTERPRET") != "1":
        print("run with TRITON_INTERPRET=1")
        return 2
    if set(names) - set(LAYOUTS):
        print(f"layouts: {', '.join(LAYOUTS)}")
        return 2
    layouts = {name: LAYOUTS[name] for name in names or LAYOUTS}
    codecs.KERNEL_DEVICES = ("cuda", "cpu")
    codec_kernel.libdevice = types.SimpleNamespace(rint=_rint)
    torch.manual_seed(0)
    found = bench_codecs["check_against_torch"]("cpu", CODECS, layouts, exact=(torch.float32,))
    checked = [f"{name} {layout} {dtype}" for layout in layouts for dtype in (torch.bfloat16, torch.float32)
               for name in CODECS]  # each one without a kernel would be among what differs
    print("\n".join(found) or f"the kernels give torch's payloads and float32 blocks: {', '.join(checked)}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
