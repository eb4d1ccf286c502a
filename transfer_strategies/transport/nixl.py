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

UCX picks its own path: within one machine shared memory (cross-memory attach), whatever
network namespace each engine is in. To cross a link, the engines' environment names it
(harness/engine_config.py sets UCX_TLS=tcp and UCX_NET_DEVICES=<transport.ifname>).

Progress: NIXL's own progress thread polls without pause, a whole core per agent (on the 2-core
machine two of them slowed every engine: the time after the forward pass went from 23 to 49 ms
on the same machine). So neither side starts it: the sender progresses its writes while it waits
for them, and the receiver, whose UCX must progress for a write over TCP to land, from a thread
that polls every PROGRESS_S.
"""

from __future__ import annotations

import itertools
import os
import threading
import time

import torch

BACKEND = "UCX"
PROGRESS_S = 100e-6  # the receiver's polls: a write over TCP lands at most this late
_names = itertools.count()


def _agent(role: str):
    from nixl._api import nixl_agent, nixl_agent_config

    # names are unique between the engines of a machine: a sender meets one receiver under its name
    return nixl_agent(f"kv-{role}-{os.getpid()}-{next(_names)}",
                      nixl_agent_config(enable_prog_thread=False, backends=[BACKEND]))


def _where(t: torch.Tensor) -> tuple[str, int]:
    return ("VRAM", t.device.index or 0) if t.is_cuda else ("DRAM", 0)


class NixlStaging:
    """The decode worker's side: its buffer, registered with its agent."""

    def __init__(self, device: torch.device, nbytes: int):
        self.agent = _agent("decode")
        self.tensor = torch.zeros(nbytes, dtype=torch.uint8, device=device)  # every page touched now
        self._registered = self.agent.register_memory(self.tensor)  # for as long as the worker lives
        mem, dev = _where(self.tensor)
        self.handle = ("nixl", self.agent.get_agent_metadata(), self.tensor.data_ptr(), nbytes, mem, dev)
        threading.Thread(target=self._progress, name="kv-nixl-progress", daemon=True).start()

    def _progress(self) -> None:
        while True:  # the only caller of this agent from here on
            self.agent.get_new_notifs()  # progresses UCX (incoming writes) without a progress thread
            time.sleep(PROGRESS_S)

    def mapped_by_both(self) -> None:
        return None


class NixlMirror:
    """The prefill worker's side: the mirror its payloads are built in, and the WRITE across."""

    delivers = True  # a payload is in the receiver's memory only once deliver() returns

    def __init__(self, handle: tuple, device: torch.device):
        _, metadata, self._remote_addr, nbytes, self._remote_mem, self._remote_dev = handle
        self.agent = _agent("prefill")
        self.tensor = torch.zeros(nbytes, dtype=torch.uint8, device=device)
        self._registered = self.agent.register_memory(self.tensor)
        self._mem, self._dev = _where(self.tensor)
        self.peer = self.agent.add_remote_agent(metadata)
        self._lock = threading.Lock()  # one caller at a time: the worker's and the channel's ring thread

    def deliver(self, offset: int, nbytes: int, timeout_s: float) -> None:
        """Write bytes [offset, offset + nbytes) of the mirror to the same place in the decode
        worker's buffer; returns once they are there (NIXL's DONE: the write is complete at the
        target). On a GPU the payload must be written (its event waited for) first."""
        with self._lock:
            local = self.agent.get_xfer_descs([(self.tensor.data_ptr() + offset, nbytes, self._dev)], self._mem)
            remote = self.agent.get_xfer_descs([(self._remote_addr + offset, nbytes, self._remote_dev)],
                                               self._remote_mem)
            handle = self.agent.initialize_xfer("WRITE", local, remote, self.peer)
            try:
                state, deadline, polls = self.agent.transfer(handle), time.monotonic() + timeout_s, 0
                while state != "DONE":  # each check progresses the write
                    if state == "ERR":
                        raise RuntimeError(f"NIXL write of {nbytes} bytes to the decode worker failed")
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"a NIXL write of {nbytes} bytes took over {timeout_s:.0f} s")
                    polls += 1
                    if polls > 100:  # past the first ~100 us, leave the cores to the engines between polls
                        time.sleep(50e-6)
                    state = self.agent.check_xfer_state(handle)
            finally:
                self.agent.release_xfer_handle(handle)

    def mapped_by_both(self) -> None:
        return None
