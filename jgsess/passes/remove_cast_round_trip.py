"""remove-cast-round-trip: drop `convert_element_type` round trips that are exact
[the cleanup side of CastAllFusion].

    b:f64[8] = convert_element_type[new_dtype=float64] a:f32[8]
    c:f32[8] = convert_element_type[new_dtype=float32] b          ->   c is a

Only widening-then-narrowing trips whose middle type holds every value of the outer type
exactly (f32->f64->f32, bf16->f32->bf16, i8->f16->i8); never f32->f16->f32, which rounds.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from ..ir.graph import Graph
from ..patterns import Pat, Var, rewrite
from .manager import Context, Pass


def _float_holds(inner, outer) -> bool:
    fi, fo = ml_dtypes.finfo(inner), ml_dtypes.finfo(outer)
    return fo.nmant >= fi.nmant and fo.maxexp >= fi.maxexp and fo.minexp <= fi.minexp


def _kind(dtype: np.dtype) -> str:
    # ml_dtypes' floats (bfloat16, float8_*) report kind "V"
    if dtype.kind == "V":
        try:
            ml_dtypes.finfo(dtype)
        except ValueError:
            return "V"
        return "f"
    return dtype.kind


def holds_exactly(inner, outer) -> bool:
    """Whether dtype `outer` represents every value of dtype `inner` exactly."""
    try:
        inner, outer = np.dtype(inner), np.dtype(outer)
    except TypeError:  # extended dtypes (PRNG keys) are never converted
        return False
    if inner == outer:
        return True
    ki, ko = _kind(inner), _kind(outer)
    if ki == "b":
        return ko in "biufc"
    if ki in "iu" and ko in "iu":
        a, b = np.iinfo(inner), np.iinfo(outer)
        return b.min <= a.min and a.max <= b.max
    if ki in "iu" and ko == "f":
        return ml_dtypes.finfo(outer).nmant + 1 >= np.iinfo(inner).bits - (ki == "i")
    if ki == "f" and ko in "fc":
        return _float_holds(inner, outer if ko == "f" else np.empty((), outer).real.dtype)
    if ki == "c" and ko == "c":
        return _float_holds(np.empty((), inner).real.dtype, np.empty((), outer).real.dtype)
    return False


def _round_trip(graph: Graph, m):
    x = m["x"]
    middle = m.value_of(INNER)
    if x.aval == m.root.aval and holds_exactly(x.dtype, middle.dtype):
        return x
    return None


INNER = Pat("convert_element_type", [Var("x")])
RULES = [(Pat("convert_element_type", [INNER]), _round_trip)]


def run(graph: Graph, ctx: Context | None) -> int:
    return rewrite(graph, RULES)


PASS = Pass("remove-cast-round-trip", run, doc=__doc__)
