"""JAX's jit tests (jax 0.10.2's api_test.py and jax_jit_test.py) that are expected to fail,
by test id (file::class::test), with the reason. tests/peer/swap.py marks them xfail."""

# failing under plain jax.jit on this project's machines (none so far: `make test-peer
# PEER_JIT=jax` runs the baseline)
FAIL_UNDER_JAX: dict[str, str] = {}

DIFFER_UNDER_JGSESS: dict[str, str] = {
    "api_test.py::TracebackTest::test_jit_traceback": (
        "the stack inside f holds one more frame: jgsess's step in jax.jit's tracing "
        "(_compat.install_jit_hook), which traces f through jax's own function and "
        "rewrites the result: 7 frames against 6"
    ),
}

# where jgsess.jit takes its public road (JGSESS_ROAD=public, or where the hook's probe fails):
# jax.jit traces jgsess's body, which traces f with jax.jit(f).trace
DIFFER_ON_THE_PUBLIC_ROAD: dict[str, str] = {
    "api_test.py::APITest::test_eval_shape_trace_cache_share": (
        "jax counts the body's trace beside f's: 2 traces against 1"
    ),
    "api_test.py::APITest::test_user_trace_context_hooks": (
        "jax counts the body's trace beside f's: 8 traces against 4"
    ),
    "api_test.py::JitTest::test_cpp_jit_raises_on_non_hashable_static_argnum": (
        "f's trace inside the body's compares the static argument in one more of jax's "
        "caches, whose ValueError says 'metadata fields of pytree' rather than 'static "
        "arguments should be comparable'"
    ),
}
