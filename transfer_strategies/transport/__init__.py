"""The wire between a prefill worker and a decode worker.

One channel per (prefill worker, decode worker) pair: the prefill worker holds the sender, the
decode worker the receiver, whose thread parks each message under its transfer id until the
decode engine needs it. That is the seed's push model: the sender never waits for the decode
engine to ask for a request's KV. A message is a small header (transfer id, index, count,
byte size, timestamps, the sender's keyword arguments) and a flat uint8 payload, so a strategy
can send tensors of any dtype and shape; the receiver views the bytes back as it expects.

    sender = open_channel("sender", device, TransportSettings(), rendezvous, host, timeout_s)
    buf = sender.alloc(nbytes)            # build the payload here: no copy on the way
    sender.send(transfer_id, index, count, buf, t0=...); sender.flush()
    receiver.wait(transfer_id) -> [Message]; ...; receiver.release(transfer_id)
    receiver.ready({transfer_id, ...}, timeout_s) -> the ids whose messages are all in (no blocking
                                          past timeout_s: for requests parked in vLLM)
    receiver.when_complete(transfer_id, fn)  fn(messages) as soon as all are in, from the receiver's
                                          thread: for transfers no engine step waits for

Transports (transport.kind):
  staged (default)  staged.py: the payload is written straight into a staging buffer the
                    receiver owns (buffers.py: shared memory on CPU, CUDA IPC on a GPU; space
                    kept by allocator.py), then a doorbell over a local socket (frames.py).
  gloo (CPU)        gloo.py: headers and payloads over gloo's TCP sockets.
  nixl              nixl.py: staged's channel, the payload carried into the receiver's buffer by a
                    NIXL write (UCX: shared memory or TCP here) from a registered mirror; on a GPU
                    across a link through pinned host memory (nixl_on_host).
rendezvous.py: how the two find each other; inbox.py: the receiver's parked messages;
fan_in.py: a decode worker with channels from several prefill workers, fan_out.py: a prefill
worker with channels to several decode workers, each request to the one it names (serving's xPyD).
"""

from __future__ import annotations

from pathlib import Path

import torch

from transfer_strategies.connector_config import TransportSettings
from transfer_strategies.transport import buffers
from transfer_strategies.transport import rendezvous as _rendezvous
from transfer_strategies.transport.fan_in import FanIn
from transfer_strategies.transport.fan_out import FanOut
from transfer_strategies.transport.gloo import GlooReceiver, GlooSender
from transfer_strategies.transport.inbox import Inbox
from transfer_strategies.transport.message import Message, as_bytes
from transfer_strategies.transport.staged import StagedReceiver, StagedSender

__all__ = ["Message", "as_bytes", "open_channel", "remove_leftovers"]

DEFAULT_STAGING_MB = {"cpu": 256, "cuda": 4096}


def carries(kind: str, device_type: str) -> bool:
    """Whether transport `kind` moves KV held on `device_type`: gloo's from CPU memory only,
    staged's and nixl's wherever their staging buffer can live."""
    if kind == "gloo":
        return device_type == "cpu"
    return kind in ("staged", "nixl") and device_type in DEFAULT_STAGING_MB


def nixl_on_host(transport: TransportSettings, device_type: str) -> bool:
    """Whether NIXL's buffers are pinned host memory (transport.buffer_device): by default where a
    GPU's KV crosses a link, since UCX's TCP moved GPU memory at 2.2-2.9 Gbit/s on the H200 and
    host memory at 20 (scripts/nixl_probe.py), as vLLM's NixlConnector can with a CPU
    kv_buffer_device; on CPU the KV is in host memory already."""
    if device_type != "cuda":
        return False
    if transport.buffer_device is None:
        return bool(transport.ifname)
    return transport.buffer_device == "cpu"


def open_channel(role: str, device: torch.device, transport: TransportSettings | None, rendezvous: str | list[str],
                 host: str, timeout_s: float, on_open=None, open_timeout_s: float | None = None):
    """role: "sender" (prefill worker) or "receiver" (decode worker); transport: the channel's
    kind and staging size (None: the defaults); rendezvous: a file
    through which the sender tells the receiver the port it bound, or for a receiver fed by
    several prefill workers one file per worker (a FanIn of channels, opened in that order), for
    a sender that feeds several decode workers one per decode worker (a FanOut, the same);
    every wait is bounded by timeout_s, but opening the channel, which waits for the other
    engine to start, by open_timeout_s where that is longer. on_open(channel) runs as each
    channel opens (the layout handshake). Blocks until the other workers have opened their ends."""
    opening_s = max(timeout_s, open_timeout_s or 0.0)
    channel = _open(role, device, transport or TransportSettings(), rendezvous, host, opening_s, on_open)
    if hasattr(channel, "inbox"):  # from now on, a transfer waits timeout_s
        channel.inbox.timeout_s = timeout_s
    else:
        channel.timeout_s = timeout_s
    return channel


def _open(role: str, device: torch.device, transport: TransportSettings, rendezvous: str | list[str],
          host: str, timeout_s: float, on_open):
    if role not in ("sender", "receiver"):
        raise ValueError(f"a KV channel role is 'sender' or 'receiver', not {role!r}")
    paths = [rendezvous] if isinstance(rendezvous, str) else list(rendezvous)
    kind = transport.kind
    if not carries(kind, device.type):
        raise ValueError(f"no KV transport {kind!r} for device type {device.type!r}: use transport.kind=staged "
                         f"(shared memory on CPU, CUDA IPC on GPU), nixl or gloo (CPU)")
    if kind == "gloo":
        if role == "sender":
            return _senders(paths, on_open, lambda path: GlooSender(path, host, timeout_s))
        return _receivers(paths, timeout_s, on_open, lambda path, **kw: GlooReceiver(path, host, timeout_s, **kw))
    if role == "sender":  # the receiver sizes the buffer
        return _senders(paths, on_open, lambda path: StagedSender(device, path, host, timeout_s))
    mb = transport.staging_mb
    mb = DEFAULT_STAGING_MB[device.type] if mb is None else int(mb)
    if mb <= 0:
        raise ValueError(f"transport.staging_mb must be positive, got {mb}")
    return _receivers(paths, timeout_s, on_open,
                      lambda path, **kw: StagedReceiver(device, mb * 2**20, path, host, timeout_s, kind=kind,
                                                        on_host=kind == "nixl" and nixl_on_host(transport, device.type),
                                                        **kw))


def _opened(channel, on_open):
    if on_open is not None:
        on_open(channel)
    return channel


def _senders(paths: list[str], on_open, make):
    if len(paths) == 1:
        return _opened(make(paths[0]), on_open)
    # one at a time in the listed order: every decode worker opens its channels in the prefill
    # workers' order, so the pairs open in one order everywhere and no two ends wait on each other
    senders = []
    try:
        for path in paths:
            senders.append(_opened(make(path), on_open))
    except BaseException:
        for s in senders:
            s.close()
        raise
    return FanOut(senders)


def _receivers(paths: list[str], timeout_s: float, on_open, make):
    if len(paths) == 1:
        return _opened(make(paths[0]), on_open)
    inbox = Inbox(timeout_s, channels=len(paths))
    # one at a time, each handshake done before the next channel opens: the layout messages of
    # different prefill workers share a transfer id
    receivers = []
    try:
        for tag, path in enumerate(paths):
            receivers.append(_opened(make(path, inbox=inbox, tag=tag), on_open))
    except BaseException:
        for r in receivers:
            r.close()
        raise
    return FanIn(receivers, inbox)


def remove_leftovers(rendezvous) -> None:
    """What a channel leaves behind when its engines were killed while opening it (the CPU
    staging buffer's name, between the decode worker creating it and both mapping it). The
    harness calls this after stopping the engines; rendezvous: one path or several."""
    for path in [rendezvous] if isinstance(rendezvous, str | Path) else rendezvous:
        fixed = _rendezvous.address(str(path))
        port = fixed[1] if fixed else _rendezvous.published_port(str(path))
        if port is not None:
            buffers.remove_leftover(port)
