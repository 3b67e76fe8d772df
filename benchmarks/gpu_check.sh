#!/usr/bin/env bash
# The whole GPU acceptance in one call, for a machine with an NVIDIA GPU, jax's CUDA plugin, nvcc,
# pybind11 and no network (CuPy and torch are used where present), under one deadline
# (GPU_CHECK_SECONDS, 480 by default: 8 minutes on one H200), each step within its own budget:
#
#   0. preflight: Python.h, pybind11, nvcc, libcudart_static.a and jax's CUDA plugin, each
#      named where missing
#   1. build jgsess._C with the CUDA kernels; report the GPU, the driver and the code it carries
#   2. the kernel suite on the GPU (the CUDA handlers against their references, not emulated)
#      and the fusion suite (tests/passes, the lowering and build tests, tests/test_jit.py)
#   3. benchmarks/train_step.py and benchmarks/optimizer_step.py against jax.jit (and torch's
#      fused CUDA optimizers where torch is present)
#   4. a table: tests, then each benchmark row (with the optimizer kernels' roofline)
#
#   bash benchmarks/gpu_check.sh              on the GPU machine (OUT=dir keeps logs and JSON)
#   bash benchmarks/gpu_check.sh --rehearse   on a CPU, as CI runs it (.ci/device-jax, on the
#                                             device's jax): the CUDA handlers under the SIMT
#                                             emulator, the fusion suite with the default device
#                                             taken as a (faked) NVIDIA GPU, the smallest
#                                             benchmarks; 1500 s by default
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
REHEARSE=0
[ "${1:-}" = "--rehearse" ] && REHEARSE=1
PY=${PYTHON:-python3}
OUT=${OUT:-benchmarks/results/gpu_check}
mkdir -p "$OUT"
start=$(date +%s)
deadline=$((start + ${GPU_CHECK_SECONDS:-$([ $REHEARSE = 1 ] && echo 1500 || echo 480)}))
status=0
steps=()
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}

# a step's budget is its seconds on a GPU machine; a rehearsal's CPU (2 cores in CI, beside the
# oldest-jax leg) gets 5 times: on a 2-core AMD EPYC the kernel suite took 223 s alone and more
# than 3 times its 90 s beside that leg
scale=$([ $REHEARSE = 1 ] && echo 5 || echo 1)
budget() {  # a step's seconds: its budget, or what is left before the deadline (less 15 s for
  local want=$(($1 * scale)) left=$((deadline - $(date +%s) - 15))  # the table)
  echo $((want < left ? want : left))
}

step() {  # name, budget, then the command: run under the budget, its outcome recorded
  local name=$1 seconds
  seconds=$(budget "$2")
  shift 2
  if [ "$seconds" -lt 10 ]; then
    steps+=("$name: skipped, the deadline is reached")
    status=1
    return 1
  fi
  echo "== $name (at most ${seconds} s)"
  local began=$(date +%s) rc=0
  timeout "$seconds" bash -c '"$@"' "$name" "$@" > "$OUT/$name.log" 2>&1 || rc=$?
  local took=$(($(date +%s) - began))
  if [ $rc = 124 ]; then
    steps+=("$name: stopped after its ${seconds} s")
  elif [ $rc != 0 ]; then
    steps+=("$name: failed (exit $rc, ${took} s)")
  else
    steps+=("$name: ${took} s")
  fi
  [ $rc = 0 ] || { tail -20 "$OUT/$name.log"; status=1; }
  return $rc
}

echo "== preflight"
nvcc=$(command -v nvcc || echo "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc")
missing=()
$PY -c 'import os, sysconfig; assert os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h"))' \
  2>/dev/null || missing+=("Python.h (the Python headers: python3-dev)")
$PY -c 'import pybind11' 2>/dev/null || missing+=("pybind11 (pip install pybind11)")
gpu_missing=()
if [ -x "$nvcc" ]; then
  cudart=$(find "$(dirname "$(dirname "$(realpath "$nvcc")")")" -name libcudart_static.a 2>/dev/null | head -1)
  [ -n "$cudart" ] || gpu_missing+=("libcudart_static.a (beside $nvcc)")
else
  gpu_missing+=("nvcc (set CUDA_HOME)")
fi
$PY -c 'import jax, sys; sys.exit(not [d for d in jax.devices() if d.platform == "gpu"])' 2>/dev/null ||
  gpu_missing+=("jax's CUDA plugin or a GPU (jax.devices() has none: pip install 'jax[cuda13]')")
if [ $REHEARSE = 1 ]; then
  for what in "${gpu_missing[@]}"; do echo "rehearsal without $what"; done
else
  missing+=("${gpu_missing[@]}")
fi
if [ ${#missing[@]} -gt 0 ]; then
  printf 'missing: %s\n' "${missing[@]}"
  exit 1
fi

if [ $REHEARSE = 1 ]; then
  # the extension as `make` built it, else built here with CUDA where nvcc is
  build() {
    $PY -c "import jgsess._C" 2>/dev/null || JGSESS_CUDA=auto $PY setup.py -q build_ext --inplace
  }
else
  build() {
    rm -rf build jgsess/_C*.so && JGSESS_CUDA=1 $PY setup.py -q build_ext --inplace
  }
fi
build_all() {  # and the test-only extension beside it: the emulator, host test hooks, probes
  build && $PY tests/native/build.py && $PY - <<'PYEOF'
import jax
from jgsess.kernels import _native
build = _native.cuda_build()
print(f"jax {jax.__version__} on {jax.devices()[0].device_kind}; CUDA kernels for "
      f"{build['sm']} (+PTX {build['ptx']}, runtime {build['runtime']}); driver "
      f"{_native.cuda_driver_version()}")
PYEOF
}
export PY
export -f build build_all
step build 150 build_all || { printf '%s\n' "${steps[@]}"; exit 1; }
tail -1 "$OUT/build.log"

fusion_tests=(tests/passes tests/test_cuda_lowering.py tests/test_cuda_build.py tests/test_jit.py)
if [ $REHEARSE = 1 ]; then
  kernel_tests=(tests/emulator tests/kernels -k "simt and cuda")
  fusion_tests+=(--default-platform=cuda)
  train=(--workloads lora --runs 1 --warmup 1)
  optim=(--sets resnet50 --optimizers adamw --dtypes f32 --runs 1 --warmup 1)
else
  kernel_tests=(tests/kernels -k "not simt")
  train=(--workloads resnet50,transformer --runs 5)
  optim=(--sets resnet50,bert-base --dtypes f32,bf16 --runs 5)
fi

step kernel-tests 90 $PY -m pytest -q -p no:cacheprovider "${kernel_tests[@]}"
step fusion-tests 100 $PY -m pytest -q -p no:cacheprovider "${fusion_tests[@]}"
step train-step 60 $PY benchmarks/train_step.py "${train[@]}" --out "$OUT"
step optimizer-step 70 $PY benchmarks/optimizer_step.py "${optim[@]}" --out "$OUT"

echo
echo "== summary ($(($(date +%s) - start)) s of $((deadline - start))$([ $REHEARSE = 1 ] && echo '; rehearsal: emulated kernels, a faked GPU as default device, smallest benchmarks'))"
printf '%s\n' "${steps[@]}"
for name in kernel-tests fusion-tests; do
  [ -f "$OUT/$name.log" ] && echo "$name: $(grep -E "passed|failed" "$OUT/$name.log" | tail -1)"
done
$PY benchmarks/roofline.py --summary "$OUT"
exit $status
