"""Builds the test-only extension tests/native/_testing (csrc/testing/module.cc): jgsess's CUDA
sources compiled as C++ for the SIMT emulator (csrc/testing/emulator/), the host machinery's
test hooks (csrc/testing/checks/) and the benchmarks' bandwidth probes (csrc/testing/bench/).
It needs only the C++ compiler, and is never part of the wheel.

    python tests/native/build.py        (make test and make bench run it)
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import jax.ffi
import pybind11

ROOT = Path(__file__).resolve().parents[2]
OUT = Path(__file__).resolve().parent
CSRC = ROOT / "csrc"
# the CUDA sources, the probes and the module, then the emulator's (simt.cc last: it holds the
# shared-memory section's closing page), relative to csrc/
PROBES = sorted(
    str(p.relative_to(CSRC))
    for p in (*CSRC.glob("testing/checks/*.cc"), *CSRC.glob("testing/bench/*.cc"))
)
SOURCES = (
    sorted(str(p.relative_to(CSRC)) for p in CSRC.glob("kernels/*/*.cu"))
    + PROBES
    + ["testing/module.cc", "testing/emulator/broken.cu", "testing/emulator/guard.cc"]
    + ["testing/emulator/module.cc"]
    + ["testing/emulator/simt.cc"]
)
# the probes as jgsess._C's code is built (setup.py): their loops vectorized as the kernels' are
PROBE_FLAGS = ["-O3", "-fopenmp-simd"]
FLAGS = [
    "-std=c++20",
    "-O2",
    "-fPIC",
    "-fvisibility=hidden",
    "-ffp-contract=off",
    "-fno-math-errno",
    "-U_FORTIFY_SOURCE",
    "-DJGSESS_SIMT_EMULATOR=1",
    "-DJGSESS_WITH_CUDA=1",
    "-isystem",
    jax.ffi.include_dir(),
    "-isystem",
    pybind11.get_include(),
    "-isystem",
    sysconfig.get_paths()["include"],
]


def target() -> Path:
    return OUT / f"_testing{sysconfig.get_config_var('EXT_SUFFIX')}"


def compile_one(source: Path, objects: Path, csrc: Path, headers_mtime: float) -> str:
    """`source`'s object in `objects` (kept while newer than the source and every header)."""
    obj = objects / (str(source.relative_to(csrc)).replace("/", "-") + ".o")
    if obj.exists() and obj.stat().st_mtime > max(source.stat().st_mtime, headers_mtime):
        return str(obj)
    cuda = ["-x", "c++", "-include", "testing/emulator/simt.h"] if source.suffix == ".cu" else []
    probe = PROBE_FLAGS if str(source.relative_to(csrc)) in PROBES else []
    includes = [f"-I{csrc / 'testing/emulator/cuda'}", f"-I{csrc}"]
    cxx = os.environ.get("CXX", "g++")
    command = [cxx, *includes, *FLAGS, *probe, *cuda, "-c", str(source), "-o", str(obj)]
    subprocess.run(command, check=True)
    return str(obj)


def build(csrc: Path = CSRC, objects: Path = ROOT / "build" / "testing", out=None) -> Path:
    """Builds the extension from the sources under `csrc` (objects kept in `objects`) into `out`
    (default: tests/native/); returns its path."""
    objects.mkdir(parents=True, exist_ok=True)
    headers = max(p.stat().st_mtime for p in csrc.rglob("*") if p.suffix in (".h", ".cuh"))
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        built = list(pool.map(lambda s: compile_one(csrc / s, objects, csrc, headers), SOURCES))
    path = Path(out) if out is not None else target()
    subprocess.run([os.environ.get("CXX", "g++"), "-shared", *built, "-o", str(path)], check=True)
    return path


def main() -> int:
    print(f"building {target().name}", flush=True)
    build()
    return 0


if __name__ == "__main__":
    sys.exit(main())
