"""The NIXL staging buffer (transport=nixl): staged's channel (staged.py: the decode worker's
buffer, its space kept by the prefill worker, doorbells and acknowledgements over a socket) with
the payload carried across by NIXL, the library production P/D deployments move KV with (vLLM's
NixlConnector): a one-sided WRITE from the prefill worker's registered memory into the decode
worker's, over UCX (shared memory or TCP on these machines; RDMA or NVLink where there is one).

The decode worker registers its buffer with an agent of its own and sends the agent's metadata
and the buffer's address as the channel's handle. The prefill worker registers a mirror of the
buffer, the same size on its own device, where `alloc` hands out the regions it keeps for the
receiver's buffer; a payload built there crosses to the same offset in the receiver's buffer
(`deliver`) before its doorbell rings, so everything after the doorbell is staged's.

UCX picks its own path: within one machine shared memory (cross-memory attach) or CUDA IPC,
whatever network namespace each engine is in. To cross a link, the engines' environment names it
(harness/engine_config.py sets UCX_TLS=tcp and UCX_NET_DEVICES=<transport.ifname>).

On a GPU across a link (on_host; transport/__init__.py: nixl_on_host) NIXL writes between pinned
host buffers of the same size: UCX's TCP moved GPU memory at 2.2-2.9 Gbit/s on the H200, host
memory at 20 (scripts/nixl_probe.py, over loopback). The strategies still build and read payloads in GPU
memory; the sender copies each payload to the host in PIECE_BYTES pieces, each written across
while the next is copied, and the receiver copies it onto its GPU when the doorbell rings; the
transfer's time ends when it is there.

Progress: NIXL's own progress thread polls without pause, a whole core per agent (on the 2-core
machine two of them slowed every engine: the time after the forward pass went from 23 to 49 ms
on the same machine). So neither side starts it: the sender progresses its writes while it waits
for them, and the receiver, whose UCX must progress for a write over TCP to land, from a thread
that polls every PROGRESS_S.
"""

from __future__ import annotations

import atexit
import itertools
import os
import threading
import time

import torch

BACKEND = "UCX"
PROGRESS_S = 100e-6  # the receiver's polls: a write over TCP lands at most this late
PIECE_BYTES = 64 << 20  # on_host: copied off the GPU, then written across while the next is copied
_names = itertools.count()


def _agent(role: str):
    from nixl._api import nixl_agent, nixl_agent_config

    # names are unique between the engines of a machine: a sender meets one receiver under its name
    return nixl_agent(f"kv-{role}-{os.getpid()}-{next(_names)}",
                      nixl_agent_config(enable_prog_thread=False, backends=[BACKEND]))


def _where(t: torch.Tensor) -> tuple[str, int]:
    return ("VRAM", t.device.index or 0) if t.is_cuda else ("DRAM", 0)


class NixlStaging:
    """The decode worker's side: its buffer, registered with its agent (on_host: a pinned host
    buffer NIXL writes into, copied onto the GPU buffer as each payload arrives)."""

    def __init__(self, device: torch.device, nbytes: int, on_host: bool = False):
        self.agent = _agent("decode")
        self.tensor = torch.zeros(nbytes, dtype=torch.uint8, device=device)  # every page touched now
        self._landing = _host_twin(self.tensor) if on_host else self.tensor
        self._copies = torch.cuda.Stream(device) if on_host else None
        self._registered = self.agent.register_memory(self._landing)  # for as long as the worker lives
        mem, dev = _where(self._landing)
        self.handle = ("nixl", self.agent.get_agent_metadata(), self._landing.data_ptr(), nbytes, mem, dev)
        self._stop = threading.Event()
        self._poller = threading.Thread(target=self._progress, name="kv-nixl-progress", daemon=True)
        self._poller.start()
        # stopped before the interpreter finalizes: a daemon thread inside NIXL's binding then is
        # unwound through a noexcept frame, and the process aborts ("terminate called without an
        # active exception", exit -6) after its work is done
        atexit.register(self.close)

    def _progress(self) -> None:
        while not self._stop.is_set():  # the only caller of this agent from here on
            self.agent.get_new_notifs()  # progresses UCX (incoming writes) without a progress thread
            time.sleep(PROGRESS_S)

    def close(self) -> None:
        self._stop.set()
        self._poller.join()

    def arrived(self, offset: int, nbytes: int) -> bool:
        """Onto the GPU (on_host) before the payload is announced to the worker: whether it copied."""
        if self._copies is None:
            return False
        with torch.cuda.stream(self._copies):  # not the engine's stream: no wait behind its forward pass
            self.tensor[offset:offset + nbytes].copy_(self._landing[offset:offset + nbytes], non_blocking=True)
        self._copies.synchronize()
        return True

    def mapped_by_both(self) -> None:
        return None


class NixlMirror:
    """The prefill worker's side: the mirror its payloads are built in, and the WRITE across
    (where the receiver's buffer is host memory and ours on a GPU, through a pinned host twin)."""

    delivers = True  # a payload is in the receiver's memory only once deliver() returns

    def __init__(self, handle: tuple, device: torch.device):
        _, metadata, self._remote_addr, nbytes, self._remote_mem, self._remote_dev = handle
        self.agent = _agent("prefill")
        self.tensor = torch.zeros(nbytes, dtype=torch.uint8, device=device)
        on_host = self.tensor.is_cuda and self._remote_mem == "DRAM"
        self._source = _host_twin(self.tensor) if on_host else self.tensor
        self._copies = torch.cuda.Stream(device) if on_host else None
        self._registered = self.agent.register_memory(self._source)
        self._mem, self._dev = _where(self._source)
        self.peer = self.agent.add_remote_agent(metadata)
        self._lock = threading.Lock()  # one caller at a time: the worker's and the channel's ring thread

    def deliver(self, offset: int, nbytes: int, timeout_s: float) -> None:
        """Write bytes [offset, offset + nbytes) of the mirror to the same place in the decode
        worker's buffer; returns once they are there (NIXL's DONE: the write is complete at the
        target). On a GPU the payload must be written (its event waited for) first."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            writes = []
            try:
                if self._copies is None:
                    writes.append(self._write(offset, nbytes))
                else:
                    for start in range(offset, offset + nbytes, PIECE_BYTES):
                        n = min(PIECE_BYTES, offset + nbytes - start)
                        with torch.cuda.stream(self._copies):  # not the engine's stream (its forward pass)
                            self._source[start:start + n].copy_(self.tensor[start:start + n], non_blocking=True)
                            copied = torch.cuda.Event()
                            copied.record()
                        while not copied.query():  # the earlier pieces' writes go on meanwhile
                            self._poll(writes, nbytes, deadline, timeout_s)
                        writes.append(self._write(start, n))
                polls = 0
                while not self._poll(writes, nbytes, deadline, timeout_s):
                    polls += 1
                    if polls > 100:  # past the first ~100 us, leave the cores to the engines between polls
                        time.sleep(50e-6)
            finally:
                for handle in writes:
                    self.agent.release_xfer_handle(handle)

    def _write(self, offset: int, nbytes: int):
        local = self.agent.get_xfer_descs([(self._source.data_ptr() + offset, nbytes, self._dev)], self._mem)
        remote = self.agent.get_xfer_descs([(self._remote_addr + offset, nbytes, self._remote_dev)],
                                           self._remote_mem)
        handle = self.agent.initialize_xfer("WRITE", local, remote, self.peer)
        self.agent.transfer(handle)
        return handle

    def _poll(self, writes: list, nbytes: int, deadline: float, timeout_s: float) -> bool:
        """One check of every write (each check progresses UCX); whether all are DONE."""
        done = True
        for handle in writes:
            state = self.agent.check_xfer_state(handle)
            if state == "ERR":
                raise RuntimeError(f"NIXL write of {nbytes} bytes to the decode worker failed")
            done = done and state == "DONE"
        if not done and time.monotonic() > deadline:
            raise TimeoutError(f"a NIXL write of {nbytes} bytes took over {timeout_s:.0f} s")
        return done

    def mapped_by_both(self) -> None:
        return None


def _host_twin(t: torch.Tensor) -> torch.Tensor:
    """Pinned host memory the size of a GPU buffer, every page touched now."""
    return torch.zeros(t.numel(), dtype=t.dtype, pin_memory=True)
