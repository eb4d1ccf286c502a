"""The staged channel's control plane: typed frames over one TCP socket between the two workers.

Each frame is a 4-byte length and a msgpack-encoded msgspec Struct. msgspec (a vLLM dependency)
types the frames and encodes a doorbell in ~0.4 us against ~4.5 us for the JSON this replaces.
The socket stays a plain TCP socket rather than pyzmq: a doorbell took a median 22 us one way
on it against 33 us through a zmq PUSH/PULL pair (zmq hands every message to its I/O thread at
both ends), and one socket carries both directions, which a zmq socket used from two threads
may not.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading

import msgspec


class Handle(msgspec.Struct, tag=True):
    """Receiver -> sender, first: how to map the staging buffer (a pickled backend handle)."""
    data: bytes


class Opened(msgspec.Struct, tag=True):
    """Sender -> receiver: the staging buffer is mapped on both sides."""


class Doorbell(msgspec.Struct, tag=True):
    """Sender -> receiver: a message's payload is in the staging buffer (gloo: follows)."""
    transfer_id: str
    index: int
    count: int
    offset: int  # of the payload in the staging buffer
    nbytes: int
    region: int | None  # the staging region that holds it (None: an empty payload)
    written: float  # time.monotonic() when the payload was in the receiver's memory
    meta: dict


class Reclaim(msgspec.Struct, tag=True):
    """Sender -> receiver: the buffer is full; move these regions' payloads out if still unused."""
    regions: list[int]


class Ack(msgspec.Struct, tag=True):
    """Receiver -> sender: these regions are free again."""
    regions: list[int]


Frame = Handle | Opened | Doorbell | Reclaim | Ack
_LEN = struct.Struct("!I")


class FrameSocket:
    """One connected TCP socket. Any thread may send (sends are serialised); one thread receives."""

    def __init__(self, sock: socket.socket):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = sock
        self._lock = threading.Lock()
        self._encoder = msgspec.msgpack.Encoder()
        self._decoder = msgspec.msgpack.Decoder(Frame)

    def send(self, frame: Frame) -> None:
        with self._lock:
            data = self._encoder.encode(frame)
            self.sock.sendall(_LEN.pack(len(data)) + data)

    def recv(self, timeout_s: float | None = None) -> Frame:
        """The next frame; timeout_s bounds the wait (None: wait for as long as the peer is there)."""
        if timeout_s is None:
            return self._recv()
        self.sock.settimeout(timeout_s)  # only while one thread uses the socket (the handshake)
        try:
            return self._recv()
        finally:
            self.sock.settimeout(None)

    def _recv(self) -> Frame:
        (n,) = _LEN.unpack(self._recv_exact(_LEN.size))
        return self._decoder.decode(self._recv_exact(n))

    def _recv_exact(self, n: int) -> bytes:
        buf = bytearray(n)
        view, got = memoryview(buf), 0
        while got < n:
            k = self.sock.recv_into(view[got:])
            if k == 0:
                raise ConnectionError("the other worker closed the KV channel")
            got += k
        return buf

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()
