"""The CUDA kernels as built (where nvcc was there): ptxas' resource usage of every kernel, read
from the build's report (setup.py: build/cuda/resource-usage.txt). No kernel keeps a stack
frame or spills (a tensor table copied into local memory would show as a frame of kilobytes),
and each fits the registers its launch bounds allow; every kernel declares its launch bounds."""

from __future__ import annotations

import glob
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from jgsess.kernels import _native

ROOT = Path(__file__).resolve().parents[1]
REPORT = ROOT / "build" / "cuda" / "resource-usage.txt"
REGISTERS_PER_SM = 65536

pytestmark = pytest.mark.skipif(
    not _native.cuda_build()["sm"], reason="jgsess was built without the CUDA kernels"
)


def resource_usage(text: str) -> list[dict]:
    """One entry per (kernel, arch) of a ptxas -v report."""
    found = []
    for block in re.split(r"(?=ptxas info\s*: Compiling entry function)", text)[1:]:
        name = re.search(r"entry function '(\w+)' for '(sm_\d+)'", block)
        frame = re.search(
            r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill", block
        )
        regs = re.search(r"Used (\d+) registers", block)
        found.append(
            {
                "kernel": name.group(1),
                "arch": name.group(2),
                "frame": int(frame.group(1)),
                "spills": int(frame.group(2)) + int(frame.group(3)),
                "registers": int(regs.group(1)),
            }
        )
    return found


def launch_bounds() -> dict[str, int]:
    """Kernel name -> the threads per block of its __launch_bounds__, from the sources."""
    paths = glob.glob(str(ROOT / "csrc/kernels/*/*.cu")) + glob.glob(
        str(ROOT / "csrc/common/*.cuh")
    )
    sources = "\n".join(Path(p).read_text() for p in paths)
    constants = {k: int(v) for k, v in re.findall(r"constexpr int (k\w+) = (\d+);", sources)}

    def value(expr: str) -> int:
        return int(eval(expr, {}, constants))  # noqa: S307 - products of the sources' constants

    bounds = {}
    for expr, name in re.findall(
        r"__global__ void __launch_bounds__\(([^)]*)\)\s+(\w+)\(", sources
    ):
        bounds[name] = value(expr)
    kernels = re.findall(r"__global__ void(?: __launch_bounds__\([^)]*\))?\s+(\w+)\(", sources)
    missing = sorted(set(kernels) - set(bounds))
    assert not missing, f"kernels without __launch_bounds__: {missing}"
    return bounds


def test_every_kernel_fits_its_launch_without_stack_or_spills():
    usage = resource_usage(REPORT.read_text())
    bounds = launch_bounds()
    assert usage, "no kernel in the report"
    for entry in usage:
        name = next(n for n in bounds if n in entry["kernel"])
        threads = bounds[name]
        assert entry["frame"] == 0 and entry["spills"] == 0, entry
        assert entry["registers"] * threads <= REGISTERS_PER_SM, (entry, threads)
    built = {e["arch"] for e in usage}
    assert built == {f"sm_{a}" for a in _native.cuda_build()["sm"]}, built


def ptx_entries(source: str) -> dict[str, str]:
    """Entry function (mangled name) -> its PTX body, of one .cu file compiled for compute_90."""
    import jax.ffi

    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    flags = ["-std=c++20", "-O3", "--fmad=false", "-DJGSESS_WITH_CUDA=1", f"-I{ROOT / 'csrc'}"]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "kernels.ptx"
        cmd = [nvcc, "-ptx", "-arch=compute_90", *flags, "-isystem", jax.ffi.include_dir()]
        subprocess.run([*cmd, str(ROOT / source), "-o", str(out)], check=True)
        ptx = out.read_text()
    starts = [(m.start(), m.group(1)) for m in re.finditer(r"\.entry (\w+)\(", ptx)]
    ends = [s for s, _ in starts[1:]] + [len(ptx)]
    return {name: ptx[s:e] for (s, name), e in zip(starts, ends)}


WIDE_DIVISION = re.compile(r"\b(?:div|rem)\.[su]64\b")


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_batch_norm_indexes_elements_without_a_64_bit_division_each():
    """A 64-bit division is a long instruction sequence on the GPU: the channels-first statistics
    loop steps its (row, offset) pair, and the elementwise kernels index tensors under 2^32
    elements in 32 bits (their <unsigned int> instances; <long> serves larger ones)."""
    entries = ptx_entries("csrc/kernels/batch_norm/batch_norm_cuda.cu")
    names = {n: re.search(r"\d(Sums\w+?|Normalize\w*?|InputGrad\w*?)E", n) for n in entries}
    by_kernel = {m.group(1): entries[n] for n, m in names.items() if m}
    # SumsFirst: two per thread (its split's bounds, its first row), none per element (three
    # with the row and offset divided out for each element)
    assert len(WIDE_DIVISION.findall(by_kernel["SumsFirst"])) <= 2
    for narrow in ("NormalizeIj", "InputGradIj"):
        assert not WIDE_DIVISION.search(by_kernel[narrow]), narrow
