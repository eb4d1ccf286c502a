"""The staged channel: payloads in a staging buffer the decode worker owns and the prefill worker
writes into; doorbells and acknowledgements as frames over a local socket (frames.py).

The prefill worker (StagedSender) builds each payload in the buffer (`alloc`), or has `send`
copy it there, then rings the doorbell. The decode worker (StagedReceiver) reads payloads in
place and acknowledges each region when its transfer is released, which frees that region.

A full buffer: the decode worker only uses a request's messages after the harness has
submitted the decode request, which it does after the prefill step that sent them returned.
So a prefill step whose payloads outgrow the buffer (full_cache with four requests in a step)
cannot wait for the decode engine to free space. The sender then asks the receiver thread,
which answers at once whatever the engines are doing, to move still unused payloads out of
the staging buffer into memory of its own and acknowledge them (Reclaim). We chose this over
the sender spilling into its own memory and copying later: every message still reaches the
receiver's memory before `flush` returns (a send is done when it returns, as without
pressure), the payload is written to the buffer once as the project measures it, and the
extra copy is the receiver's, off both engines' critical path, and on a GPU device-local.
"""

from __future__ import annotations

import contextlib
import pickle
import queue
import threading
import time

import torch

from transfer_strategies.transport import buffers, rendezvous
from transfer_strategies.transport.allocator import StagingAllocator
from transfer_strategies.transport.frames import Ack, Doorbell, FrameSocket, Handle, Opened, Reclaim
from transfer_strategies.transport.inbox import Inbox, InboxReceiver
from transfer_strategies.transport.message import Message, as_bytes

# A region's life on the sender: handed out by alloc (only this worker can free it, by sending
# it), posted (its doorbell rings once the GPU has written it), announced (the receiver has it).
ALLOCATED, POSTED, ANNOUNCED = "allocated", "posted", "announced"


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


class StagedSender:
    def __init__(self, device: torch.device, rendezvous_path: str, host: str, timeout_s: float):
        self.device = device
        self.timeout_s = timeout_s
        self.sock = FrameSocket(rendezvous.accept(rendezvous.listen(host, rendezvous_path), timeout_s))
        try:
            handle = self.sock.recv(timeout_s)
        except TimeoutError:
            raise TimeoutError(f"the decode worker sent no staging buffer within {timeout_s:.0f} s") from None
        self.buffer = buffers.open_staging(pickle.loads(handle.data), device)
        self.sock.send(Opened())
        self.staging = self.buffer.tensor
        self.space = StagingAllocator(self.staging.numel())
        self._state: dict[int, str] = {}  # live region -> ALLOCATED, POSTED or ANNOUNCED
        self._asked: set[int] = set()  # regions the receiver was asked to reclaim
        self._cond = threading.Condition()
        self._error: BaseException | None = None
        # On a GPU: a CUDA event after the last payload was written into the receiver's memory,
        # which the GPU's clock times (transfer_ms). Over NIXL the GPU writes a mirror of it and
        # NIXL's write follows, which no event sees: None, and transfer_ms is the host's clock
        # from the gather's start to the payload delivered, as the receiver records it.
        self.last_written = None
        threading.Thread(target=self._guard(self._ack_loop), name="kv-ack", daemon=True).start()
        # background sends ring from a thread where there is something to wait for: the GPU
        # writing the payload, or its delivery into the receiver's memory (NIXL)
        self._outbox: queue.Queue | None = None
        if device.type == "cuda" or self.buffer.delivers:
            self._outbox = queue.Queue()
            threading.Thread(target=self._guard(self._ring_loop), name="kv-ring", daemon=True).start()

    def alloc(self, nbytes: int) -> torch.Tensor:
        """Space for one payload in the receiver's buffer; build the payload there to save a copy.
        When this worker's own unsent payloads fill the buffer, memory of its own instead
        (`send` then copies the payload over)."""
        if nbytes == 0:
            return self.staging[:0]
        region = self._reserve(nbytes, own_memory_ok=True)
        if region is None:
            return torch.empty(nbytes, dtype=torch.uint8, device=self.device)
        return self.staging[region:region + nbytes]

    def held(self) -> int:
        """Regions of the receiver's buffer still taken (allocated, or sent and not yet released)."""
        with self._cond:
            return len(self._state)

    def owns(self, payload: torch.Tensor) -> bool:
        """Whether the payload lies in this channel's send space (an alloc() region)."""
        offset = payload.data_ptr() - self.staging.data_ptr()
        return payload.device == self.staging.device and 0 <= offset < self.staging.numel()

    def discard(self, payload: torch.Tensor) -> None:
        """Give back the alloc() region of a payload that will not be sent (a dropped message)."""
        if not self.owns(payload):
            return
        with self._cond:
            region = self.space.region_at(payload.data_ptr() - self.staging.data_ptr())
            if region is not None and self._state.get(region) == ALLOCATED:
                del self._state[region]
                self.space.give(region)
                self._cond.notify_all()

    def send(self, transfer_id: str, index: int, count: int, payload: torch.Tensor, background: bool = False,
             **meta) -> int:
        """Post one message (its payload ideally built in `alloc`'s space) and return its size.
        On a GPU the doorbell rings once the GPU has written the payload, and over NIXL once the
        payload is in the receiver's memory: here, after waiting for that, or with
        background=True from a thread, so that a caller inside the forward pass (saving layer by
        layer) keeps launching work. Handing over to the thread costs time."""
        data = as_bytes(payload)
        region, offset = None, 0
        if data.numel():
            region, built_there = self._post(data)
            if not built_there:  # built elsewhere: copying it over is this channel's wire
                data = self.staging[region:region + data.numel()].copy_(data)
            offset = data.data_ptr() - self.staging.data_ptr()
        bell = Doorbell(transfer_id, index, count, offset, data.numel(), region, 0.0, meta)
        written = None
        if self.device.type == "cuda":
            written = torch.cuda.Event(enable_timing=True)
            written.record()  # on the stream that wrote the payload
            if not self.buffer.delivers:
                self.last_written = written
        if background and self._outbox is not None:
            self._outbox.put((written, bell))
            return data.numel()
        if written is not None:
            written.synchronize()
        self._ring(bell)
        return data.numel()

    def flush(self) -> None:
        """Wait until every posted message has been announced to the receiver."""
        if self._outbox is not None:
            self._outbox.join()
        if self._error is not None:
            raise RuntimeError(f"KV channel failed: {self._error}")

    def close(self) -> None:
        self.sock.close()

    # staging space ----------------------------------------------------------------
    def _post(self, data: torch.Tensor) -> tuple[int, bool]:
        """The region that will carry this payload, and whether the payload was built in it."""
        offset = data.data_ptr() - self.staging.data_ptr()
        with self._cond:
            if 0 <= offset < self.staging.numel():
                region = self.space.region_at(offset)
                if region is None or self._state[region] != ALLOCATED:
                    raise ValueError("a payload in the KV staging buffer outside any unsent alloc() region "
                                     "(each alloc() region carries one message)")
                self._state[region] = POSTED
                return region, True
        region = self._reserve(data.numel(), own_memory_ok=False)
        with self._cond:
            self._state[region] = POSTED
        return region, False

    def _reserve(self, nbytes: int, own_memory_ok: bool) -> int | None:
        """A new region of nbytes, once the receiver has freed enough (bounded by timeout_s).
        None (with own_memory_ok) when the only thing in the way is this worker's own unsent
        payloads, which no waiting frees."""
        if self.space.size_for(nbytes) > self.space.capacity:
            raise ValueError(f"a {_mib(nbytes)} payload does not fit the {_mib(self.space.capacity)} KV staging "
                             f"buffer: raise transport.staging_mb")
        deadline = time.monotonic() + self.timeout_s
        with self._cond:
            while True:
                if self._error is not None:
                    raise RuntimeError(f"KV channel failed: {self._error}")
                region = self.space.take(nbytes)
                if region is not None:
                    self._state[region] = ALLOCATED
                    return region
                victims = self.space.plan(nbytes, lambda r: self._state[r] != ALLOCATED)
                if victims is None:
                    if own_memory_ok:
                        return None
                    raise RuntimeError(f"a {_mib(nbytes)} payload cannot be staged: payloads allocated but not yet "
                                       f"sent hold the {_mib(self.space.capacity)} KV staging buffer; raise "
                                       f"transport.staging_mb")
                ask = [r for r in victims if self._state[r] == ANNOUNCED and r not in self._asked]
                if ask:  # sent under the lock, so no doorbell for a region can follow its Reclaim
                    self._asked.update(ask)
                    self.sock.send(Reclaim(ask))
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(
                        f"waited {self.timeout_s:.0f} s for the decode worker to free {_mib(nbytes)} of the "
                        f"{_mib(self.space.capacity)} KV staging buffer ({_mib(self.space.free_bytes)} free, "
                        f"{len(self.space.live)} regions in use)")
                self._cond.wait(min(left, 1.0))

    # threads ----------------------------------------------------------------------
    def _guard(self, loop):
        def run():
            try:
                loop()
            except BaseException as e:  # peer gone or channel closed: wake every waiter with the cause
                with self._cond:
                    self._error = e
                    self._cond.notify_all()
        return run

    def _ring(self, bell: Doorbell) -> None:
        if bell.nbytes:  # into the receiver's memory first, where the buffer is a copy of it (nixl.py)
            self.buffer.deliver(bell.offset, bell.nbytes, self.timeout_s)
        # Under the lock: an Ack or a Reclaim for this region cannot overtake its announcement.
        with self._cond:
            bell.written = time.monotonic()  # the payload is in the receiver's buffer from now on
            self.sock.send(bell)
            if bell.region is not None:
                self._state[bell.region] = ANNOUNCED
                self._cond.notify_all()  # an alloc waiting for room may now ask for this region

    def _ring_loop(self) -> None:
        while True:
            written, bell = self._outbox.get()
            try:
                if written is not None:
                    written.synchronize()
                self._ring(bell)
            except BaseException as e:
                with self._cond:
                    self._error = e
                    self._cond.notify_all()
            finally:
                self._outbox.task_done()

    def _ack_loop(self) -> None:
        while True:
            ack = self.sock.recv()
            if not isinstance(ack, Ack):
                raise RuntimeError(f"unexpected frame from the decode worker: {ack!r}")
            with self._cond:
                for r in ack.regions:
                    self.space.give(r)
                    del self._state[r]
                    self._asked.discard(r)
                self._cond.notify_all()


class StagedReceiver(InboxReceiver):
    def __init__(self, device: torch.device, staging_bytes: int, rendezvous_path: str, host: str,
                 timeout_s: float, inbox: Inbox | None = None, tag: int = 0, kind: str = "staged",
                 on_host: bool = False):
        """inbox: one shared with the channels from other prefill workers (fan_in.py), in which
        this channel's staging regions are told apart by tag; kind, on_host: the buffer's
        (buffers.create_staging)."""
        self.device = device
        self.tag = tag
        host, port = rendezvous.peer(rendezvous_path, host, timeout_s)
        self.sock = FrameSocket(rendezvous.connect(host, port, timeout_s))
        self.buffer = buffers.create_staging(device, staging_bytes, port, kind, on_host)
        self.staging = self.buffer.tensor
        self.sock.send(Handle(pickle.dumps(self.buffer.handle)))
        try:
            if not isinstance(self.sock.recv(timeout_s), Opened):
                raise ConnectionError("unexpected answer")
        except (ConnectionError, TimeoutError) as e:
            raise RuntimeError(f"the prefill worker could not map the KV staging buffer: {e}") from None
        self.buffer.mapped_by_both()
        self.inbox = inbox or Inbox(timeout_s)
        threading.Thread(target=self._receive_loop, name="kv-recv", daemon=True).start()

    def acknowledge(self, keys: list) -> None:
        """Free this channel's regions among these inbox keys ((tag, region) pairs)."""
        regions = [r for tag, r in keys if tag == self.tag]
        if regions:
            with contextlib.suppress(OSError):  # the prefill worker is gone: no one to give the space back to
                self.sock.send(Ack(regions))

    def close(self) -> None:
        self.sock.close()

    def _receive_loop(self) -> None:
        try:
            while True:
                frame = self.sock.recv()
                if isinstance(frame, Doorbell):
                    delivered = frame.written
                    # where it landed elsewhere first (NIXL through host memory), in our memory once copied over
                    if frame.nbytes and self.buffer.arrived(frame.offset, frame.nbytes):
                        delivered = time.monotonic()
                    payload = self.staging[frame.offset:frame.offset + frame.nbytes]
                    key = None if frame.region is None else (self.tag, frame.region)
                    self.inbox.put(Message(frame.transfer_id, frame.index, frame.count, payload, frame.meta,
                                           delivered, time.monotonic()), key)
                elif isinstance(frame, Reclaim):
                    self.acknowledge(self.inbox.evict([(self.tag, r) for r in frame.regions], self._move_out))
                else:
                    raise RuntimeError(f"unexpected frame from the prefill worker: {frame!r}")
        except BaseException as e:  # peer gone or channel closed: wake every waiter with the cause
            self.inbox.fail(e)

    def _move_out(self, payload: torch.Tensor) -> torch.Tensor:
        copy = torch.empty_like(payload)  # on the staging buffer's device: payloads never change device
        copy.copy_(payload)
        if copy.is_cuda:  # done before its region is acknowledged and rewritten
            torch.cuda.current_stream(copy.device).synchronize()
        return copy
