"""How far the adamw kernel's numerics are from optax's arithmetic under XLA, in ulp.

The CPU kernel multiplies by per-call reciprocals (1/bc1, 1/bc2, clip/norm) where the reference
divides by a scalar, which is what XLA's CPU code does for `x / scalar`; JGSESS_NUMERICS=exact
divides (IEEE division, as numpy does). Over 10^7 random elements (parameters, gradients and
moments over several orders of magnitude, bias corrections of early and late steps) this
compares the kernel's first result, in both modes, with the reference evaluated op by op by
XLA (one rounding per operation), and prints the largest and mean difference in units in the
last place; for comparison also that of XLA's fused code for the reference (which contracts
multiply-adds).

    python benchmarks/optimizer_ulp.py [--elements 10000000]
"""

from __future__ import annotations

import argparse
import functools
import os

import jax
import jax.numpy as jnp
import numpy as np

from jgsess.kernels import adamw


def operands(n: int, step: int, seed: int):
    keys = jax.random.split(jax.random.PRNGKey(seed), 4)
    b1, b2 = 0.9, 0.999
    scalars = [b1, 1 - b1, b2, 1 - b2, 1 - b1**step, 1 - b2**step, 1e-8, 0.0, 1e-2, 1e-3]
    scalars += [0.0, 3.7, 1.0]  # keep (0: clip), global norm, clip
    magnitude = lambda k: 10.0 ** jax.random.uniform(k, (n,), minval=-6, maxval=1)  # noqa: E731
    p = jax.random.normal(keys[0], (n,)) * magnitude(keys[1])
    g = jax.random.normal(keys[1], (n,)) * magnitude(keys[2])
    m = jax.random.normal(keys[2], (n,)) * magnitude(keys[3])
    v = jax.random.uniform(keys[3], (n,)) * magnitude(keys[0]) ** 2
    return [jnp.float32(s) for s in scalars] + [p, g, m, v]


def ulps(a, b) -> np.ndarray:
    """|a - b| in ulp of b, elementwise (f32, by the distance of their integer bit patterns)."""
    ia = np.asarray(a, np.float32).view(np.int32).astype(np.int64)
    ib = np.asarray(b, np.float32).view(np.int32).astype(np.int64)
    ia = np.where(ia < 0, -(ia & 0x7FFFFFFF), ia)  # monotone integer order
    ib = np.where(ib < 0, -(ib & 0x7FFFFFFF), ib)
    return np.abs(ia - ib)


def run(flags: int, ops, exact: bool):
    os.environ["JGSESS_NUMERICS"] = "exact" if exact else ""
    bind = functools.partial(adamw.SPEC.primitive.bind, flags=flags, aliases=(), workspace=None)
    # a fresh function each time: the numerics are read when the call is lowered
    return jax.jit(lambda *o: bind(*o))(*ops)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--elements", type=int, default=10_000_000)
    args = parser.parse_args()
    forms = {
        "adamw (p')": adamw.OPTAX_ADAMW,
        "adamw update (-lr*u)": adamw.OPTAX_ADAMW | adamw.Flag.UPDATE,
        "adamw clipped update": adamw.OPTAX_ADAMW | adamw.Flag.UPDATE | adamw.Flag.CLIP,
    }
    for step in (1, 10, 1000):
        ops = operands(args.elements, step, seed=step)
        for name, flags in forms.items():
            # the reference op by op (eager: one rounding per operation, no contraction); XLA's
            # fused code for it contracts some multiply-adds (FMA), so it is shown separately
            with jax.disable_jit():
                want = adamw.reference(*ops, flags=flags)
            fused = jax.jit(functools.partial(adamw.reference, flags=flags))(*ops)
            fast = run(flags, ops, exact=False)
            exact = run(flags, ops, exact=True)
            d = ulps(fast[0], want[0])
            x = ulps(fused[0], want[0])
            same = all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(fast, want))
            e = ulps(exact[0], want[0])
            moments = all(
                np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(fast[1:], want[1:])
            )
            print(
                f"step {step:4d} {name:22s}: default max {d.max()} ulp ({(d > 0).mean():.2%} "
                f"differ, all results bit for bit: {same}, moments: {moments}); "
                f"exact (IEEE division) max {e.max()} ulp, mean {e.mean():.4f}, "
                f"{(e > 0).mean():.2%} differ; XLA's fused code: max {x.max()} ulp",
                flush=True,
            )


if __name__ == "__main__":
    main()
