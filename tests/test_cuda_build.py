"""The CUDA kernels as built (where nvcc was there): ptxas' resource usage of every kernel, read
from the build's report (setup.py: build/cuda/resource-usage.txt). No kernel keeps a stack
frame or spills (a tensor table copied into local memory would show as a frame of kilobytes),
and each fits the registers its launch bounds allow; every kernel declares its launch bounds."""

from __future__ import annotations

import functools
import glob
import re
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
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


def compile_ptx(source: str) -> dict[str, str]:
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


@functools.cache
def every_ptx() -> dict[str, dict[str, str]]:
    """compile_ptx of every source the tests read, compiled side by side (nvcc is serial)."""
    sources = ["csrc/kernels/batch_norm/batch_norm_cuda.cu", *VECTOR_KERNELS]
    with ThreadPoolExecutor(len(sources)) as pool:
        return dict(zip(sources, pool.map(compile_ptx, sources)))


def ptx_entries(source: str) -> dict[str, str]:
    return every_ptx()[source]


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


LABEL = re.compile(r"^(\$L__\w+):", re.M)
BRANCH = re.compile(r"^\s*(@!?%p\d+\s+)?bra(?:\.uni)?\s+(\$L__\w+);", re.M)


def loops(body: str) -> list[str]:
    """The PTX of each loop of an entry (a strongly connected set of its basic blocks, in
    layout order), from its control-flow graph: a block falls through to the next unless it
    ends in an unconditional branch or a return."""
    marks = list(LABEL.finditer(body))
    names = ["entry"] + [m.group(1) for m in marks]
    texts = [body[: marks[0].start()] if marks else body] + [
        body[m.start() : (marks[i + 1].start() if i + 1 < len(marks) else len(body))]
        for i, m in enumerate(marks)
    ]
    index = {name: i for i, name in enumerate(names)}
    edges: list[list[int]] = []
    for i, text in enumerate(texts):
        out = [index[m.group(2)] for m in BRANCH.finditer(text) if m.group(2) in index]
        last = [line.strip() for line in text.strip().splitlines() if line.strip()][-1]
        unconditional = re.match(r"(bra(\.uni)?\s|ret;)", last) is not None
        if not unconditional and i + 1 < len(texts):
            out.append(i + 1)
        edges.append(out)
    # Tarjan's strongly connected components
    order, low, on_stack, stack, components = {}, {}, set(), [], []

    def visit(v: int) -> None:
        order[v] = low[v] = len(order)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in order:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], order[w])
        if low[v] == order[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in edges[v]:
                components.append(sorted(component))

    for v in range(len(texts)):
        if v not in order:
            visit(v)
    return ["".join(texts[i] for i in component) for component in components]


def vector_loops(body: str) -> list[str]:
    return [loop for loop in loops(body) if "ld.global.v4" in loop]


# an element-wise kernel's families, by the mangled name's kernel, and the element types of
# the instances every form has (adamw: f32 throughout, bf16 parameters with f32 moments)
VECTOR_KERNELS = {
    "csrc/kernels/adamw/adamw_cuda.cu": "AdamwKernel",
    "csrc/kernels/momentum/momentum_cuda.cu": "MomentumKernel",
    "csrc/kernels/cast_all/cast_all_cuda.cu": "CastAllKernel",
    "csrc/kernels/global_norm/global_norm_cuda.cu": "PartialSums",
}


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
@pytest.mark.parametrize("source", sorted(VECTOR_KERNELS))
def test_elementwise_kernels_move_16_bytes_per_access_in_loops_that_read_no_parameters(source):
    """Every form of the multi-tensor kernels has a loop of 16-byte loads (`ld.global.v4`) and,
    but for the norm, 16-byte stores: a block picks its instance for its tensor's types once
    (common/multi_tensor_cuda.cuh: PartLoop), so the loop loads no element type and no pointer
    from the parameter space, moves no element alone (a per-element type branch would), and
    indexes in 32 bits (no 64-bit multiply)."""
    entries = {n: b for n, b in ptx_entries(source).items() if VECTOR_KERNELS[source] in n}
    assert entries
    for name, body in entries.items():
        found = vector_loops(body)
        assert found, f"{name}: no loop of 16-byte loads"
        if "PartialSums" not in name:
            assert any("st.global.v4" in loop for loop in found), f"{name}: no 16-byte stores"
        for loop in found:
            assert "ld.param" not in loop, f"{name}: reads its parameters in the vector loop"
            scalar = re.findall(r"\b(?:ld|st)\.global\.(?!v[24]\b)\S+", loop)
            assert not scalar, f"{name}: elements moved alone in the vector loop: {scalar[:3]}"
            assert not re.search(r"\bmul\.(?:lo|wide)\.[su]64\b", loop), name
