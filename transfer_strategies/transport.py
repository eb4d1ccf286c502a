"""The wire between a prefill worker and a decode worker.

One `Channel` per (prefill worker, decode worker) pair. The prefill side sends messages;
the decode side runs one receiver thread that posts receives back to back and parks each
message under its transfer id until the decode engine needs it. That is the seed's push
model: the sender never waits for the decode engine to ask for a request's KV.

Every message is a fixed-size JSON header (transfer id, index, count, byte size, send
timestamp) followed by a flat uint8 payload, so a strategy can send tensors of any dtype
and shape; the receiver views the bytes back as the dtype and shape it expects.

Backends (`open_channel`, chosen by strategy.params.transport):
  staged (default)  `StagedChannel`: the sender shares one staging buffer once, shared memory on
                    CPU or CUDA IPC on a GPU (both engines on one GPU, where NCCL refuses two
                    ranks), writes each payload there (strategies build payloads in it directly),
                    and the gloo header says where; the receiver reads the bytes in place.
  gloo (CPU)        `Channel`: headers and payloads both over gloo's TCP sockets.
"""

from __future__ import annotations

import inspect
import json
import os
import pickle
import socket
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


def _wait_for_port(rendezvous: str, timeout_s: float) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            return int(open(rendezvous).read())
        except (FileNotFoundError, ValueError):
            time.sleep(0.05)
    raise TimeoutError(f"the prefill worker did not publish its KV channel port in {rendezvous} within {timeout_s:.0f} s")


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    """A flat uint8 view of a contiguous tensor (no copy)."""
    return t.contiguous().view(-1).view(torch.uint8)


class Channel:
    """One-directional message channel, rank 0 sends and rank 1 receives."""

    def __init__(self, rank: int, host: str, rendezvous: str, backend: str = "gloo",
                 device: str = "cpu", timeout_s: float = 300.0):
        """rendezvous: a file through which the sender tells the receiver its port. The sender
        binds a free port itself and keeps it, so no other process can take it in between."""
        from vllm.distributed.utils import stateless_init_torch_distributed_process_group

        kwargs = {}
        if "timeout" in inspect.signature(stateless_init_torch_distributed_process_group).parameters:
            kwargs["timeout"] = timedelta(seconds=timeout_s)
        if rank == 0:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((host, 0))
            sock.listen()
            self.port = sock.getsockname()[1]
            tmp = f"{rendezvous}.tmp"
            with open(tmp, "w") as f:
                f.write(str(self.port))
            os.replace(tmp, rendezvous)
            kwargs["listen_socket"] = sock
        else:
            self.port = _wait_for_port(rendezvous, timeout_s)
        self.pg = stateless_init_torch_distributed_process_group(host, self.port, rank, 2, backend, **kwargs)
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

    def close(self) -> None:
        return None

    def alloc(self, nbytes: int) -> torch.Tensor:
        """A send buffer; payloads built in one avoid a copy on channels that stage them."""
        return torch.empty(nbytes, dtype=torch.uint8, device=self.device)

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


class StagedChannel(Channel):
    """Headers over gloo; payloads in a staging buffer of the sender's that the receiver maps
    once (shared memory on CPU, CUDA IPC on a GPU) and reads in place. The receiver acknowledges
    each transfer once it has read it (`release`), which frees that part of the buffer."""

    _ACK_TAG = 8

    def __init__(self, rank: int, host: str, rendezvous: str, device: torch.device, timeout_s: float,
                 buffer_bytes: int):
        super().__init__(rank, host, rendezvous, "gloo", "cpu", timeout_s)
        self.staging_device = device
        self._shm = None
        if rank == 0:
            self.staging, handle = self._create(device, buffer_bytes, shm_name(self.port))
            self._head = 0  # bump allocator; rewinds when every region has been acknowledged
            self._live = 0
            blob = pickle.dumps(handle)
            super().send("__staging__", 0, 1, torch.frombuffer(bytearray(blob), dtype=torch.uint8))
            self.flush()
            threading.Thread(target=self._ack_loop, name="kv-ack", daemon=True).start()
        else:
            msg = super().wait("__staging__")[0]
            self.staging = self._open(pickle.loads(msg.payload.numpy().tobytes()))
            super().release("__staging__")

    def _create(self, device: torch.device, nbytes: int, name: str):
        if device.type == "cuda":
            from torch.multiprocessing.reductions import reduce_tensor

            buf = torch.empty(nbytes, dtype=torch.uint8, device=device)
            return buf, ("cuda", reduce_tensor(buf))
        from multiprocessing import shared_memory

        try:  # a run that was killed may have left its segment behind
            shared_memory.SharedMemory(name=name).unlink()
        except FileNotFoundError:
            pass
        self._shm = shared_memory.SharedMemory(name=name, create=True, size=nbytes)
        return torch.frombuffer(self._shm.buf, dtype=torch.uint8), ("shm", name)

    def _open(self, handle) -> torch.Tensor:
        kind, info = handle
        if kind == "cuda":
            rebuild, args = info
            return rebuild(*args)
        from multiprocessing import resource_tracker, shared_memory

        self._shm = shared_memory.SharedMemory(name=info)
        resource_tracker.unregister(self._shm._name, "shared_memory")  # the sender owns it
        return torch.frombuffer(self._shm.buf, dtype=torch.uint8)

    def close(self) -> None:
        if self._shm is not None and self.rank == 0:
            self._shm.unlink()

    # sender
    def alloc(self, nbytes: int) -> torch.Tensor:
        if nbytes == 0:
            return self.staging[:0]
        region = -(-nbytes // 256) * 256  # keep every region aligned for any dtype view
        deadline = time.monotonic() + self.timeout_s
        with self._cond:
            while True:
                if self._live == 0:
                    self._head = 0
                if self._head + region <= self.staging.numel():
                    off, self._head = self._head, self._head + region
                    self._live += 1
                    return self.staging[off:off + nbytes]
                if nbytes > self.staging.numel():
                    raise RuntimeError(f"a {nbytes / 2**20:.0f} MiB payload does not fit the "
                                       f"{self.staging.numel() / 2**20:.0f} MiB staging buffer: raise "
                                       f"strategy.params.staging_mb")
                if self._error is not None:
                    raise RuntimeError(f"KV channel closed ({self._live} regions unacknowledged): {self._error}")
                if time.monotonic() > deadline:
                    raise TimeoutError("the decode engine acknowledged no KV for too long")
                self._cond.wait(0.5)

    def send(self, transfer_id: str, index: int, count: int, payload: torch.Tensor, **meta) -> int:
        data = as_bytes(payload)
        if data.numel() == 0:  # nothing to stage: a plain header
            return super().send(transfer_id, index, count, data.cpu(), **meta)
        base = self.staging.data_ptr()
        inside = base <= data.data_ptr() < base + self.staging.numel()
        if not inside:  # not built in a staging buffer: copying it there is this channel's "wire"
            staged = self.alloc(data.numel())
            staged.copy_(data)
            data = staged
        if self.staging_device.type == "cuda":
            torch.cuda.current_stream(self.staging_device).synchronize()  # the receiver reads on its own stream
        header = {"offset": data.data_ptr() - base, "nbytes": data.numel()}
        super().send(transfer_id, index, count, torch.empty(0, dtype=torch.uint8), ipc=header, **meta)
        return data.numel()

    def _ack_loop(self) -> None:
        ack = torch.empty(1, dtype=torch.int64)
        try:
            while True:
                self.pg.recv([ack], 1, self._ACK_TAG).wait()
                with self._cond:
                    self._live -= int(ack.item())
                    self._cond.notify_all()
        except BaseException as e:
            with self._cond:
                self._error = e
                self._cond.notify_all()

    # receiver
    def wait(self, transfer_id: str, index: int | None = None) -> list[Message]:
        msgs = super().wait(transfer_id, index)
        for m in msgs:
            ipc = m.meta.get("ipc")
            if ipc is not None and not m.meta.get("mapped"):
                m.payload = self.staging[ipc["offset"]:ipc["offset"] + ipc["nbytes"]]
                m.meta["mapped"] = True
        return msgs

    def release(self, transfer_id: str) -> None:
        with self._cond:
            box = self._inboxes.pop(transfer_id, None)
        if box is not None and box.messages:
            n = sum(1 for m in box.messages.values() if m.meta.get("ipc") is not None)
            self.pg.send([torch.tensor([n], dtype=torch.int64)], 0, self._ACK_TAG).wait()


def shm_name(port: int) -> str:
    """The CPU staging buffer's name in /dev/shm (the harness removes it if an engine was killed)."""
    return f"kvh-{port}"


def open_channel(rank: int, host: str, rendezvous: str, device: torch.device, timeout_s: float,
                 params: dict | None = None) -> Channel:
    params = params or {}
    transport = params.get("transport", "staged")
    if transport == "gloo" and device.type == "cpu":
        return Channel(rank, host, rendezvous, "gloo", "cpu", timeout_s)
    if transport == "staged" and device.type in ("cpu", "cuda"):
        default_mb = 1024 if device.type == "cpu" else 4096
        return StagedChannel(rank, host, rendezvous, device, timeout_s,
                             int(params.get("staging_mb", default_mb)) * 2**20)
    raise ValueError(f"no KV transport {transport!r} for device type {device.type!r}: use "
                     f"strategy.params.transport=staged (shared memory on CPU, CUDA IPC on GPU) or gloo (CPU)")
