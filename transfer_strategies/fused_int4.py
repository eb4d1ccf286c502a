"""fused_int4: the aggressive codec. Symmetric 4-bit values (-7..7, two a byte) with a float32
scale per token, KV head and 32 features: 5 bits a value with its scale, a sixth of fused's bytes
for float32 KV and under a third for bf16; each value within 1/14 of its group's largest
magnitude. Groups this small keep an outlier feature or token from spending every other
value's 15 levels (as KIVI and llama.cpp's 4-bit formats group)."""

from dataclasses import dataclass
from typing import Literal

from transfer_strategies.codecs import CodecParams
from transfer_strategies.fused_fp8 import FusedFP8Connector


class FusedInt4Connector(FusedFP8Connector):
    codec = "int4"

    @dataclass(frozen=True)
    class Params(CodecParams):
        scale: Literal["block", "token"] = "token"
        channels: int = 32
