"""`jgsess.jit(f).report(*args)`: what the pipeline did, as tables a person can read."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


def table(headers: list[str], rows: list[list]) -> str:
    """A plain-text table with aligned columns."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _mb(nbytes: int) -> str:
    return f"{nbytes / 2**20:.2f} MB"


@dataclass
class Report:
    """The record of one compilation (one input signature) of a `jgsess.jit` function."""

    session: object
    jitted: object = field(repr=False, default=None)
    args: tuple = field(repr=False, default=())
    kwargs: dict = field(repr=False, default_factory=dict)

    @property
    def passes(self) -> list:
        return self.session.records

    @property
    def fusions(self) -> Counter:
        """Fused node kind -> how many the pipeline created."""
        return Counter(kind for _, kind in self.session.notes.get("fusions", []))

    @property
    def kernels(self) -> list:
        return self.session.notes.get("kernels", [])

    @property
    def fallback(self) -> str | None:
        return self.session.fallback

    def donation_hint(self) -> str | None:
        undonated = {i for group in self.session.notes.get("undonated", []) for i in group}
        if not undonated:
            return None
        return (
            f"{len(undonated)} input array(s) could be updated in place if donated "
            "(jgsess.jit(..., donate_argnums=...)); without donation XLA copies them first."
        )

    def __str__(self) -> str:
        s = self.session
        out = [f"jgsess report: {s.name} on {s.platform}"]
        if s.fallback:
            out.append(f"FELL BACK to jax.jit: {s.fallback}")
            return "\n".join(out)
        rows = [
            [r.name, "off" if r.skipped else f"{r.seconds * 1e3:.2f} ms", r.rewrites]
            for r in s.records
        ]
        out += ["", table(["pass", "time", "rewrites"], rows)]
        fusions = self.fusions
        if fusions:
            out += ["", table(["fusion", "count"], sorted(fusions.items()))]
        if self.kernels:
            rows = [[k.kernel, k.impl, k.operands, _mb(k.nbytes), k.reason] for k in self.kernels]
            out += ["", table(["fused node", "runs as", "operands", "operand bytes", "why"], rows)]
        hint = self.donation_hint()
        if hint:
            out += ["", "hint: " + hint]
        return "\n".join(out)
