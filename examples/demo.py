"""`make demo`: train a small flax MLP with jgsess.jit and compare its step time with jax.jit.

The train step is plain flax + optax code; jgsess.jit fuses the AdamW update of every parameter
into its kernel. The demo trains on synthetic data (a random teacher network labels Gaussian
inputs), prints progress, the pipeline's report, and the step-time ratio of jgsess.jit to
jax.jit measured side by side in this run.
"""

from __future__ import annotations

import argparse
import statistics
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

import jgsess


class MLP(nn.Module):
    widths: tuple[int, ...] = (512, 512, 256)
    classes: int = 10

    @nn.compact
    def __call__(self, x):
        for width in self.widths:
            x = nn.relu(nn.Dense(width)(x))
        return nn.Dense(self.classes)(x)


def synthetic_data(key, n: int, dim: int, classes: int):
    kx, kt = jax.random.split(key)
    x = jax.random.normal(kx, (n, dim))
    teacher = jax.random.normal(kt, (dim, classes))
    return x, jnp.argmax(jnp.tanh(x @ teacher) + 0.1 * x[:, :classes], axis=1)


def make_step(model, opt):
    def step(params, opt_state, x, y):
        def loss_fn(p):
            logits = model.apply(p, x)
            loss = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
            return loss, (jnp.argmax(logits, -1) == y).mean()

        (loss, acc), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss, acc

    return step


def median_ms(fn, state, batches, reps):
    times = []
    for i in range(reps):
        x, y = batches[i % len(batches)]
        start = time.perf_counter()
        out = fn(*state, x, y)
        jax.block_until_ready(out)
        times.append(time.perf_counter() - start)
        state = out[:2]
    return statistics.median(times) * 1e3, state


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--timing-reps", type=int, default=40)
    args = parser.parse_args()

    key = jax.random.PRNGKey(0)
    x_all, y_all = synthetic_data(key, 8192, 128, 10)
    batches = [
        (x_all[i : i + args.batch], y_all[i : i + args.batch])
        for i in range(0, len(x_all), args.batch)
    ]
    model = MLP()
    opt = optax.adamw(1e-3, weight_decay=1e-4)
    params = model.init(key, x_all[:1])
    n_params = sum(p.size for p in jax.tree.leaves(params))
    print(
        f"jax {jax.__version__} on {jax.default_backend()}: flax MLP {model.widths}, "
        f"{n_params:,} parameters in {len(jax.tree.leaves(params))} arrays, AdamW"
    )

    step = make_step(model, opt)
    fused = jgsess.jit(step, donate_argnums=(0, 1))
    state = (params, opt.init(params))
    print(f"training {args.steps} steps with jgsess.jit ...")
    start = time.perf_counter()
    for i in range(args.steps):
        x, y = batches[i % len(batches)]
        *state, loss, acc = fused(*state, x, y)
        if i % 50 == 0 or i == args.steps - 1:
            print(f"  step {i:4d}  loss {float(loss):.4f}  batch accuracy {float(acc):.3f}")
    print(f"trained in {time.perf_counter() - start:.1f} s (first step includes compilation)")

    print()
    print(fused.report(*state, *batches[0]))

    print()
    print(f"timing {args.timing_reps} steps of each, interleaved, after warm-up ...")
    plain = jax.jit(step, donate_argnums=(0, 1))
    fused_state = state
    plain_state = jax.tree.map(jnp.copy, state)
    jax.block_until_ready(plain(*plain_state, *batches[0]))
    plain_state = jax.tree.map(jnp.copy, state)
    rounds = []
    per_round = max(1, args.timing_reps // 5)
    for _ in range(5):
        t_plain, plain_state = median_ms(plain, plain_state, batches, per_round)
        t_fused, fused_state = median_ms(fused, fused_state, batches, per_round)
        rounds.append((t_plain, t_fused))
    t_plain = statistics.median(r[0] for r in rounds)
    t_fused = statistics.median(r[1] for r in rounds)
    print(f"  jax.jit     {t_plain:7.3f} ms/step")
    print(f"  jgsess.jit  {t_fused:7.3f} ms/step")
    print(f"  step-time ratio jax.jit / jgsess.jit = {t_plain / t_fused:.2f}x")


if __name__ == "__main__":
    main()
