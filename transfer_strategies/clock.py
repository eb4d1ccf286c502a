"""When a send starts and how long it takes: on the host's clock, and on a GPU on the GPU's own
clock (CUDA events), which is what transfer_ms means there; DeviceTimer times any other work on
the device the same way (digests, a codec).

On a GPU the host is usually ahead of the forward pass it launched: a send's copies are then
launched at once, queued behind the forward pass on the stream, and the clock starts when the
GPU reaches them (an event recorded at the start, waited for only when the first message is
posted). So launching the copies is not on the clock, and the host never stalls the GPU.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch


class SendClock:
    def __init__(self, device: torch.device, streaming: bool = False):
        """streaming: the send runs from inside the forward pass (layer by layer), where the
        clock starts now rather than when the GPU reaches this point."""
        self.streaming = streaming
        self.gpu_start = None
        self._t0: float | None = time.monotonic()
        if device.type == "cuda":
            self.gpu_start = torch.cuda.Event(enable_timing=True)
            self.gpu_start.record()
            if not streaming:
                self._t0 = None  # set when the GPU reaches gpu_start

    def start(self) -> float:
        """The host time the send started (on a GPU: waits until the GPU has reached it)."""
        if self._t0 is None:
            self.gpu_start.synchronize()
            self._t0 = time.monotonic()
        return self._t0

    def forward_done(self) -> float:
        """The host time the forward pass that computed the KV was done. A send that is not
        streaming starts right after it; a streaming one calls this at its end (then on a GPU it
        waits for the forward pass, with the layer copies launched inside it)."""
        if not self.streaming:
            return self.start()
        if self.gpu_start is not None:
            done = torch.cuda.Event()
            done.record()
            done.synchronize()
        return time.monotonic()

    def host_ms(self) -> float:
        return (time.monotonic() - self.start()) * 1e3

    def gpu_ms(self, last_written) -> float | None:
        """Start -> the last payload written (a CUDA event), on the GPU's clock: the copies plus
        any time the GPU waited for them to be launched, without the host's wait for the GPU."""
        if self.gpu_start is None or last_written is None:
            return None
        return self.gpu_start.elapsed_time(last_written)


class DeviceTimer:
    """How long some work on a device takes (the digests', a codec's): on CUDA between two events
    on the stream (the kernels' own time, whatever else the host does), elsewhere the host's clock."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        if self.cuda:
            self.start = torch.cuda.Event(enable_timing=True)
            self.start.record()
        else:
            self.t0 = time.perf_counter()

    def stop(self) -> Callable[[], float]:
        """A function that waits for the work, then returns its milliseconds."""
        if not self.cuda:
            ms = (time.perf_counter() - self.t0) * 1e3
            return lambda: ms
        end = torch.cuda.Event(enable_timing=True)
        end.record()

        def wait() -> float:
            end.synchronize()  # releases the GIL: the engine's thread runs meanwhile
            return self.start.elapsed_time(end)
        return wait
