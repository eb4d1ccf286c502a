"""Stopping a process group (an engine, a vllm serve instance) and what it leaves behind.

The harness kills engines by process group: `kill` until none of it is left. Named shared
memory is what a killed group leaves in /dev/shm.

vLLM's processes create named segments that only their own clean exit removes: the message
queues between an API server and its engine core, the CPU build's all-reduce buffers between
TP workers (`vllm_dist_<id>-tp:0-[0-1]-cpushm_<rank>`, 8 MiB each) and Python's multiprocessing
semaphores (`sem.mp-*`). The harness stops engines by killing their process group, so it removes
them itself: it notes what the group maps while it runs, and after the group is gone unlinks
those that no live process maps (a segment both engines share stays while the other one runs).
A semaphore that vLLM's processes opened and closed again is mapped by none of them when they
are killed: left to Python's resource tracker, which dies with the group. A run that starts
servers removes the sem.mp-* files that appeared while they ran and that no live process maps
once they are stopped (a live creator maps its semaphore for as long as it may hand it on).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import psutil

SHM = "/dev/shm/"


def _mappings(pid: str) -> list[tuple[int, str]]:
    """(inode, path) of each /dev/shm file the process maps."""
    found = []
    with contextlib.suppress(OSError), open(f"/proc/{pid}/maps") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)  # address, perms, offset, device, inode, path
            if len(fields) == 6 and fields[5].startswith(SHM):
                found.append((int(fields[4]), fields[5].strip().removesuffix(" (deleted)")))
    return found


def _mapped_by(pid: str) -> set[str]:
    return {path for _, path in _mappings(pid)}


def members(pgid: int) -> list[int]:
    """The processes of the group, as `pgrep -g` lists them (pids)."""
    out = []
    for pid in psutil.pids():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if os.getpgid(pid) == pgid:
                out.append(pid)
    return out


def segments_of_group(pgid: int) -> set[str]:
    """/dev/shm files mapped by any live process of the process group."""
    return set().union(*(_mapped_by(str(pid)) for pid in members(pgid)))


def semaphores() -> set[str]:
    """Python's multiprocessing semaphores in /dev/shm (sem.mp-*)."""
    return {SHM + name for name in os.listdir(SHM) if name.startswith("sem.mp-")}


def unmapped(paths: set[str]) -> set[str]:
    """Those of `paths` (/dev/shm files) that no live process maps: what stopped processes left
    behind, not what a process still running (another run beside this one) uses. Judged by inode:
    glibc's sem_open maps a semaphore under a temporary name it then renames, so a live process's
    sem.mp-* shows in its maps as /dev/shm/sem.XXXXXX (deleted); by name, another test session's
    queues looked unmapped and were removed under it (its spawned children then failed to open them)."""
    if not paths:
        return set()
    in_use = {inode for p in Path("/proc").iterdir() if p.name.isdigit() for inode, _ in _mappings(p.name)}
    left = set()
    for path in paths:
        with contextlib.suppress(OSError):  # gone already
            if os.stat(path).st_ino not in in_use:
                left.add(path)
    return left


def remove_unmapped(paths: set[str]) -> None:
    """Unlink those of `paths` that no live process maps any more."""
    for path in unmapped(paths):
        with contextlib.suppress(FileNotFoundError, PermissionError):
            os.unlink(path)


def wait_gone(pgid: int, timeout_s: float) -> bool:
    """Whether the group empties by itself within timeout_s: after a clean exit of its leader,
    Python's multiprocessing resource tracker unlinks the semaphores (sem.mp-*) left to it, then
    exits; killed, it leaves them, and no process maps them for remove_unmapped to find."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not members(pgid):
            return True
        time.sleep(0.05)
    return False


def kill(pgid: int, reap: Callable[[], object], timeout_s: float = 10.0) -> None:
    """SIGKILL the group until none of it is left (TP workers outlive their engine by a moment,
    still mapping shared memory); reap: collects the group's leader, our child, whose zombie
    would keep the group alive."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            return
        reap()
        time.sleep(0.05)
