"""Patterns: a small declarative DSL and its matcher (patterns by example, traced from a
reference function, are in passes/fusions/by_example.py)."""

from .matcher import Match, match, pattern_nodes, rewrite, same_value
from .pat import Lit, Pat, Pattern, Scalar, Var

__all__ = [
    "Lit",
    "Match",
    "Pat",
    "Pattern",
    "Scalar",
    "Var",
    "match",
    "pattern_nodes",
    "rewrite",
    "same_value",
]
