"""fuse-momentum: the per-parameter SGD-with-momentum update becomes one `momentum` node
[ApplyMomentumWeightDecayScaleFusion, ApplyMomentumScaleFusion, ApplyMomentumWeightDecayFusion].

optax.sgd(lr, momentum=0.9), after canonicalize:

    acc2 = add g (mul 0.9 acc)
    p2   = sub p (mul 0.1 acc2)         ->   p2 acc2 = jgsess.momentum[flags=0] 0.1 0.9 0 1 p g acc

and with Nesterov's look-ahead (`p - lr*(g + mu*acc2)`), with weight decay chained in front
(`g + wd*p`, MindSpore's `AddN(Mul(var, wd), g)`) and with a loss scale (`g*scale`); each also as
optax's update alone (`neg (mul lr d)`), and as the scaled step `mul lr d` that optax.MultiSteps
multiplies by a scalar. Forms with more parts are tried first.
"""

from __future__ import annotations

from ...kernels import momentum
from ...kernels.momentum import Flag
from .engine import pattern_fusion
from .optimizer import update_rules

TENSORS = ("p", "g", "acc")


def _used(flags: int) -> tuple:
    used: tuple[str, ...] = ("lr", "mu")
    used += ("wd",) if flags & Flag.WEIGHT_DECAY else ()
    return used + (("scale",) if flags & Flag.SCALE else ())


def _rules():
    unused = {"wd": 0.0, "scale": 1.0}
    return update_rules(
        momentum.SPEC,
        momentum.update,
        TENSORS,
        momentum.SCALARS,
        _used,
        unused,
        Flag.UPDATE,
        Flag.NARROW,
    )


PASS = pattern_fusion("fuse-momentum", _rules, doc=__doc__).as_pass()
