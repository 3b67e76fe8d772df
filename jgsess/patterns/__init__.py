"""Patterns: a small declarative DSL, pattern-by-example, and the matcher behind both."""

from .by_example import ExamplePattern, from_function
from .matcher import Match, match, pattern_nodes, rewrite
from .pat import Lit, Pat, Pattern, Scalar, Var

__all__ = [
    "ExamplePattern",
    "Lit",
    "Match",
    "Pat",
    "Pattern",
    "Scalar",
    "Var",
    "from_function",
    "match",
    "pattern_nodes",
    "rewrite",
]
