"""The wire between a prefill worker and a decode worker.

One channel per (prefill worker, decode worker) pair. The prefill side sends messages; the
decode side runs one receiver thread that parks each message under its transfer id until the
decode engine needs it. That is the seed's push model: the sender never waits for the decode
engine to ask for a request's KV.

A message is a small JSON header (transfer id, index, count, byte size, timestamps) and a
flat uint8 payload, so a strategy can send tensors of any dtype and shape; the receiver views
the bytes back as the dtype and shape it expects.

Backends (`open_channel`, chosen by strategy.params.transport):
  staged (default)  `StagedChannel`: the receiver allocates one staging buffer in its own memory
                    (shared memory on CPU, CUDA memory shared through CUDA IPC on a GPU) and
                    maps it into the sender once. The sender writes each payload there
                    (strategies build payloads in it directly, so on two GPUs the gather itself
                    crosses NVLink), then rings a doorbell: the header over a local socket. The
                    receiver reads the bytes in place and acknowledges, which frees the space.
  gloo (CPU)        `GlooChannel`: headers and payloads both over gloo's TCP sockets.
"""

from __future__ import annotations

import inspect
import json
import os
import pickle
import queue
import socket
import struct
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
    meta: dict  # the sender's keyword arguments
    delivered: float  # time.monotonic() when the whole payload was in memory the receiver reads
    arrived: float  # time.monotonic() when the receiver thread had the message (>= delivered)


@dataclass
class _Inbox:
    messages: dict[int, Message] = field(default_factory=dict)
    count: int | None = None


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    """A flat uint8 view of a contiguous tensor (no copy)."""
    return t.contiguous().view(-1).view(torch.uint8)


def shm_name(port: int) -> str:
    """The CPU staging buffer's name in /dev/shm while both sides open it (the harness removes
    it if an engine was killed in between)."""
    return f"kvh-{port}"


def _publish_port(rendezvous: str, port: int) -> None:
    tmp = f"{rendezvous}.tmp"
    with open(tmp, "w") as f:
        f.write(str(port))
    os.replace(tmp, rendezvous)


def _wait_for_port(rendezvous: str, timeout_s: float) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            return int(open(rendezvous).read())
        except (FileNotFoundError, ValueError):
            time.sleep(0.05)
    raise TimeoutError(f"the prefill worker did not publish its KV channel port in {rendezvous} within {timeout_s:.0f} s")


class _Endpoint:
    """What both ends share: the decode side parks messages by transfer id (filled by its
    receiver thread); either side runs its background loop through `_start`."""

    def __init__(self, timeout_s: float):
        self.timeout_s = timeout_s
        self._inboxes: dict[str, _Inbox] = {}
        self._cond = threading.Condition()
        self._error: BaseException | None = None
        self.last_written = None  # sender on a GPU: a CUDA event after the last payload written

    def _start(self, loop) -> None:
        def run():
            try:
                loop()
            except BaseException as e:  # peer gone or channel closed: wake every waiter with the cause
                with self._cond:
                    self._error = e
                    self._cond.notify_all()

        threading.Thread(target=run, name="kv-recv", daemon=True).start()

    def _deliver(self, msg: Message) -> None:
        with self._cond:
            box = self._inboxes.setdefault(msg.transfer_id, _Inbox())
            box.messages[msg.index] = msg
            box.count = msg.count
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
        """Drop a transfer's messages once they have been scattered."""
        with self._cond:
            self._inboxes.pop(transfer_id, None)


# --------------------------------------------------------------------------- gloo
def _encode_header(info: dict) -> torch.Tensor:
    raw = json.dumps(info).encode()
    if len(raw) > HEADER_BYTES:
        raise ValueError(f"message header too large ({len(raw)} > {HEADER_BYTES} bytes)")
    buf = torch.zeros(HEADER_BYTES, dtype=torch.uint8)
    buf[: len(raw)] = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
    return buf


def _decode_header(buf: torch.Tensor) -> dict:
    return json.loads(bytes(buf.numpy().tobytes()).rstrip(b"\0"))


class GlooChannel(_Endpoint):
    """Headers and payloads over a gloo process group of the two workers (CPU tensors)."""

    def __init__(self, rank: int, host: str, rendezvous: str, timeout_s: float = 300.0):
        """rendezvous: a file through which the sender tells the receiver its port. The sender
        binds a free port itself and keeps it, so no other process can take it in between."""
        from vllm.distributed.utils import stateless_init_torch_distributed_process_group

        super().__init__(timeout_s)
        kwargs = {}
        if "timeout" in inspect.signature(stateless_init_torch_distributed_process_group).parameters:
            kwargs["timeout"] = timedelta(seconds=timeout_s)
        if rank == 0:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((host, 0))
            sock.listen()
            port = sock.getsockname()[1]
            _publish_port(rendezvous, port)
            kwargs["listen_socket"] = sock
        else:
            port = _wait_for_port(rendezvous, timeout_s)
        self.pg = stateless_init_torch_distributed_process_group(host, port, rank, 2, "gloo", **kwargs)
        self._in_flight: list = []  # (work, tensor) of sends not yet waited for
        if rank == 1:
            self._start(self._receive_loop)

    def alloc(self, nbytes: int) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8)

    def send(self, transfer_id: str, index: int, count: int, payload: torch.Tensor, background: bool = False,
             **meta) -> int:
        """Post one message and return its payload size; `flush` waits until it has left (gloo
        sends in the background anyway). The payload must not change before then."""
        data = as_bytes(payload.cpu())
        header = _encode_header({"id": transfer_id, "i": index, "n": count, "nbytes": data.numel(), "meta": meta})
        self._in_flight.append((self.pg.send([header], 1, _TAG), header))
        if data.numel():
            self._in_flight.append((self.pg.send([data], 1, _TAG), data))
        return data.numel()

    def flush(self) -> None:
        for work, _ in self._in_flight:
            work.wait()
        self._in_flight.clear()

    def _receive_loop(self) -> None:
        while True:
            header = torch.empty(HEADER_BYTES, dtype=torch.uint8)
            self.pg.recv([header], 0, _TAG).wait()
            info = _decode_header(header)
            payload = torch.empty(info["nbytes"], dtype=torch.uint8)
            if info["nbytes"]:
                self.pg.recv([payload], 0, _TAG).wait()
            now = time.monotonic()
            self._deliver(Message(info["id"], info["i"], info["n"], payload, info["meta"], now, now))

    def close(self) -> None:
        return None


# --------------------------------------------------------------------------- staged
def _send_frame(sock: socket.socket, data: bytes, lock: threading.Lock) -> None:
    with lock:
        sock.sendall(struct.pack("!I", len(data)) + data)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = sock.recv_into(view[got:])
        if k == 0:
            raise ConnectionError("the other worker closed the KV channel")
        got += k
    return bytes(buf)


def _recv_frame(sock: socket.socket) -> bytes:
    (n,) = struct.unpack("!I", _recv_exact(sock, 4))
    return _recv_exact(sock, n)


def _cuda_uuid(index: int) -> str:
    return str(torch.cuda.get_device_properties(index).uuid)


class StagedChannel(_Endpoint):
    """Payloads in a staging buffer the receiver owns and the sender writes into; headers and
    acknowledgements over a local socket (a doorbell: a gloo header took ~0.7 ms to arrive,
    a socket ~0.1 ms)."""

    def __init__(self, rank: int, host: str, rendezvous: str, device: torch.device, timeout_s: float,
                 buffer_bytes: int):
        super().__init__(timeout_s)
        self.rank = rank
        self.device = device
        self._lock = threading.Lock()
        self._shm = None
        if rank == 0:
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            listener.bind((host, 0))
            listener.listen(1)
            listener.settimeout(timeout_s)
            _publish_port(rendezvous, listener.getsockname()[1])
            try:
                self.sock, _ = listener.accept()
            except socket.timeout:
                raise TimeoutError(f"the decode worker did not connect to the KV channel within {timeout_s:.0f} s") from None
            listener.close()
        else:
            port = _wait_for_port(rendezvous, timeout_s)
            self.sock = socket.create_connection((host, port), timeout=timeout_s)
        self.sock.settimeout(None)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if rank == 1:
            self.staging, handle = self._create(device, buffer_bytes, shm_name(port))
            _send_frame(self.sock, pickle.dumps(handle), self._lock)
            if _recv_frame(self.sock) != b"opened":
                raise RuntimeError("the prefill worker could not map the KV staging buffer")
            if self._shm is not None:  # both sides have it mapped: nothing is left in /dev/shm whatever happens
                from multiprocessing import shared_memory

                shared_memory._posixshmem.shm_unlink(self._shm._name)
            self._start(self._receive_loop)
        else:
            self.staging = self._open(pickle.loads(_recv_frame(self.sock)))
            _send_frame(self.sock, b"opened", self._lock)
            self._head = 0  # bump allocator; rewinds when every region has been acknowledged
            self._live = 0
            self._start(self._ack_loop)
            if device.type == "cuda":
                self._outbox: queue.Queue = queue.Queue()
                threading.Thread(target=self._ring_loop, name="kv-ring", daemon=True).start()

    # the buffer ------------------------------------------------------------------
    def _create(self, device: torch.device, nbytes: int, name: str):
        if device.type == "cuda":
            from torch.multiprocessing.reductions import reduce_tensor

            buf = torch.zeros(nbytes, dtype=torch.uint8, device=device)
            return buf, ("cuda", _cuda_uuid(device.index or 0), reduce_tensor(buf))
        from multiprocessing import resource_tracker, shared_memory

        try:  # a run that was killed may have left its segment behind
            shared_memory.SharedMemory(name=name).unlink()
        except FileNotFoundError:
            pass
        self._shm = shared_memory.SharedMemory(name=name, create=True, size=nbytes)
        # We unlink it ourselves once the sender has it mapped; the two engines may share one
        # resource tracker, which would otherwise see the name twice or not at all.
        resource_tracker.unregister(self._shm._name, "shared_memory")
        buf = torch.frombuffer(self._shm.buf, dtype=torch.uint8)
        buf.zero_()  # touch every page now, not during the first transfers
        return buf, ("shm", name)

    def _open(self, handle) -> torch.Tensor:
        if handle[0] == "cuda":
            _, uuid, (rebuild, args) = handle
            # The receiver numbered its GPU in its own CUDA_VISIBLE_DEVICES: find it in ours.
            local = [i for i in range(torch.cuda.device_count()) if _cuda_uuid(i) == uuid]
            if not local:
                raise RuntimeError(f"the decode engine's GPU {uuid} is not visible to the prefill engine: "
                                   f"both need it in CUDA_VISIBLE_DEVICES for CUDA IPC")
            # Opened in our own GPU's context, not in that of the GPU holding it: CUDA maps the
            # memory into our GPU over NVLink (cudaIpcMemLazyEnablePeerAccess), the buffer is a
            # tensor on our device, and one batched copy kernel of ours writes a whole payload
            # across (352 GB/s for 1 GiB of KV blocks, 0.90 of a peer copy; scripts/gpu_copy_probe.py
            # --peer) instead of a cross-device copy per piece.
            args = list(args)
            args[6] = self.device.index or 0  # reduce_tensor's device index
            return rebuild(*args)
        from multiprocessing import resource_tracker, shared_memory

        self._shm = shared_memory.SharedMemory(name=handle[1])
        resource_tracker.unregister(self._shm._name, "shared_memory")  # the receiver unlinks it
        buf = torch.frombuffer(self._shm.buf, dtype=torch.uint8)
        buf.zero_()  # map every page in this process too
        return buf

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    # sender ----------------------------------------------------------------------
    def alloc(self, nbytes: int) -> torch.Tensor:
        """Space for one payload in the receiver's buffer; build the payload there to save a copy."""
        if nbytes == 0:
            return self.staging[:0]
        if nbytes > self.staging.numel():
            raise RuntimeError(f"a {nbytes / 2**20:.0f} MiB payload does not fit the {self.staging.numel() / 2**20:.0f} "
                               f"MiB staging buffer: raise strategy.params.staging_mb")
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
                if self._error is not None:
                    raise RuntimeError(f"KV channel closed ({self._live} regions unacknowledged): {self._error}")
                if time.monotonic() > deadline:
                    raise TimeoutError("the decode engine acknowledged no KV for too long")
                self._cond.wait(0.5)

    def send(self, transfer_id: str, index: int, count: int, payload: torch.Tensor, background: bool = False,
             **meta) -> int:
        """Post one message (its payload ideally built in `alloc`'s space) and return its size.
        On a GPU the doorbell rings once the GPU has written the payload: here, after waiting for
        that, or with background=True from a thread, so that a caller inside the forward pass
        (saving layer by layer) keeps launching work. Handing over to the thread costs time."""
        data = as_bytes(payload)
        if data.numel():
            base = self.staging.data_ptr()
            if not base <= data.data_ptr() < base + self.staging.numel():
                staged = self.alloc(data.numel())  # built elsewhere: copying it over is this channel's wire
                staged.copy_(data)
                data = staged
            where = {"offset": data.data_ptr() - base, "nbytes": data.numel()}
        else:
            where = {"offset": 0, "nbytes": 0}
        info = {"id": transfer_id, "i": index, "n": count, **where, "meta": meta}
        if self.device.type == "cuda":
            written = torch.cuda.Event(enable_timing=True)
            written.record()  # on the stream that wrote the payload
            self.last_written = written
            if background:
                self._outbox.put((written, info))
                return data.numel()
            written.synchronize()
        self._ring(info)
        return data.numel()

    def _ring(self, info: dict) -> None:
        info["written"] = time.monotonic()  # the payload is in the receiver's buffer from now on
        _send_frame(self.sock, json.dumps(info).encode(), self._lock)

    def _ring_loop(self) -> None:
        while True:
            written, info = self._outbox.get()
            try:
                written.synchronize()
                self._ring(info)
            except BaseException as e:
                with self._cond:
                    self._error = e
            finally:
                self._outbox.task_done()

    def flush(self) -> None:
        """Wait until every posted message has been announced to the receiver."""
        if self.device.type == "cuda":
            self._outbox.join()
        if self._error is not None:
            raise RuntimeError(f"KV channel failed: {self._error}")

    def _ack_loop(self) -> None:
        while True:
            n = json.loads(_recv_frame(self.sock))["ack"]
            with self._cond:
                self._live -= n
                self._cond.notify_all()

    # receiver --------------------------------------------------------------------
    def _receive_loop(self) -> None:
        while True:
            info = json.loads(_recv_frame(self.sock))
            off, n = info["offset"], info["nbytes"]
            msg = Message(info["id"], info["i"], info["n"], self.staging[off:off + n], info["meta"],
                          info["written"], time.monotonic())
            self._deliver(msg)

    def release(self, transfer_id: str) -> None:
        with self._cond:
            box = self._inboxes.pop(transfer_id, None)
        staged = sum(1 for m in box.messages.values() if m.payload.numel()) if box else 0
        if staged:
            _send_frame(self.sock, json.dumps({"ack": staged}).encode(), self._lock)


def open_channel(rank: int, host: str, rendezvous: str, device: torch.device, timeout_s: float,
                 params: dict | None = None):
    params = params or {}
    transport = params.get("transport", "staged")
    if transport == "gloo" and device.type == "cpu":
        return GlooChannel(rank, host, rendezvous, timeout_s)
    if transport == "staged" and device.type in ("cpu", "cuda"):
        default_mb = 256 if device.type == "cpu" else 4096
        return StagedChannel(rank, host, rendezvous, device, timeout_s,
                             int(params.get("staging_mb", default_mb)) * 2**20)
    raise ValueError(f"no KV transport {transport!r} for device type {device.type!r}: use "
                     f"strategy.params.transport=staged (shared memory on CPU, CUDA IPC on GPU) or gloo (CPU)")
