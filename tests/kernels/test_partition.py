"""The sharding tie of a multi-tensor kernel's gradients (partition._tied) on every jax."""

import jax.numpy as jnp

from jgsess import _compat
from jgsess.kernels import adamw, partition
from tests.kernels.test_adamw import operands


def test_gradients_of_matrices_are_tied_where_jax_has_shard_alike(monkeypatch):
    ops = operands([(6, 4), (5,)])
    ties = []

    def tie(lead, other):
        ties.append((lead.shape, other.shape))
        return lead, other

    monkeypatch.setattr(_compat, "shard_alike", tie)
    partition._tied(adamw.SPEC, list(ops), arena=False)
    assert ties == [((6, 4), (6, 4))]  # the matrix's parameter and gradient; not the vector


def test_without_shard_alike_nothing_is_tied(monkeypatch):
    """jax 0.11 removed jax.experimental.shard_alike: the operands pass as they are."""
    monkeypatch.setattr(_compat, "shard_alike", None)
    ops = [jnp.asarray(x) for x in operands([(6, 4), (5,)])]
    tied = partition._tied(adamw.SPEC, list(ops), arena=False)
    assert all(a is b for a, b in zip(tied, ops, strict=True))
