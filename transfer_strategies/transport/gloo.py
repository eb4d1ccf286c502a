"""The gloo channel (CPU): headers and payloads both over a gloo process group of the two
workers, through gloo's TCP sockets. A header is a fixed-size tensor holding a frames.Doorbell."""

from __future__ import annotations

import inspect
import struct
import threading
import time
from datetime import timedelta

import msgspec
import torch

from transfer_strategies.transport import rendezvous
from transfer_strategies.transport.frames import Doorbell
from transfer_strategies.transport.inbox import Inbox, InboxReceiver
from transfer_strategies.transport.message import Message, as_bytes

HEADER_BYTES = 1024
_TAG = 7
_LEN = struct.Struct("!I")
_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder(Doorbell).decode


def _process_group(host: str, port: int, rank: int, timeout_s: float, listener=None):
    from vllm.distributed.utils import stateless_init_torch_distributed_process_group

    kwargs = {}
    if "timeout" in inspect.signature(stateless_init_torch_distributed_process_group).parameters:
        kwargs["timeout"] = timedelta(seconds=timeout_s)
    if listener is not None:
        kwargs["listen_socket"] = listener
    return stateless_init_torch_distributed_process_group(host, port, rank, 2, "gloo", **kwargs)


class GlooSender:
    def __init__(self, rendezvous_path: str, host: str, timeout_s: float):
        # We bind the store's port ourselves and keep it (rendezvous.py): no other process takes it.
        listener = rendezvous.listen(host, rendezvous_path)
        host, port = listener.getsockname()
        self.pg = _process_group(host, port, 0, timeout_s, listener)
        self._in_flight: list = []  # (work, tensor) of sends not yet waited for
        self.last_written = None

    def alloc(self, nbytes: int) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8)

    def held(self) -> int:  # nothing of the receiver's: payloads leave from our own memory
        return 0

    def owns(self, payload: torch.Tensor) -> bool:  # no send space: payloads are sent from where they are
        return False

    def discard(self, payload: torch.Tensor) -> None:
        return None

    def send(self, transfer_id: str, index: int, count: int, payload: torch.Tensor, background: bool = False,
             **meta) -> int:
        """Post one message and return its payload size; `flush` waits until it has left (gloo
        sends in the background anyway). The payload must not change before then."""
        data = as_bytes(payload.cpu())
        raw = _encode(Doorbell(transfer_id, index, count, 0, data.numel(), None, 0.0, meta))
        if _LEN.size + len(raw) > HEADER_BYTES:
            raise ValueError(f"message header too large ({len(raw)} > {HEADER_BYTES - _LEN.size} bytes)")
        header = torch.zeros(HEADER_BYTES, dtype=torch.uint8)
        header[:_LEN.size + len(raw)] = torch.frombuffer(bytearray(_LEN.pack(len(raw)) + raw), dtype=torch.uint8)
        self._in_flight.append((self.pg.send([header], 1, _TAG), header))
        if data.numel():
            self._in_flight.append((self.pg.send([data], 1, _TAG), data))
        return data.numel()

    def flush(self) -> None:
        for work, _ in self._in_flight:
            work.wait()
        self._in_flight.clear()

    def close(self) -> None:
        return None


class GlooReceiver(InboxReceiver):
    def __init__(self, rendezvous_path: str, host: str, timeout_s: float, inbox: Inbox | None = None, tag: int = 0):
        host, port = rendezvous.peer(rendezvous_path, host, timeout_s)
        self.pg = _process_group(host, port, 1, timeout_s)
        self.inbox = inbox or Inbox(timeout_s)  # payloads are our own memory: nothing to acknowledge
        threading.Thread(target=self._receive_loop, name="kv-recv", daemon=True).start()

    def close(self) -> None:
        return None

    def _receive_loop(self) -> None:
        try:
            while True:
                header = torch.empty(HEADER_BYTES, dtype=torch.uint8)
                self.pg.recv([header], 0, _TAG).wait()
                raw = header.numpy().tobytes()
                (n,) = _LEN.unpack_from(raw)
                bell = _decode(raw[_LEN.size:_LEN.size + n])
                payload = torch.empty(bell.nbytes, dtype=torch.uint8)
                if bell.nbytes:
                    self.pg.recv([payload], 0, _TAG).wait()
                now = time.monotonic()
                self.inbox.put(Message(bell.transfer_id, bell.index, bell.count, payload, bell.meta, now, now))
        except BaseException as e:  # peer gone or group closed: wake every waiter with the cause
            self.inbox.fail(e)
