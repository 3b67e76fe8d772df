"""jgsess_async_hint: the no-op CPU custom call a kernel call writing 1,000 elements or more
carries, so that XLA's CPU runtime dispatches its program asynchronously (kernels/spec.py;
what users see of it: tests/test_jit_parity.py)."""

import jax
import jax.numpy as jnp
import pytest

from jgsess.kernels import cast_all, spec
from tests.helpers import rand
from tests.kernels.bad_calls import F32, I32, array, call
from tests.kernels.common import kernel_fn

pytestmark = pytest.mark.skipif(jax.default_backend() != "cpu", reason="a CPU-only hint")


def compiled(sizes):
    fn = kernel_fn(cast_all.SPEC, dtypes=("bfloat16",) * len(sizes))
    return fn.lower(*[rand((n,), i) for i, n in enumerate(sizes)]).compile()


@pytest.mark.parametrize(
    "sizes, hinted", [((999,), False), ((1000,), True), ((400, 600), True), ((7, 5), False)]
)
def test_a_kernel_call_writing_1000_elements_carries_the_hint(sizes, hinted):
    program = compiled(sizes)
    text = program.as_text()
    assert 'custom_call_target="jgsess_cast_all"' in text
    assert (f'custom_call_target="{spec.ASYNC_HINT_TARGET}"' in text) == hinted
    # kept by XLA, on work its cost analysis counts: estimated cheap exactly where not hinted
    assert ("custom_call_has_side_effect=true" in text) == hinted
    assert (program.cost_analysis()["flops"] < spec.CHEAP_FLOPS) != hinted


def malformed_calls():
    """Direct calls of jgsess_async_hint (tests/kernels/test_operand_checks.py)."""
    target = spec.ASYNC_HINT_TARGET
    good = {
        "an f32 operand": call(target, [jnp.ones((spec.HINT_FLOPS,), F32)], []),
        "an integer operand": call(target, [array((3,), I32)], []),
    }
    bad = {
        "no operands": call(target, [], []),
        "two operands": call(target, [array((3,), F32), array((3,), F32)], []),
    }
    return {target: (good, bad)}
