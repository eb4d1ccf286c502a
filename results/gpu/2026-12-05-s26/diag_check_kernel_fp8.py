"""Session 26: which setting of the sender's check kernel makes its FP8 reconstruction right on the H200."""
import runpy
import sys
import time

sys.path.insert(0, ".")
bc = runpy.run_path("scripts/bench_codecs.py")
from transfer_strategies import codec_kernel as ck  # noqa: E402

orig = ck.CodecKernel.check


def variant(align=None, warps=None):
    def check(self, ids):
        a, w = self.align, self.warps
        if align is not None:
            self.align = align
        if warps is not None:
            self.warps = warps
        try:
            return orig(self, ids)
        finally:
            self.align, self.warps = a, w
    ck.CodecKernel.check = check


dev = sys.argv[1] if len(sys.argv) > 1 else "cuda"
for name, kw in [("align1", {"align": 1}), ("warps1", {"warps": 1}), ("align1_warps1", {"align": 1, "warps": 1})]:
    t = time.time()
    variant(**kw)
    probs = bc["check_against_torch"](dev)
    print(f"== {name}: {len(probs)} problems ({time.time() - t:.0f} s)", flush=True)
    print("\n".join(probs[:12]), flush=True)
