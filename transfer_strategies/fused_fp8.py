"""fused_fp8: fused, with the payload compressed to FP8 e4m3 on the sender (with the gather: on
CUDA one kernel does both) and reconstructed on the receiver (with the scatter), on the KV's own
device: one
byte a value plus a float32 scale per block, KV head and K/V (codecs.py says why those), so a
quarter of fused's bytes for float32 KV and half for bf16.

Lossy: the decode engine gets KV within 2^-4 of each value, not the sender's bits, so its outputs
may differ from the baseline's. What is still checked bit for bit is the transport: the
compressed payload's checksum on both sides, and the decode engine's blocks against the
reconstruction the sender computes of its own payload. The error itself is measured per layer
on the sender (records' codec_error), and its cost in outputs by the run's summary.
"""

from transfer_strategies.base import TransferConnector, TransferRequest
from transfer_strategies.codecs import CodecParams


class FusedFP8Connector(TransferConnector):
    codec = "fp8"
    Params = CodecParams

    def prepare_send(self, req: TransferRequest) -> None:  # before the forward pass: off the clock
        req.prepared = self.encode_plan(req)

    def send(self, req: TransferRequest) -> None:
        self.post(req, req.prepared())

    def receive(self, req: TransferRequest) -> None:
        (msg,) = self.collect(req)
        self.decode_into(req, msg.payload)
