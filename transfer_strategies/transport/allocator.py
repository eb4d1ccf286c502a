"""Space in the staging buffer, kept by the sender (the only writer).

A free list keyed by offset: first fit, and a released region merges with its free neighbours,
so regions released in any order free their own space at once (the bump allocator this
replaces only rewound when nothing at all was in flight). `plan` says which live regions would
have to be freed for a payload to fit, which is what the sender asks the receiver for when the
buffer is full.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable

ALIGN = 256  # every region starts aligned for a view of any dtype


class StagingAllocator:
    def __init__(self, capacity: int):
        self.capacity = capacity
        self._free: dict[int, int] = {0: capacity} if capacity else {}  # offset -> size
        self._free_starts: list[int] = sorted(self._free)
        self.live: dict[int, int] = {}  # offset -> size of each region handed out
        self._live_starts: list[int] = []

    @staticmethod
    def size_for(nbytes: int) -> int:
        return -(-nbytes // ALIGN) * ALIGN

    @property
    def free_bytes(self) -> int:
        return sum(self._free.values())

    def take(self, nbytes: int) -> int | None:
        """The offset of a new region of at least nbytes, or None when no free extent holds it."""
        size = self.size_for(nbytes)
        if size > self.capacity:
            raise ValueError(f"{nbytes} bytes do not fit a {self.capacity}-byte buffer")
        for start in self._free_starts:
            extent = self._free[start]
            if extent >= size:
                del self._free[start]
                self._free_starts.remove(start)
                if extent > size:
                    self._add_free(start + size, extent - size)
                self.live[start] = size
                bisect.insort(self._live_starts, start)
                return start
        return None

    def give(self, offset: int) -> None:
        """Free the region that starts at offset, merged with the free space around it."""
        size = self.live.pop(offset)
        self._live_starts.remove(offset)
        i = bisect.bisect_left(self._free_starts, offset)
        if i < len(self._free_starts) and self._free_starts[i] == offset + size:  # the next extent
            size += self._free.pop(self._free_starts.pop(i))
        if i > 0:
            prev = self._free_starts[i - 1]
            if prev + self._free[prev] == offset:
                self._free[prev] += size
                return
        self._add_free(offset, size)

    def region_at(self, offset: int) -> int | None:
        """The start of the live region that holds byte `offset`, if one does."""
        i = bisect.bisect_right(self._live_starts, offset) - 1
        if i >= 0:
            start = self._live_starts[i]
            if offset < start + self.live[start]:
                return start
        return None

    def plan(self, nbytes: int, reclaimable: Callable[[int], bool]) -> list[int] | None:
        """The live regions to free so that nbytes fit in one piece, choosing the window with the
        fewest live bytes; None when regions that are not reclaimable break up every window."""
        need = self.size_for(nbytes)
        segments = sorted([(o, s, False) for o, s in self._free.items()] + [(o, s, True) for o, s in self.live.items()])
        best, first, total, cost = None, 0, 0, 0
        for last, (offset, size, live) in enumerate(segments):
            if live and not reclaimable(offset):
                first, total, cost = last + 1, 0, 0
                continue
            total += size
            cost += size if live else 0
            while total - segments[first][1] >= need:  # the smallest window that ends here
                total -= segments[first][1]
                cost -= segments[first][1] if segments[first][2] else 0
                first += 1
            if total >= need and (best is None or cost < best[0]):
                best = (cost, first, last)
        if best is None:
            return None
        return [offset for offset, _, live in segments[best[1]:best[2] + 1] if live]

    def _add_free(self, offset: int, size: int) -> None:
        self._free[offset] = size
        bisect.insort(self._free_starts, offset)
