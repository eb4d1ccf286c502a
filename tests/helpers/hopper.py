"""Triton kernels compiled for an H200 (sm_90) on a machine without a GPU: Triton's interpreter
accepts what its CUDA compiler refuses, and only the PTX shows how wide each load and store is."""

from __future__ import annotations

import re
from collections import Counter


def compile_for_hopper(fn, pointers: dict[str, str], constexprs: dict, divisible: set[str] = frozenset(),
                       **options):
    """`fn` compiled as a launch would: pointers (name: Triton type) 16-byte aligned, the integer
    arguments in `divisible` multiples of 16 (Triton specializes an argument so when it is one),
    the other arguments int32; returns the compiled kernel."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    constexprs = {n: v for n, v in constexprs.items() if n in fn.arg_names}
    signature = {n: "constexpr" if n in constexprs else pointers.get(n, "i32") for n in fn.arg_names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(fn.arg_names) if n in pointers or n in divisible}
    source = ASTSource(fn=fn, signature=signature, attrs=attrs,
                       constexprs={(fn.arg_names.index(n),): v for n, v in constexprs.items()})
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, **options})


def global_accesses(compiled) -> Counter:
    """How many of each width of global load and store the PTX holds (e.g. 'ld.global.v4.b32')."""
    return Counter(re.findall(r"\b(?:ld|st)\.global(?:\.\w+)*", compiled.asm["ptx"]))
