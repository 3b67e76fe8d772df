"""Builds jgsess._C: the C++ kernels (always) and the CUDA kernels (when nvcc is there).

JGSESS_CUDA=auto (default) builds the CUDA kernels if nvcc is found, =1 requires them, =0 skips
them. JGSESS_MARCH=native (or any -march value) tunes the C++ kernels for one CPU family; by
default they run on any x86-64 / aarch64 machine. The FFI headers come from the installed jaxlib
(jax.ffi.include_dir()), so build without isolation: pip install --no-build-isolation -e .

Needs a C++ compiler with C++20 and `_Float16` (GCC 12+, Clang 15+) and, for the CUDA kernels,
CUDA 12.1+ (kernel arguments up to 32 KB: the tensor tables travel by value).
"""

import glob
import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

from pybind11.setup_helpers import Pybind11Extension, build_ext
from setuptools import setup

# the GPU code the CUDA kernels carry: binaries for these compute capabilities and the PTX of the
# last (JIT-compiled by the driver on newer GPUs); older GPUs keep XLA's code (kernels/_native.py)
CUDA_ARCHS = ("80", "90")
MIN_GCC, MIN_CLANG, MIN_CUDA = (12,), (15,), (12, 1)
# where the build leaves ptxas' resource usage of the CUDA kernels
RESOURCE_USAGE = os.path.join("build", "cuda", "resource-usage.txt")
CXX_FLAGS = [
    "-O3",
    "-fopenmp-simd",
    "-ffp-contract=off",
    "-fno-math-errno",
    "-fvisibility=hidden",
]


def ffi_include() -> str:
    import jax.ffi

    return jax.ffi.include_dir()


def find_nvcc() -> str | None:
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    candidates = [os.path.join(home, "bin", "nvcc")] if home else []
    candidates.append(shutil.which("nvcc") or "")
    candidates.append("/usr/local/cuda/bin/nvcc")
    return next((c for c in candidates if c and os.path.exists(c)), None)


def _toolkit_dir(nvcc: str, subs: tuple[str, ...], name: str) -> str:
    """The toolkit folder holding `name` (nvcc may be a wrapper outside the toolkit)."""
    roots = [
        os.environ.get("CUDA_HOME", ""),
        os.path.dirname(os.path.dirname(os.path.realpath(nvcc))),
    ]
    roots.append("/usr/local/cuda")
    for root in filter(None, roots):
        for sub in subs:
            if os.path.exists(os.path.join(root, sub, name)):
                return os.path.join(root, sub)
    sys.exit(f"nvcc at {nvcc}, but no {name} next to it (set CUDA_HOME)")


def cudart_dir(nvcc: str) -> str:
    return _toolkit_dir(nvcc, ("lib64", "lib", "targets/x86_64-linux/lib"), "libcudart_static.a")


def cuda_include_dir(nvcc: str) -> str:
    return _toolkit_dir(nvcc, ("include", "targets/x86_64-linux/include"), "cuda_runtime_api.h")


def march_flags() -> list[str]:
    """-march=<JGSESS_MARCH> when asked for (native: this machine's CPU); none by default."""
    march = os.environ.get("JGSESS_MARCH", "").strip()
    return [f"-march={march}"] if march else []


def _version(text: str) -> tuple[int, ...]:
    found = re.search(r"(\d+)\.(\d+)", text)
    return tuple(int(x) for x in found.groups()) if found else (0,)


def check_cxx(compiler: list[str]) -> None:
    """Exits with a clear message if the C++ compiler is too old for the kernels."""
    out = subprocess.run([*compiler, "--version"], capture_output=True, text=True).stdout
    first = out.splitlines()[0] if out else compiler[0]
    if "clang" in out.lower():
        name, minimum = "Clang", MIN_CLANG
    elif "g++" in out or "gcc" in out.lower() or "Free Software Foundation" in out:
        name, minimum = "GCC", MIN_GCC
    else:
        return  # an unknown compiler: let it try
    version = _version(first)
    if version < minimum:
        sys.exit(
            f"jgsess needs {name} {'.'.join(map(str, minimum))} or newer (C++20 and _Float16); "
            f"found {first!r}. Set CXX/CC to a newer compiler."
        )


def check_nvcc(nvcc: str) -> None:
    """Exits with a clear message if the CUDA toolkit is too old for the kernels."""
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
    found = re.search(r"release (\d+)\.(\d+)", out)
    version = tuple(int(x) for x in found.groups()) if found else (0,)
    if version < MIN_CUDA:
        sys.exit(
            f"jgsess's CUDA kernels need CUDA {'.'.join(map(str, MIN_CUDA))} or newer (kernel "
            f"arguments up to 32 KB); {nvcc} is {'.'.join(map(str, version))}. "
            "Set CUDA_HOME to a newer toolkit, or JGSESS_CUDA=0 to build without CUDA."
        )


def cuda_wanted(nvcc: str | None) -> bool:
    mode = os.environ.get("JGSESS_CUDA", "auto").strip().lower()
    if mode in ("0", "off", "false", "no"):
        return False
    if mode in ("1", "on", "true", "yes") and nvcc is None:
        sys.exit("JGSESS_CUDA=1 but nvcc was not found (set CUDA_HOME)")
    return nvcc is not None


class BuildExt(build_ext):
    """build_ext that first compiles csrc/**/*.cu with nvcc and links the objects in."""

    def build_extensions(self):
        check_cxx(self.compiler.compiler_so[:1])
        for ext in self.extensions:
            ext.extra_compile_args += march_flags()
        nvcc = find_nvcc()
        if cuda_wanted(nvcc):
            check_nvcc(nvcc)
            ext = self.extensions[0]
            ext.extra_objects += self.compile_cuda(nvcc)
            ext.define_macros.append(("JGSESS_WITH_CUDA", "1"))
            ext.define_macros.append(("JGSESS_CUDA_SM", ",".join(CUDA_ARCHS)))
            ext.define_macros.append(("JGSESS_CUDA_PTX", CUDA_ARCHS[-1]))
            ext.library_dirs.append(cudart_dir(nvcc))
            ext.include_dirs.append(cuda_include_dir(nvcc))
            ext.libraries += ["cudart_static", "rt", "dl", "pthread"]
        super().build_extensions()

    def compile_cuda(self, nvcc: str) -> list[str]:
        sources = sorted(glob.glob("csrc/kernels/*/*.cu"))
        out_dir = os.path.join(self.build_temp, "cuda")
        os.makedirs(out_dir, exist_ok=True)
        arch = [f"-gencode=arch=compute_{a},code=sm_{a}" for a in CUDA_ARCHS]
        arch.append(f"-gencode=arch=compute_{CUDA_ARCHS[-1]},code=compute_{CUDA_ARCHS[-1]}")

        def compile_one(source: str) -> tuple[str, str]:
            obj = os.path.join(out_dir, os.path.basename(source) + ".o")
            cmd = [
                nvcc,
                "-c",
                source,
                "-o",
                obj,
                "-std=c++20",
                "-O3",
                "--fmad=false",
                "-Xcompiler",
                "-fPIC,-fvisibility=hidden",
                "-Xptxas",
                "-v",
                "-DJGSESS_WITH_CUDA=1",
                *arch,
            ]
            cmd += ["-Icsrc", "-isystem", ffi_include()]
            print("nvcc", source, flush=True)
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode != 0:
                sys.exit(f"nvcc failed on {source}:\n{done.stdout}{done.stderr}")
            return obj, done.stderr

        with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
            built = list(pool.map(compile_one, sources))
        # ptxas' registers, stack frame and spills of every kernel (tests/test_cuda_build.py)
        os.makedirs(os.path.dirname(RESOURCE_USAGE), exist_ok=True)
        with open(RESOURCE_USAGE, "w") as f:
            f.write("".join(report for _, report in built))
        return [obj for obj, _ in built]


extension = Pybind11Extension(
    "jgsess._C",
    sorted(
        path
        for path in glob.glob("csrc/*.cc")
        + glob.glob("csrc/*/*.cc")
        + glob.glob("csrc/kernels/*/*.cc")
        # the test-only extension's (tests/native/build.py): emulator, checks, probes
        if not path.startswith("csrc/testing/")
    ),
    include_dirs=["csrc"],
    depends=sorted(
        glob.glob("csrc/**/*.h", recursive=True) + glob.glob("csrc/**/*.cuh", recursive=True)
    ),
    extra_compile_args=[*CXX_FLAGS, "-isystem", ffi_include()],
    cxx_std=20,
)

setup(ext_modules=[extension], cmdclass={"build_ext": BuildExt})
