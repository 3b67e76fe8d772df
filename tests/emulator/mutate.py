"""Mutation check of the emulated kernel tests: small bugs put into the CUDA sources one at a time
(a dropped barrier, an off-by-one bound, a wrong lane, a wrong index, ...); for each, the SIMT
emulator is rebuilt from the mutated sources and the kernel's emulated tests run. A mutation is
caught when a test fails (a wrong number, or one of the emulator's checks).

    python tests/emulator/mutate.py [--only NAME]      (about 20 minutes on 2 cores)

Prints one line per mutation and the score; exits 1 if a mutation does not apply (its source
line changed). The real extension is put back afterwards.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.native import build  # noqa: E402

# (name, file under csrc/, text, its replacement, the test module that covers it)
MUTATIONS = [
    (
        "norm: barrier dropped",
        "kernels/global_norm/global_norm_cuda.cu",
        "sum;\n  __syncthreads();",
        "sum;\n",
        "global_norm",
    ),
    (
        "norm: a shuffle step short",
        "kernels/global_norm/global_norm_cuda.cu",
        "offset > 0; offset /= 2) sum +=",
        "offset > 1; offset /= 2) sum +=",
        "global_norm",
    ),
    (
        "norm: wrong lane writes the warp sum",
        "kernels/global_norm/global_norm_cuda.cu",
        "if (threadIdx.x % 32 == 0) warp_sums",
        "if (threadIdx.x % 32 == 1) warp_sums",
        "global_norm",
    ),
    (
        "norm: partial at the wrong index",
        "kernels/global_norm/global_norm_cuda.cu",
        "partial[base * kParts + blockIdx.x] = block;",
        "partial[base * kParts + blockIdx.x + 1] = block;",
        "global_norm",
    ),
    (
        "norm: finish drops the last partial",
        "kernels/global_norm/global_norm_cuda.cu",
        "i < count; i += kFinishThreads",
        "i < count - 1; i += kFinishThreads",
        "global_norm",
    ),
    (
        "norm: finish tree without its barrier",
        "kernels/global_norm/global_norm_cuda.cu",
        "sums[threadIdx.x + half];\n    __syncthreads();",
        "sums[threadIdx.x + half];\n",
        "global_norm",
    ),
    (
        "apply: a table's last block dropped",
        "common/multi_tensor_cuda.cuh",
        "if (blocks > 0) launch(table, blocks);",
        "if (blocks > 1) launch(table, blocks);",
        "adamw",
    ),
    (
        "apply: continued tensor not carried",
        "common/multi_tensor_cuda.cuh",
        "if (!last_chunk) put(count++, t);",
        "",
        "momentum",
    ),
    (
        "apply: chunks rounded down",
        "common/multi_tensor_cuda.cuh",
        "(t.size + kChunk - 1) / kChunk",
        "t.size / kChunk",
        "cast_all",
    ),
    (
        "apply: bf16 NaN not quieted",
        "common/multi_tensor_cuda.cuh",
        "(__float_as_uint(v) >> 16) | 0x40u",
        "(__float_as_uint(v) >> 16)",
        "cast_all",
    ),
    (
        "apply: f16 loads read as bf16",
        "common/multi_tensor_cuda.cuh",
        "case Elem::kF16: return Widen(static_cast<const F16*>",
        "case Elem::kF16: return Widen(static_cast<const BF16*>",
        "momentum",
    ),
    (
        "part: the second part shifted",
        "common/multi_tensor_cuda.cuh",
        "static_cast<int64_t>(blockIdx.x % kParts) * kPartElements;",
        "static_cast<int64_t>(blockIdx.x % kParts) * (kPartElements - 1);",
        "adamw",
    ),
    (
        "part: one element past the part",
        "common/multi_tensor_cuda.cuh",
        "min(left, static_cast<int64_t>(kPartElements))",
        "min(left, static_cast<int64_t>(kPartElements) + 1)",
        "adamw",
    ),
    (
        "vector: alignment not checked",
        "common/multi_tensor_cuda.cuh",
        "table.aligned[part.tensor] ? part.count - part.count % kVec : 0",
        "part.count - part.count % kVec",
        "momentum",
    ),
    (
        "vector: one step past the vector end",
        "common/multi_tensor_cuda.cuh",
        "const bool more = i + step < vector_end;",
        "const bool more = i + step <= vector_end;",
        "cast_all",
    ),
    (
        "vector: the next step loaded from the current",
        "common/multi_tensor_cuda.cuh",
        "if (more) Load(in, i + step, next, In{});",
        "if (more) Load(in, i, next, In{});",
        "adamw",
    ),
    (
        "vector: a thread's first step skipped",
        "common/multi_tensor_cuda.cuh",
        "if (i < vector_end) Load(in, i, now, In{});\n    for (; i < vector_end; i += step) {",
        "if (i < vector_end) Load(in, i, now, In{});\n"
        "    for (i += step; i < vector_end; i += step) {",
        "global_norm",
    ),
    (
        "vector: the tail's last element skipped",
        "common/multi_tensor_cuda.cuh",
        "j < part.count;\n         j += static_cast<int>(blockDim.x)) {\n"
        "      float args[kIn], res[kOutSlots];",
        "j < part.count - 1;\n         j += static_cast<int>(blockDim.x)) {\n"
        "      float args[kIn], res[kOutSlots];",
        "momentum",
    ),
    (
        "vector: words stored out of order",
        "common/multi_tensor_cuda.cuh",
        "reinterpret_cast<uint4*>(p)[w] = words[w];",
        "reinterpret_cast<uint4*>(p)[w] = words[kWords - 1 - w];",
        "adamw",
    ),
    (
        "adamw: m' into the v' slot",
        "kernels/adamw/adamw_cuda.cu",
        "&out[0], &out[1], &out[2], q);",
        "&out[0], &out[2], &out[1], q);",
        "adamw",
    ),
    (
        "adamw: mixed first moment read as bf16",
        "kernels/adamw/adamw_cuda.cu",
        "PartLoop<Types<BF16, BF16, F32, BF16>, Types<PNew, F32, BF16>>",
        "PartLoop<Types<BF16, BF16, BF16, BF16>, Types<PNew, F32, BF16>>",
        "adamw",
    ),
    (
        "momentum: bf16 parameters' accumulator read as bf16",
        "kernels/momentum/momentum_cuda.cu",
        "    MomentumLoop<BF16, F32>::Run(table, part, update(InF32{}));",
        "    MomentumLoop<BF16, BF16>::Run(table, part, update(InF32{}));",
        "momentum",
    ),
    (
        "momentum: f16 narrow math rounds a NaN as the GPU does",
        "common/optimizer.h",
        "    if (x != x) {\n      uint32_t bits;",
        "    if (false) {\n      uint32_t bits;",
        "momentum",
    ),
    (
        "cast_all: f16 results written as bf16",
        "kernels/cast_all/cast_all_cuda.cu",
        "case Elem::kF16: PartLoop<Types<X>, Types<F16>>",
        "case Elem::kF16: PartLoop<Types<X>, Types<BF16>>",
        "cast_all",
    ),
    (
        "relu: mask word written past the end",
        "kernels/relu_mask/relu_mask_cuda.cu",
        "if (threadIdx.x % 32 == 0 && i < n) mask[i / 32] = bits;",
        "if (threadIdx.x % 32 == 0) mask[i / 32] = bits;",
        "relu_mask",
    ),
    (
        "relu: ballot counts lanes past the end",
        "kernels/relu_mask/relu_mask_cuda.cu",
        "__ballot_sync(0xffffffffu, i < n && s > 0.0f)",
        "__ballot_sync(0xffffffffu, s >= 0.0f)",
        "relu_mask",
    ),
    (
        "relu grad: one element past the end",
        "kernels/relu_mask/relu_mask_cuda.cu",
        "if (i >= n) return;\n  float g",
        "if (i > n) return;\n  float g",
        "relu_mask",
    ),
    (
        "relu: early exit before the ballot",
        "kernels/relu_mask/relu_mask_cuda.cu",
        "  float s = 0.0f;\n  if (i < n) {",
        "  float s = 0.0f;\n  if (i >= n) return;\n  if (i < n) {",
        "relu_mask",
    ),
    (
        "bn: rows barrier dropped",
        "kernels/batch_norm/batch_norm_cuda.cu",
        "sq[threadIdx.y][threadIdx.x] = q;\n  __syncthreads();",
        "sq[threadIdx.y][threadIdx.x] = q;\n",
        "batch_norm",
    ),
    (
        "bn: a lane's rows not added",
        "kernels/batch_norm/batch_norm_cuda.cu",
        "for (int l = 1; l < kLanes; ++l)",
        "for (int l = 1; l < kLanes - 1; ++l)",
        "batch_norm",
    ),
    (
        "bn: a shuffle step short",
        "kernels/batch_norm/batch_norm_cuda.cu",
        "for (int offset = 16; offset > 0; offset /= 2) {",
        "for (int offset = 16; offset > 1; offset /= 2) {",
        "batch_norm",
    ),
    (
        "bn: NaN through the ReLU as 0",
        "kernels/batch_norm/batch_norm_cuda.cu",
        "(v > 0.0f || v != v) ? v : 0.0f",
        "v > 0.0f ? v : 0.0f",
        "batch_norm",
    ),
    (
        "bn: the last split not added",
        "kernels/batch_norm/batch_norm_cuda.cu",
        "for (int64_t p = 0; p < splits; ++p)",
        "for (int64_t p = 0; p < splits - 1; ++p)",
        "batch_norm",
    ),
    (
        "bn: input grad one past the end",
        "kernels/batch_norm/batch_norm_cuda.cu",
        "if (i >= s.size()) return;",
        "if (i > s.size()) return;",
        "batch_norm",
    ),
    (
        "bn: channel index of the wrong dimension",
        "kernels/batch_norm/batch_norm_cuda.cu",
        "const int64_t c = ChannelOf<Index>(i, s);\n    v =",
        "const int64_t c = i % s.channels;\n    v =",
        "batch_norm",
    ),
    (
        "bn: the row not carried past a row's end",
        "kernels/batch_norm/batch_norm_cuda.cu",
        "      offset -= inner;\n      ++row;",
        "      offset -= inner;",
        "batch_norm",
    ),
    (
        "bn: empty batch statistics unwritten",
        "kernels/batch_norm/batch_norm_cuda.cu",
        "  if (c >= s.channels) return;\n  const bool empty",
        "  if (c >= s.channels || s.count() == 0) return;\n  const bool empty",
        "batch_norm",
    ),
]


def run_one(name, path, old, new, module, extension: Path, scratch: Path) -> str:
    csrc = scratch / "csrc"
    text = (ROOT / "csrc" / path).read_text()
    if text.count(old) != 1:
        return "does not apply"
    (csrc / path).write_text(text.replace(old, new))
    try:
        build.build(csrc, scratch / "objects", extension)
    except subprocess.CalledProcessError:
        return "caught (does not compile)"
    finally:
        (csrc / path).write_text(text)
    test = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-x",
            "-p",
            "no:cacheprovider",
            f"tests/kernels/test_{module}.py",
            "tests/kernels/test_operand_checks.py",
            "-k",
            "simt",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    return "caught" if test.returncode != 0 else "MISSED"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="")
    args = parser.parse_args()
    extension = build.target()
    kept = extension.with_suffix(".kept")
    shutil.copy2(extension, kept)
    caught = total = 0
    failed = False
    try:
        with tempfile.TemporaryDirectory() as tmp:
            scratch = Path(tmp)
            shutil.copytree(ROOT / "csrc", scratch / "csrc")
            build.build(scratch / "csrc", scratch / "objects", extension)  # the objects, once
            for name, path, old, new, module in MUTATIONS:
                if args.only and args.only not in name:
                    continue
                start = time.perf_counter()
                result = run_one(name, path, old, new, module, extension, scratch)
                print(f"{result:26s} {name} ({time.perf_counter() - start:.0f} s)", flush=True)
                failed |= result == "does not apply"
                total += result != "does not apply"
                caught += result.startswith("caught")
    finally:
        shutil.move(kept, extension)
    print(f"caught {caught} of {total} mutations")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
