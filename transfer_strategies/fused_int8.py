"""fused_int8: fused_fp8 with symmetric int8 in place of FP8: one byte a value and a float32
scale per block, KV head and K/V, each value within 1/254 of its group's largest magnitude.
Where FP8's error follows each value, int8's is even across its group: small values near a
large one lose most."""

from transfer_strategies.fused_fp8 import FusedFP8Connector


class FusedInt8Connector(FusedFP8Connector):
    codec = "int8"
