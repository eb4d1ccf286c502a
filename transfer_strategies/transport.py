"""The wire between a prefill worker and a decode worker.

One `Channel` per (prefill worker, decode worker) pair. The prefill side sends messages;
the decode side runs one receiver thread that posts receives back to back and parks each
message under its transfer id until the decode engine needs it. That is the seed's push
model: the sender never waits for the decode engine to ask for a request's KV.

Every message is a fixed-size JSON header (transfer id, index, count, byte size, send
timestamp) followed by a flat uint8 payload, so a strategy can send tensors of any dtype
and shape; the receiver views the bytes back as the dtype and shape it expects.

Backends: gloo over TCP on CPU. CUDA backends plug in here (see `open_channel`).
"""

from __future__ import annotations

import inspect
import json
import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta

import torch

HEADER_BYTES = 1024
_TAG = 7


@dataclass
class Message:
    transfer_id: str
    index: int
    count: int
    payload: torch.Tensor  # flat uint8
    meta: dict
    arrived: float  # time.monotonic() when the payload had fully arrived


@dataclass
class _Inbox:
    messages: dict[int, Message] = field(default_factory=dict)
    count: int | None = None


def _encode_header(info: dict) -> torch.Tensor:
    raw = json.dumps(info).encode()
    if len(raw) > HEADER_BYTES:
        raise ValueError(f"message header too large ({len(raw)} > {HEADER_BYTES} bytes)")
    buf = torch.zeros(HEADER_BYTES, dtype=torch.uint8)
    buf[: len(raw)] = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
    return buf


def _decode_header(buf: torch.Tensor) -> dict:
    raw = bytes(buf.cpu().numpy().tobytes()).rstrip(b"\0")
    return json.loads(raw)


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    """A flat uint8 view of a contiguous tensor (no copy)."""
    return t.contiguous().view(-1).view(torch.uint8)


class Channel:
    """One-directional message channel, rank 0 sends and rank 1 receives."""

    def __init__(self, rank: int, host: str, port: int, backend: str = "gloo",
                 device: str = "cpu", timeout_s: float = 300.0):
        from vllm.distributed.utils import stateless_init_torch_distributed_process_group

        kwargs = {}
        if "timeout" in inspect.signature(stateless_init_torch_distributed_process_group).parameters:
            kwargs["timeout"] = timedelta(seconds=timeout_s)
        self.pg = stateless_init_torch_distributed_process_group(host, port, rank, 2, backend, **kwargs)
        self.rank = rank
        self.device = torch.device(device)
        self.timeout_s = timeout_s
        self._in_flight: list = []  # (work, payload) of sends not yet waited for
        self._inboxes: dict[str, _Inbox] = {}
        self._cond = threading.Condition()
        self._error: BaseException | None = None
        if rank == 1:
            self._thread = threading.Thread(target=self._receive_loop, name="kv-recv", daemon=True)
            self._thread.start()

    # ---- sender ----
    def send(self, transfer_id: str, index: int, count: int, payload: torch.Tensor, **meta) -> int:
        """Post one message and return its payload size; `flush` waits until it has left.
        The payload must not change before then."""
        data = as_bytes(payload)
        header = _encode_header({"id": transfer_id, "i": index, "n": count,
                                 "nbytes": data.numel(), "meta": meta}).to(self.device)
        self._in_flight.append((self.pg.send([header], 1, _TAG), header))
        if data.numel():
            self._in_flight.append((self.pg.send([data], 1, _TAG), data))
        return data.numel()

    def flush(self) -> None:
        for work, _ in self._in_flight:
            work.wait()
        self._in_flight.clear()

    # ---- receiver ----
    def _receive_loop(self) -> None:
        try:
            while True:
                header = torch.empty(HEADER_BYTES, dtype=torch.uint8, device=self.device)
                self.pg.recv([header], 0, _TAG).wait()
                info = _decode_header(header)
                payload = torch.empty(info["nbytes"], dtype=torch.uint8, device=self.device)
                if info["nbytes"]:
                    self.pg.recv([payload], 0, _TAG).wait()
                if self.device.type == "cuda":
                    torch.cuda.current_stream(self.device).synchronize()
                msg = Message(info["id"], info["i"], info["n"], payload, info["meta"], time.monotonic())
                with self._cond:
                    box = self._inboxes.setdefault(msg.transfer_id, _Inbox())
                    box.messages[msg.index] = msg
                    box.count = msg.count
                    self._cond.notify_all()
        except BaseException as e:  # peer gone or channel closed: wake every waiter with the cause
            with self._cond:
                self._error = e
                self._cond.notify_all()

    def wait(self, transfer_id: str, index: int | None = None) -> list[Message]:
        """Block until message `index` (or every message) of a transfer has arrived."""
        deadline = time.monotonic() + self.timeout_s

        def ready() -> bool:
            box = self._inboxes.get(transfer_id)
            if box is None:
                return False
            if index is not None:
                return index in box.messages
            return box.count is not None and len(box.messages) == box.count

        with self._cond:
            while not ready():
                if self._error is not None:
                    raise RuntimeError(f"KV channel closed while waiting for {transfer_id}: {self._error}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no KV arrived for transfer {transfer_id} within {self.timeout_s:.0f} s")
                self._cond.wait(min(left, 1.0))
            box = self._inboxes[transfer_id]
            if index is not None:
                return [box.messages[index]]
            return [box.messages[i] for i in range(box.count)]

    def release(self, transfer_id: str) -> None:
        """Drop a transfer's buffers once they have been scattered."""
        with self._cond:
            self._inboxes.pop(transfer_id, None)


def open_channel(rank: int, host: str, port: int, device: torch.device, timeout_s: float) -> Channel:
    if device.type == "cpu":
        return Channel(rank, host, port, "gloo", "cpu", timeout_s)
    if device.type == "cuda":
        return Channel(rank, host, port, "nccl", str(device), timeout_s)
    raise ValueError(f"no KV transport for device type {device.type!r}")
