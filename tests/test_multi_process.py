"""Two processes, two CPU devices each, one jax.distributed job over gloo: jgsess's kernels fire
in both and the data-parallel train step equals jax.jit's (tests/multi_device/worker.py)."""

import os
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_processes_data_parallel():
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("XLA_FLAGS", None)
    procs = [
        subprocess.Popen(
            [sys.executable, "tests/multi_device/worker.py", str(i), "2", str(port)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    try:
        outputs = [p.communicate(timeout=240) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for p, (out, err) in zip(procs, outputs):
        assert p.returncode == 0, err[-3000:]
        verdict = [line.split() for line in out.splitlines() if line.startswith("ok")]
        assert verdict, out
        assert {"jgsess_adamw", "jgsess_global_norm"} <= set(verdict[-1][1:]), out
