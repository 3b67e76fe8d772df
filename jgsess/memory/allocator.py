"""Offsets for buffers in one arena, best fit [MindSpore's BestFitMemReuse and SOMAS; XLA's
heap simulator]. Two methods; the smaller arena is kept:

  heap      a heap simulated over the execution order: step by step, buffers whose last reader
            has run are freed (a freed gap merges with its free neighbours), then the buffers
            born at this step are placed, largest first, each in the smallest free gap that
            holds it; with none, on top of the arena. O(n log n): a heap of live buffers, gaps
            sorted by size, merged through two dicts (20,000 buffers: well under a second).
  offline   for programs of up to OFFLINE_LIMIT buffers: each buffer, in a given order (largest
            first; longest-lived first; earliest first), goes to the tightest gap among the
            buffers already placed whose lifetimes overlap its own. O(n^2), and often a few
            percent tighter, so it is kept where it is cheap.

Contiguous groups are placed as one block by the caller.
"""

from __future__ import annotations

import bisect
import heapq

import numpy as np

from .lifetimes import Buffer

OFFLINE_LIMIT = 2000
ORDERS = {
    "size": lambda b: (-b.size, b.start),
    "lifetime": lambda b: (-(b.end - b.start), -b.size),
    "start": lambda b: (b.start, -b.size),
}


class _Gaps:
    """Free gaps of the arena, by size (best fit) and by both ends (merging)."""

    def __init__(self) -> None:
        self.by_size: list[tuple[int, int]] = []  # (size, offset), sorted
        self.start: dict[int, int] = {}  # offset -> size
        self.end: dict[int, int] = {}  # offset + size -> offset

    def add(self, offset: int, size: int) -> None:
        if offset in self.end:  # merge with the gap just below
            below = self.end[offset]
            size += self.start[below]
            self.remove(below)
            offset = below
        if offset + size in self.start:  # and with the one just above
            above = offset + size
            size += self.start[above]
            self.remove(above)
        bisect.insort(self.by_size, (size, offset))
        self.start[offset] = size
        self.end[offset + size] = offset

    def remove(self, offset: int) -> None:
        size = self.start.pop(offset)
        del self.end[offset + size]
        del self.by_size[bisect.bisect_left(self.by_size, (size, offset))]

    def best_fit(self, size: int) -> int | None:
        """Offset of the smallest gap of at least `size` bytes (taken from the free list)."""
        i = bisect.bisect_left(self.by_size, (size, -1))
        if i == len(self.by_size):
            return None
        gap, offset = self.by_size.pop(i)
        del self.start[offset]
        if gap == size:
            del self.end[offset + size]
            return offset
        # the rest stays free; its neighbours are in use (free gaps are always merged)
        rest = offset + size
        bisect.insort(self.by_size, (gap - size, rest))
        self.start[rest] = gap - size
        self.end[offset + gap] = rest
        return offset


def allocate(bufs: list[Buffer]) -> tuple[dict[int, int], int, str]:
    """(id(buffer) -> offset, arena bytes, the method that won): no two buffers whose
    lifetimes overlap share a byte."""
    best = (*_heap(bufs), "heap")
    if len(bufs) <= OFFLINE_LIMIT:
        for name, key in ORDERS.items():
            placed, peak = _offline(sorted(bufs, key=key))
            if peak < best[1]:
                best = (placed, peak, f"offline, {name} order")
    return best


def _offline(order: list[Buffer]) -> tuple[dict[int, int], int]:
    n = len(order)
    offset, size = np.zeros(n, np.int64), np.zeros(n, np.int64)
    start, end = np.zeros(n, np.int64), np.zeros(n, np.int64)
    placed: dict[int, int] = {}
    peak = 0
    for i, b in enumerate(order):
        live = (end[:i] >= b.start) & (start[:i] <= b.end)
        lo = offset[:i][live]
        hi = lo + size[:i][live]
        best, best_waste, cursor = None, None, 0
        for j in np.argsort(lo, kind="stable"):
            gap = lo[j] - cursor
            if gap >= b.size and (best_waste is None or gap - b.size < best_waste):
                best, best_waste = cursor, gap - b.size
            cursor = max(cursor, hi[j])
        at = cursor if best is None else best
        offset[i], size[i], start[i], end[i] = at, b.size, b.start, b.end
        placed[id(b)] = int(at)
        peak = max(peak, int(at) + b.size)
    return placed, peak


def _heap(bufs: list[Buffer]) -> tuple[dict[int, int], int]:
    order = sorted((b.start, -b.size, b.end, id(b)) for b in bufs)
    gaps = _Gaps()
    live: list[tuple[int, int, int, int]] = []  # a heap of (end, id, offset, size)
    placed: dict[int, int] = {}
    top = 0
    for start, minus_size, end, key in order:
        size = -minus_size
        while live and live[0][0] < start:
            _, _, offset, freed = heapq.heappop(live)
            gaps.add(offset, freed)
        at = gaps.best_fit(size)
        if at is None:
            at = top
            if top in gaps.end:  # a free gap at the top: start there, grow the arena less
                at = gaps.end[top]
                gaps.remove(at)
            top = at + size
        placed[key] = at
        heapq.heappush(live, (end, key, at, size))
    return placed, top
