"""JAX's jit tests (jax 0.10.2's api_test.py and jax_jit_test.py) that are expected to fail,
by test id (file::class::test), with the reason. tests/peer/swap.py marks them xfail."""

# failing under plain jax.jit on this project's machines (none so far: `make test-peer
# PEER_JIT=jax` runs the baseline)
FAIL_UNDER_JAX: dict[str, str] = {}

DIFFER_UNDER_JGSESS: dict[str, str] = {
    "api_test.py::TracebackTest::test_jit_traceback": (
        "the stack inside f holds one more frame: jgsess's step in jax.jit's tracing "
        "(_compat.rewrite_jit_traces), which traces f through jax's own function and "
        "rewrites the result: 7 frames against 6"
    ),
}
