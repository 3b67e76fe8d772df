"""`jgsess.jit(f).report(*args)`: what the pipeline did, as tables a person can read."""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .memory.plan import MemoryPlan
from .passes.fusions.fuse_registered import NAME as REGISTERED
from .session import Session


def table(headers: Sequence[str], rows: Iterable[Sequence]) -> str:
    """A plain-text table with aligned columns."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _mb(nbytes: int) -> str:
    return f"{nbytes / 2**20:.2f} MB"


_XLA_FIELDS = ("argument", "output", "alias", "temp")


def xla_memory(compiled) -> dict[str, int] | None:
    """XLA's own accounting of a compiled program (None where the backend gives none)."""
    analysis = compiled.memory_analysis()
    if analysis is None:
        return None
    return {f: int(getattr(analysis, f"{f}_size_in_bytes")) for f in _XLA_FIELDS}


@dataclass
class MemoryReport:
    """The planner's view of one program, beside XLA's for jgsess's and jax.jit's programs."""

    plan: MemoryPlan
    jgsess: dict | None
    jax: dict | None
    # (fused kernel, bytes the program kept for its backward, bytes the kernels keep)
    residuals: list = field(default_factory=list)

    def __str__(self) -> str:
        p = self.plan
        out = [
            f"memory plan: peak {_mb(p.peak)}, lower bound {_mb(p.lower_bound)} "
            f"({p.peak / max(p.lower_bound, 1):.3f}x), naive sum {_mb(p.naive)}, "
            f"{len(p.buffers)} buffers over {p.steps} steps (order: {p.order})",
            "",
            table(
                ["largest buffers", "kind", "size", "steps", "offset"],
                [[b.name, b.kind, _mb(b.size), f"{b.start}-{b.end}", at] for b, at in p.largest(5)],
            ),
        ]
        if self.jgsess and self.jax:
            rows = [[f"{f} bytes", _mb(self.jgsess[f]), _mb(self.jax[f])] for f in _XLA_FIELDS]
            rows.append(
                [
                    "temp + output",
                    _mb(self.jgsess["temp"] + self.jgsess["output"]),
                    _mb(self.jax["temp"] + self.jax["output"]),
                ]
            )
            out += ["", table(["XLA memory_analysis", "jgsess.jit", "jax.jit"], rows)]
        if self.residuals:
            rows = [[kind, _mb(kept), _mb(fused)] for kind, kept, fused in self.residuals]
            headers = ["residuals for the backward", "jax.jit's code", "fused (mask bits)"]
            out += ["", table(headers, rows)]
        return "\n".join(out)


@dataclass
class Report:
    """The record of one compilation (one input signature) of a `jgsess.jit` function."""

    session: Session
    jitted: Any = field(repr=False, default=None)
    plain: Any = field(repr=False, default=None)  # jax.jit of the same function
    args: tuple = field(repr=False, default=())
    kwargs: dict = field(repr=False, default_factory=dict)

    @property
    def passes(self) -> list:
        return self.session.passes

    @property
    def fusions(self) -> Counter:
        """Fused node kind -> how many the pipeline created."""
        return Counter(kind for _, kind in self.session.record.fusions)

    @property
    def kernels(self) -> list:
        return self.session.record.kernels

    @property
    def registered(self) -> dict[str, str]:
        """The users' kernel registrations in effect when the program was compiled
        (jgsess.register_replacement), name -> what became of them: "fused N" (how many nodes;
        `kernels` says what runs each) or "registered, no match"."""
        fused = Counter(kind for name, kind in self.session.record.fusions if name == REGISTERED)
        return {
            name: f"fused {fused[name]} -> {target}" if fused[name] else "registered, no match"
            for name, target in self.session.record.registered.items()
        }

    @property
    def unmeasured(self) -> list[tuple[str, str]]:
        """(kernel, "kernel" or "xla") per node the cost model decided because this
        compilation's measuring budget was spent; a later compilation measures it."""
        return list(self.session.record.unmeasured)

    @property
    def selection(self) -> list:
        """The decisions `jgsess.autotune` measured (or found cached), one per key."""
        return list({m.key: m for m in self.session.record.autotune}.values())

    @property
    def buckets(self) -> list:
        """bucket-all-reduce's groups of all-reduces: buckets, timings, decisions."""
        return self.session.record.buckets

    @property
    def fallback(self) -> str | None:
        return self.session.fallback

    @functools.cached_property
    def memory(self) -> MemoryReport:
        """The memory plan and XLA's memory analysis of jgsess's and jax.jit's programs (this
        compiles both)."""
        fused = xla_memory(self.jitted.lower(*self.args, **self.kwargs).compile())
        plain = xla_memory(self.plain.lower(*self.args, **self.kwargs).compile())
        residuals = self.session.record.residuals
        plan = self.session.record.memory_plan
        if plan is None:
            raise ValueError("this compilation computed no memory plan")
        return MemoryReport(plan, fused, plain, residuals)

    def donation_hint(self) -> str | None:
        undonated = {i for group in self.session.record.undonated for i in group}
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
        sections = (self._pipeline, self._decisions, self._buckets_table, self._footer)
        for section in sections:
            out += section()
        return "\n".join(out)

    def _pipeline(self) -> list[str]:
        """The passes with their times and rewrites, the pipeline's time, the fusions."""
        s = self.session
        rows = [
            [r.name, "off" if r.skipped else f"{r.seconds * 1e3:.2f} ms", r.rewrites]
            for r in s.passes
        ]
        times = ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in s.seconds.items())
        out = ["", table(["pass", "time", "rewrites"], rows)]
        out += ["", f"pipeline time: {sum(s.seconds.values()) * 1e3:.1f} ms ({times})"]
        if self.fusions:
            out += ["", table(["fusion", "count"], sorted(self.fusions.items()))]
        return out

    def _decisions(self) -> list[str]:
        """What runs each fused node and why; the measurements; the cost model's choices."""
        out = []
        if self.kernels:
            rows = [[k.kernel, k.impl, k.operands, _mb(k.nbytes), k.reason] for k in self.kernels]
            out += ["", table(["fused node", "runs as", "operands", "operand bytes", "why"], rows)]
        if self.selection:
            rows = [
                [m.kernel, "kernel" if m.kernel_wins else "xla"]
                + [f"{m.kernel_s * 1e3:.3f} ms", f"{m.xla_s * 1e3:.3f} ms"]
                + ["cached" if m.cached else f"measured ({m.seconds:.1f} s)"]
                for m in self.selection
            ]
            out += ["", table(["measured selection", "faster", "kernel", "xla", "source"], rows)]
        if self.unmeasured:
            rows = [[k, impl, n] for (k, impl), n in sorted(Counter(self.unmeasured).items())]
            out += ["", table(["not measured yet", "cost model chose", "nodes"], rows)]
            out += ["(a later compilation measures them; JGSESS_AUTOTUNE=cached never measures)"]
        return out

    def _buckets_table(self) -> list[str]:
        if not self.buckets:
            return []

        def ms(value: float | None) -> str:
            return "-" if value is None else f"{value:.3f} ms"

        rows = [
            [",".join(b.axes), b.dtype, f"{b.operands} in {b.calls}"]
            + [" + ".join(_mb(n) for n in b.buckets), ms(b.written_ms), ms(b.bucketed_ms)]
            + ["bucketed" if b.taken else "as written", b.reason]
            for b in self.buckets
        ]
        headers = ["all-reduce axes", "dtype", "operands", "buckets", "as written", "bucketed"]
        return ["", table(headers + ["runs", "why"], rows)]

    def _footer(self) -> list[str]:
        """The memory plan's summary, the donation hint, and the fusions not taken with why."""
        record, out = self.session.record, []
        plan = record.memory_plan
        if plan is not None:
            out += [
                "",
                f"memory plan: peak {_mb(plan.peak)}, lower bound {_mb(plan.lower_bound)}, "
                f"naive sum {_mb(plan.naive)} (report.memory compares with XLA)",
            ]
        hint = self.donation_hint()
        if hint:
            out += ["", "hint: " + hint]
        out += [
            f"{n}: {what}" for n, what in self.registered.items() if not what.startswith("fused")
        ]
        kinds = Counter(kind for _, kind, _ in record.declined)
        for kind, n in sorted(kinds.items()):
            reason = next(r for _, k, r in record.declined if k == kind)
            out += [f"not taken: {n} {kind} fusion(s): {reason}"]
        return out
