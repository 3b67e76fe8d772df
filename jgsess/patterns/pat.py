"""The pattern language: a small DAG of what to look for, with named captures.

    Pat("add", [Pat("mul", [Scalar("b1"), Var("m")]), Pat("mul", [Scalar("omb1"), Var("g")])])

matches `add (mul 0.9 m) (mul 0.1 g)` and also `add (mul g 0.1) (mul m 0.9)`: `add`, `mul`,
`max` and `min` match their operands in either order. A name used twice must bind the same
value; a pattern object used twice must match the same value (patterns are DAGs, not trees).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

COMMUTATIVE = frozenset({"add", "mul", "max", "min", "add_any", "and", "or", "eq", "ne"})


class Pattern:
    """Base of all pattern nodes."""

    name: str | None = None


class Var(Pattern):
    """Any value, optionally restricted by `pred(value)`; binds `name`."""

    def __init__(self, name: str | None, pred: Callable | None = None):
        self.name = name
        self.pred = pred

    def accepts(self, value) -> bool:
        return self.pred is None or self.pred(value)

    def __repr__(self) -> str:
        return str(self.name)


class Scalar(Var):
    """A rank-0 value: a literal or a traced hyper-parameter."""

    def accepts(self, value) -> bool:
        return value.ndim == 0 and super().accepts(value)


class Lit(Pattern):
    """A rank-0 constant equal to `value`."""

    def __init__(self, value: float, name: str | None = None):
        self.value = value
        self.name = name

    def accepts(self, value) -> bool:
        number = value.scalar_value()
        # a complex constant is never a real literal: (1+0j) * x is not x when x holds an inf
        if number is None or isinstance(number, complex) or number != self.value:
            return False
        # 0.0 and -0.0 compare equal but are different literals
        return math.copysign(1.0, number) == math.copysign(1.0, self.value)

    def __repr__(self) -> str:
        return repr(self.value)


class Pat(Pattern):
    """The value output `index` of a node whose op is one of `ops`, with operands `srcs`.

    `params` maps a param name to the required value or to a predicate on it.
    """

    def __init__(
        self,
        ops: str | Iterable[str],
        srcs: Iterable[Pattern] = (),
        *,
        params: dict | None = None,
        name: str | None = None,
        index: int = 0,
    ):
        self.ops = frozenset([ops] if isinstance(ops, str) else ops)
        self.srcs = tuple(srcs)
        self.params = dict(params or {})
        self.name = name
        self.index = index
        self.commutative = len(self.srcs) == 2 and self.ops <= COMMUTATIVE

    def params_match(self, params: dict) -> bool:
        for key, want in self.params.items():
            got = params.get(key)
            if callable(want) and not isinstance(want, type):
                if not want(got):
                    return False
            elif got != want:
                return False
        return True

    def __repr__(self) -> str:
        ops = "|".join(sorted(self.ops))
        return f"{ops}({', '.join(map(repr, self.srcs))})"
