"""A benchmark run's record: its results and table, with the date, machine, versions and command
that produced them, written as JSON beside the run's other output. `publish.py` turns records
into docs/benchmarks.md."""

from __future__ import annotations

import datetime
import json
import os
import platform
import shlex
import sys

import jax


def machine() -> dict:
    """What the numbers depend on: CPU model and count, memory, jax's devices."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError, AttributeError):
        memory = 0.0
    devices = jax.devices()
    return {
        "cpu": cpu,
        "cpus": os.cpu_count(),
        "memory_gib": round(memory, 1),
        "devices": f"{len(devices)} x {devices[0].device_kind} ({jax.default_backend()})",
    }


def save(out_dir: str, name: str, table: str, results, notes: str = "") -> str:
    """Writes `<out_dir>/<name>.json`: the markdown `table`, the raw `results`, `notes` (what
    the run's settings mean for the table) and the run's date, machine, versions and command.
    Returns its path."""
    from jgsess import __version__

    record = {
        "benchmark": name,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": "python " + shlex.join(sys.argv),
        "machine": machine(),
        "versions": {
            "jax": jax.__version__,
            "jgsess": __version__,
            "python": platform.python_version(),
        },
        "table": table,
        "notes": notes,
        "results": results,
    }
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, f"{name}.json")
    with open(path, "w") as f:
        json.dump(record, f, indent=1, default=str)
    return path
