"""The fused optimizers where optax runs: the user's own jax.jit step (donated or not), flax's
TrainState and nnx.Optimizer, an equinox filter_jit step, jgsess.jit nested in jax.jit, and
steps in lax.scan and lax.fori_loop under either jit.

Each context checks the compiled program's structure: one kernel call, its optimizer state
written in place (`output_to_operand_aliasing`), no copy of the state, and optax's numbers.
jgsess.optim's update inside the user's step is a nested program whose update the user's
`apply_updates` reads next: there the kernel is measured against XLA's fusion of optax's
update with it (tests/test_autotune.py), and without a measurement XLA's code is taken; these
tests take the kernel (JGSESS_KERNELS=on:adamw) to check what it compiles to.
"""

import re

import equinox as eqx
import jax
import jax.numpy as jnp
import optax
import pytest
from flax import nnx
from flax.training import train_state

import jgsess
from tests.helpers import assert_trees_close
from tests.optax_steps import tree, update_step

LR, WD = 1e-3, 1e-2
TOL = {"rtol": 2e-6, "atol": 1e-7}


@pytest.fixture
def kernel_taken(monkeypatch):
    monkeypatch.setenv("JGSESS_KERNELS", "on:adamw")


def compiled(fn, *args) -> str:
    return fn.lower(*args).compile().as_text()


def kernel_calls(text: str) -> list[str]:
    return [line for line in text.splitlines() if 'custom_call_target="jgsess_adamw"' in line]


def aliased(call: str) -> int:
    """How many of a custom call's results are written over an operand."""
    match = re.search(r"output_to_operand_aliasing=\{(.*?)\}, ", call)
    return match.group(1).count(": (") if match else 0


def state_copies(text: str, params) -> list[str]:
    """The copy instructions of arrays shaped as a parameter (the optimizer state's)."""
    shapes = {",".join(map(str, p.shape)) for p in jax.tree.leaves(params) if p.ndim}
    copies = re.findall(r"= f32\[([\d,]*)\]\{[^}]*\} copy\(", text)
    return [c for c in copies if c in shapes]


def check_structure(text: str, params, per_tensor: int) -> None:
    """One kernel call, `per_tensor` results of each parameter written in place, no state
    copied."""
    (call,) = kernel_calls(text)
    assert aliased(call) == per_tensor * len(jax.tree.leaves(params))
    assert state_copies(text, params) == []


def run_steps(step, params, state, steps: int = 3):
    for i in range(steps):
        params, state = step(params, state, tree(10 + i, 0.1))
    return params, state


def optax_reference(params, steps: int = 3):
    tx = optax.adamw(LR, weight_decay=WD)
    return run_steps(jax.jit(update_step(tx)), params, tx.init(params), steps)


@pytest.mark.parametrize("donate", [True, False], ids=["donated", "not-donated"])
def test_in_the_users_jax_jit(kernel_taken, donate):
    tx = jgsess.optim.adamw(LR, weight_decay=WD)
    params = tree(0)
    step = jax.jit(update_step(tx), donate_argnums=(0, 1) if donate else ())
    text = compiled(step, params, tx.init(params), tree(1, 0.1))
    (call,) = kernel_calls(text)
    assert aliased(call) == 2 * len(params)  # mu and nu; the update has a buffer of its own
    # the positive control: not donated, XLA copies what the kernel writes over
    assert bool(state_copies(text, params)) is not donate
    kept = jax.tree.map(jnp.copy, params)
    got = run_steps(step, params, tx.init(params))
    if not donate:  # XLA copied what the kernel writes over: the caller's arrays are intact
        assert_trees_close(params, kept, rtol=0, atol=0)
    assert_trees_close(got, optax_reference(kept), **TOL)


def test_in_the_users_jax_jit_xla_is_taken_unmeasured():
    """Without a measurement (the tests' JGSESS_AUTOTUNE=0), the update inside the user's step
    runs as XLA's code, fused with the step's apply_updates: optax's own program."""
    tx = jgsess.optim.adamw(LR, weight_decay=WD)
    params = tree(0)
    step = jax.jit(update_step(tx), donate_argnums=(0, 1))
    assert kernel_calls(compiled(step, params, tx.init(params), tree(1, 0.1))) == []
    kept = jax.tree.map(jnp.copy, params)
    assert_trees_close(run_steps(step, params, tx.init(params)), optax_reference(kept), **TOL)


def test_an_update_compiled_alone_takes_the_kernel_unmeasured():
    """An update that is the whole program (its caller gets the update, as from XLA's own
    program) is the kernel's case."""
    tx = optax.adamw(LR, weight_decay=WD)
    params = tree(0)
    update = jgsess.jit(tx.update)
    assert len(kernel_calls(compiled(update, tree(1, 0.1), tx.init(params), params))) == 1


def test_flax_train_state(kernel_taken):
    params = tree(0)
    state = train_state.TrainState.create(
        apply_fn=None,
        params=jax.tree.map(jnp.copy, params),
        tx=jgsess.optim.adamw(LR, weight_decay=WD),
    )

    @jax.jit
    def step(state, grads):
        return state.apply_gradients(grads=grads)

    donated = jax.jit(step.__wrapped__, donate_argnums=0)
    check_structure(compiled(donated, state, tree(1, 0.1)), params, 2)
    for i in range(3):
        state = donated(state, tree(10 + i, 0.1))
    want, _ = optax_reference(params)
    assert_trees_close(state.params, want, **TOL)


class Mlp(nnx.Module):
    def __init__(self, rngs):
        self.hidden = nnx.Linear(13, 7, rngs=rngs)
        self.out = nnx.Linear(7, 3, rngs=rngs)

    def __call__(self, x):
        return self.out(jax.nn.relu(self.hidden(x)))


def mlp_loss(model, x, y):
    return jnp.mean((model(x) - y) ** 2)


def test_nnx_optimizer(kernel_taken):
    x, y = jax.random.normal(jax.random.PRNGKey(1), (5, 13)), jnp.ones((5, 3))

    def make(tx):
        model = Mlp(nnx.Rngs(0))
        return nnx.split((model, nnx.Optimizer(model, tx, wrt=nnx.Param)))

    def train(graphdef, state, steps=3):
        def step(state, x, y):
            model, optimizer = nnx.merge(graphdef, state)
            grads = nnx.grad(mlp_loss)(model, x, y)
            optimizer.update(model, grads)
            return nnx.state((model, optimizer))

        jitted = jax.jit(step, donate_argnums=0)
        text = compiled(jitted, state, x, y)
        for _ in range(steps):
            state = jitted(state, x, y)
        return text, state

    graphdef, state = make(jgsess.optim.adamw(LR, weight_decay=WD))
    params = nnx.state(nnx.merge(graphdef, state)[0], nnx.Param)
    text, got = train(graphdef, state)
    check_structure(text, params, 2)
    _, want = train(*make(optax.adamw(LR, weight_decay=WD)))
    assert_trees_close(got, want, **TOL)


def test_equinox_filter_jit(kernel_taken):
    x, y = jax.random.normal(jax.random.PRNGKey(1), (5, 13)), jnp.ones((5, 3))

    def train(tx, steps=3):
        model = eqx.nn.MLP(13, 3, 7, 1, key=jax.random.PRNGKey(0))
        state = tx.init(eqx.filter(model, eqx.is_array))

        @eqx.filter_jit(donate="all-except-first")
        def step(batch, model, state):
            x, y = batch
            grads = eqx.filter_grad(lambda m: jnp.mean((jax.vmap(m)(x) - y) ** 2))(model)
            updates, state = tx.update(grads, state, eqx.filter(model, eqx.is_array))
            return eqx.apply_updates(model, updates), state

        text = step.lower((x, y), model, state).compile().compiled.as_text()
        for _ in range(steps):
            model, state = step((x, y), model, state)
        return text, model, eqx.filter(model, eqx.is_array)

    text, _, got = train(jgsess.optim.adamw(LR, weight_decay=WD))
    check_structure(text, got, 2)
    _, _, want = train(optax.adamw(LR, weight_decay=WD))
    assert_trees_close(got, want, **TOL)


@pytest.mark.parametrize("donate", [True, False], ids=["donated", "not-donated"])
def test_jgsess_jit_nested_in_jax_jit(donate):
    """The whole step under jgsess.jit, called inside the user's jax.jit: the update and
    apply_updates fuse (the parameters too are written in place), though nothing is donated
    to the nested program."""
    tx = optax.adamw(LR, weight_decay=WD)
    inner = jgsess.jit(update_step(tx))
    outer = jax.jit(lambda p, s, g: inner(p, s, g), donate_argnums=(0, 1) if donate else ())
    params = tree(0)
    text = compiled(outer, params, tx.init(params), tree(1, 0.1))
    (call,) = kernel_calls(text)
    assert aliased(call) == 3 * len(params)
    assert bool(state_copies(text, params)) is not donate  # not donated: copied first
    kept = jax.tree.map(jnp.copy, params)
    got = run_steps(outer, params, tx.init(params))
    if not donate:
        assert_trees_close(params, kept, rtol=0, atol=0)
    assert_trees_close(got, optax_reference(kept), **TOL)


def scanned(tx, loop: str, steps: int = 3):
    """`steps` update steps in one program, the gradients a loop constant."""

    def body(carry, grads):
        updates, state = tx.update(grads, carry[1], carry[0])
        return optax.apply_updates(carry[0], updates), state

    def run(params, state, grads):
        if loop == "scan":
            return jax.lax.scan(lambda c, _: (body(c, grads), None), (params, state), length=steps)[
                0
            ]
        return jax.lax.fori_loop(0, steps, lambda i, c: body(c, grads), (params, state))

    return run


@pytest.mark.parametrize("loop", ["scan", "fori_loop"])
def test_loop_under_jgsess_jit(loop):
    tx = optax.adamw(LR, weight_decay=WD)
    step = jgsess.jit(scanned(tx, loop), donate_argnums=(0, 1))
    params, grads = tree(0), tree(1, 0.1)
    check_structure(compiled(step, params, tx.init(params), grads), params, 3)
    kept = jax.tree.map(jnp.copy, params)
    got = step(params, tx.init(params), grads)
    want = jax.jit(scanned(tx, loop))(kept, tx.init(kept), grads)
    assert_trees_close(got, want, **TOL)


@pytest.mark.parametrize("loop", ["scan", "fori_loop"])
def test_loop_in_the_users_jax_jit(kernel_taken, loop):
    tx = jgsess.optim.adamw(LR, weight_decay=WD)
    step = jax.jit(scanned(tx, loop), donate_argnums=(0, 1))
    params, grads = tree(0), tree(1, 0.1)
    check_structure(compiled(step, params, tx.init(params), grads), params, 2)
    kept = jax.tree.map(jnp.copy, params)
    got = step(params, tx.init(params), grads)
    plain = optax.adamw(LR, weight_decay=WD)
    want = jax.jit(scanned(plain, loop))(kept, plain.init(kept), grads)
    assert_trees_close(got, want, **TOL)
