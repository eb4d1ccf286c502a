"""Staging-buffer backends. The decode worker creates the buffer in its own memory and sends a
handle; the prefill worker opens it. Each backend keeps to itself the private APIs this needs
and the cleanup it owes.

  SharedMemoryStaging (CPU)  a POSIX shared-memory segment, /dev/shm/kvh-<port> while both
                             sides open it, unlinked as soon as both have it mapped.
  CudaIpcStaging (CUDA)      GPU memory of the decode engine's GPU, opened in the prefill
                             worker through CUDA IPC; freed with the decode worker.
  NixlStaging (nixl.py)      the decode worker's memory registered with NIXL, which the prefill
                             worker writes into from a mirror of its own (transport=nixl).

The prefill worker sees the buffer as `tensor`, the space it builds payloads in, and calls
`deliver` before a payload's doorbell: where `tensor` is the receiver's memory itself (shared
memory, CUDA IPC: `delivers` False) there is nothing left to do. The decode worker calls
`arrived` on each doorbell, before the payload is read: where it landed somewhere other than
`tensor` (NIXL through host memory), it is copied over then (and `arrived` says so: the payload
is in the receiver's memory from then on).
"""

from __future__ import annotations

import contextlib
import sys
from multiprocessing import resource_tracker, shared_memory

import torch


def shm_name(port: int) -> str:
    return f"kvh-{port}"


def _unlink(name: str) -> None:
    """Remove a segment's name (the mappings stay valid). SharedMemory.unlink would also tell
    the resource tracker, which does not track these segments (see _untracked)."""
    with contextlib.suppress(FileNotFoundError):
        shared_memory._posixshmem.shm_unlink("/" + name.lstrip("/"))


def _untracked(name: str, create: bool = False, size: int = 0) -> shared_memory.SharedMemory:
    """A segment the resource tracker leaves alone: the decode worker unlinks it itself, and
    the two engines may share one tracker, which would see the name twice or not at all."""
    if sys.version_info >= (3, 13):
        return shared_memory.SharedMemory(name=name, create=create, size=size, track=False)
    shm = shared_memory.SharedMemory(name=name, create=create, size=size)
    resource_tracker.unregister(shm._name, "shared_memory")
    return shm


def remove_leftover(port: int) -> None:
    """The segment of the channel that published `port`, if its engines were killed between
    creating it and both mapping it."""
    _unlink(shm_name(port))


class SharedMemoryStaging:
    delivers = False

    def __init__(self, shm: shared_memory.SharedMemory):
        self._shm = shm
        self.tensor = torch.frombuffer(shm.buf, dtype=torch.uint8)
        self.tensor.zero_()  # touch every page in this process now, not during the first transfers

    @classmethod
    def create(cls, nbytes: int, port: int) -> SharedMemoryStaging:
        _unlink(shm_name(port))  # a killed run may have left its segment behind
        return cls(_untracked(shm_name(port), create=True, size=nbytes))

    @classmethod
    def open(cls, handle: tuple, device: torch.device) -> SharedMemoryStaging:
        return cls(_untracked(handle[1]))

    @property
    def handle(self) -> tuple:
        return ("shm", self._shm.name)

    def mapped_by_both(self) -> None:
        """Nothing is left in /dev/shm from here on, whatever happens to either engine."""
        _unlink(self._shm.name)

    def deliver(self, offset: int, nbytes: int, timeout_s: float) -> None:
        return None

    def arrived(self, offset: int, nbytes: int) -> bool:
        return False

    def close(self) -> None:
        self.tensor = None
        with contextlib.suppress(BufferError):  # a view is still alive; the mapping goes with the process
            self._shm.close()


def _cuda_uuid(index: int) -> str:
    return str(torch.cuda.get_device_properties(index).uuid)


class CudaIpcStaging:
    delivers = False

    def __init__(self, tensor: torch.Tensor, handle: tuple | None = None):
        self.tensor = tensor
        self.handle = handle

    @classmethod
    def create(cls, nbytes: int, device: torch.device) -> CudaIpcStaging:
        from torch.multiprocessing.reductions import reduce_tensor

        buf = torch.zeros(nbytes, dtype=torch.uint8, device=device)
        return cls(buf, ("cuda", _cuda_uuid(device.index or 0), reduce_tensor(buf)))

    @classmethod
    def open(cls, handle: tuple, device: torch.device) -> CudaIpcStaging:
        _, uuid, (rebuild, args) = handle
        # The receiver numbered its GPU in its own CUDA_VISIBLE_DEVICES: find it in ours.
        if not any(_cuda_uuid(i) == uuid for i in range(torch.cuda.device_count())):
            raise RuntimeError(f"the decode engine's GPU {uuid} is not visible to the prefill engine: "
                               f"both need it in CUDA_VISIBLE_DEVICES for CUDA IPC")
        # Opened in our own GPU's context, not in that of the GPU holding it: CUDA maps the
        # memory into our GPU over NVLink (cudaIpcMemLazyEnablePeerAccess), the buffer is a
        # tensor on our device, and one batched copy kernel of ours writes a whole payload
        # across (352 GB/s for 1 GiB of KV blocks, 0.90 of a peer copy; scripts/gpu_copy_probe.py
        # --peer) instead of a cross-device copy per piece.
        args = list(args)
        args[6] = device.index or 0  # reduce_tensor's device index
        return cls(rebuild(*args))

    def mapped_by_both(self) -> None:
        return None

    def deliver(self, offset: int, nbytes: int, timeout_s: float) -> None:
        return None

    def arrived(self, offset: int, nbytes: int) -> bool:
        return False

    def close(self) -> None:
        self.tensor = None


def create_staging(device: torch.device, nbytes: int, port: int, kind: str = "staged", on_host: bool = False):
    """The decode worker's buffer: kind "staged" (shared memory or CUDA IPC) or "nixl" (on_host:
    NIXL writes into pinned host memory, copied onto the GPU as each payload arrives)."""
    if kind == "nixl":
        from transfer_strategies.transport.nixl import NixlStaging

        return NixlStaging(device, nbytes, on_host)
    if device.type == "cuda":
        return CudaIpcStaging.create(nbytes, device)
    return SharedMemoryStaging.create(nbytes, port)


def open_staging(handle: tuple, device: torch.device):
    """The prefill worker's view of the buffer whose handle the decode worker sent."""
    if handle[0] == "nixl":
        from transfer_strategies.transport.nixl import NixlMirror

        return NixlMirror(handle, device)
    return (CudaIpcStaging if handle[0] == "cuda" else SharedMemoryStaging).open(handle, device)
