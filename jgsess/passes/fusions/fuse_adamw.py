"""fuse-adamw: the per-parameter Adam / AdamW update becomes one `adamw` node
[AdamWeightDecayFusion, AdamFusion].

optax's adamw (bias correction, eps_root, decoupled weight decay), after canonicalize:

    m2 = add (mul 0.1 g) (mul 0.9 m)          v2 = add (mul 0.001 (square g)) (mul 0.999 v)
    u  = div (div m2 bc1) (add (sqrt (add (div v2 bc2) 0.0)) 1e-8)
    p2 = sub p (mul 0.001 (add u (mul 1e-4 p)))
  ->
    p2 m2 v2 = jgsess.adamw[flags=7] 0.9 0.1 0.999 0.001 bc1 bc2 1e-8 0.0 1e-4 0.001 p g m v

Every combination of bias correction, eps_root and weight decay is a form: optax's adamw and
adam, MindSpore's AdamWeightDecay and Adam (no bias correction, no eps_root) among them. Each
also as optax's update alone (`neg (mul lr u)`, result 0 the update) and as the scaled step
(`mul lr u`, read only by a multiplication by a scalar: optax.MultiSteps). Forms with more parts are
tried first, as MindSpore runs AdamWeightDecayFusion before AdamFusion. An update written in
bf16/f16 becomes the kernel's narrow form (optimizer.py); at such a root the forms are also tried
without `mul b2 v`, for a b2 the narrow dtype rounds to 1.0 (optax's 0.999 in bf16). Also at a
bf16 root, the whole steps of bf16 parameters with an f32 first moment and a bf16 second
moment (optax.adamw(..., mu_dtype=jnp.float32)) become the kernel's mixed form (adamw.Flag.MIXED).
"""

from __future__ import annotations

from ...kernels import adamw
from ...kernels.adamw import MIXED_NARROW, Flag
from .engine import pattern_fusion
from .optimizer import update_rules

TENSORS = ("p", "g", "m", "v")


def _used(flags: int) -> tuple:
    used: tuple[str, ...] = ("b1", "omb1", "b2", "omb2")
    used += ("bc1", "bc2") if flags & Flag.BIAS_CORRECTION else ()
    used += ("eps",) + (("eps_root",) if flags & Flag.EPS_ROOT else ())
    used += ("wd",) if flags & Flag.WEIGHT_DECAY else ()
    return used + ("lr",)


def _rules(absent: tuple = (), mixed: bool = False):
    unused = {
        "b2": 1.0,
        "bc1": 1.0,
        "bc2": 1.0,
        "eps_root": 0.0,
        "wd": 0.0,
        "keep": 1.0,
        "norm": 1.0,
        "clip": 1.0,
    }
    return update_rules(
        adamw.SPEC,
        adamw.mixed_update if mixed else adamw.update,
        TENSORS,
        adamw.SCALARS,
        _used,
        unused,
        Flag.UPDATE,
        Flag.NARROW,
        absent,
        mixed=(Flag.MIXED, MIXED_NARROW) if mixed else None,
    )


def _narrow_rules():
    return [
        *_rules(absent=("b2",)),
        *_rules(mixed=True),
        *_rules(absent=("b2",), mixed=True),
    ]


# every form divides by sqrt(v) + eps (optax's scale_by_adam, MindSpore's AdamWeightDecay)
NEEDS = frozenset({"sqrt"})
# in bf16, b2 = 0.999 (optax's default) rounds to 1.0 and canonicalize drops `mul 1.0 v`
PASS = pattern_fusion(
    "fuse-adamw", _rules, doc=__doc__, needs=NEEDS, narrow_rules=_narrow_rules
).as_pass()
