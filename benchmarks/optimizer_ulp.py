"""How far the adamw kernel's fast numerics are from optax's arithmetic, in ulp.

The CPU kernel multiplies by per-call reciprocals (1/bc1, 1/bc2, clip/norm) where the reference
divides. Over 10^7 random elements (parameters, gradients and moments over several orders of
magnitude, bias corrections of early and late steps) this compares each result of the kernel
with the reference traced by XLA, and with JGSESS_NUMERICS=exact, which must match it bit for
bit. Prints the largest and the mean difference in units in the last place.

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
        "adamw update (-lr*u)": adamw.OPTAX_ADAMW | adamw.UPDATE,
        "adamw clipped update": adamw.OPTAX_ADAMW | adamw.UPDATE | adamw.CLIP,
    }
    for step in (1, 10, 1000):
        ops = operands(args.elements, step, seed=step)
        for name, flags in forms.items():
            want = jax.jit(functools.partial(adamw.reference, flags=flags))(*ops)
            fast = run(flags, ops, exact=False)
            exact = run(flags, ops, exact=True)
            d = ulps(fast[0], want[0])
            same = all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(exact, want))
            state = all(
                np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(fast[1:], want[1:])
            )
            print(
                f"step {step:4d} {name:22s}: fast max {d.max()} ulp, mean {d.mean():.4f} ulp, "
                f"{(d > 0).mean():.2%} differ; moments equal: {state}; exact bit for bit: {same}",
                flush=True,
            )


if __name__ == "__main__":
    main()
