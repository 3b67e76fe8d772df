"""Offsets for buffers in one arena: best fit by size, several orders, the smallest kept
[MindSpore's BestFitMemReuse and SOMAS].

Each buffer, in the order tried, goes to the gap that fits it most tightly among the buffers
already placed whose lifetimes overlap its own (or on top of them). Contiguous groups are placed
as one block. Orders tried: largest first; longest-lived first; earliest first.
"""

from __future__ import annotations

import numpy as np

from .lifetimes import Buffer

ORDERS = {
    "size": lambda b: (-b.size, b.start),
    "lifetime": lambda b: (-(b.end - b.start), -b.size),
    "start": lambda b: (b.start, -b.size),
}


def _place(order: list[Buffer]) -> tuple[dict[int, int], int]:
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


def allocate(bufs: list[Buffer]) -> tuple[dict[int, int], int, str]:
    """(id(buffer) -> offset, arena bytes, the order that won)."""
    best = None
    for name, key in ORDERS.items():
        placed, peak = _place(sorted(bufs, key=key))
        if best is None or peak < best[1]:
            best = (placed, peak, name)
    return best
