"""Runs tests/multi_device/cases.py on 4 forced CPU devices, in a subprocess so that the device
count does not leak into the other tests."""

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.helpers import shard_map_bodies_rebuilt

ROOT = Path(__file__).resolve().parents[1]


def test_sharded_programs_on_four_devices():
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4"}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "tests/multi_device/cases.py",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    summary = done.stdout.strip().splitlines()[-1]
    assert re.search(r"\d+ passed", summary), summary
    # only the shard_map-body cases may skip, and only on a jax older than 0.8
    assert "skipped" not in summary or not shard_map_bodies_rebuilt(), summary
