#!/usr/bin/env bash
# The whole GPU acceptance in one call, for a machine with an NVIDIA GPU, jax's CUDA plugin, nvcc,
# pybind11 and no network (CuPy and torch are used where present); under 8 minutes on one H200:
#
#   1. build jgsess._C with the CUDA kernels; report the GPU, the driver and the code it carries
#   2. the kernel suite on the GPU (the CUDA handlers against their references, not emulated)
#      and the fusion suite (tests/passes, tests/test_cuda_lowering.py)
#   3. benchmarks/train_step.py and benchmarks/optimizer_step.py against jax.jit (and torch's
#      fused CUDA optimizers where torch is present)
#   4. a table: tests, then each benchmark row
#
#   bash benchmarks/gpu_check.sh              on the GPU machine (OUT=dir keeps logs and JSON)
#   bash benchmarks/gpu_check.sh --rehearse   on a CPU, as CI runs it: the same steps with the
#                                             SIMT emulator in place of the device (the kernel
#                                             tests' CUDA cases) and the smallest benchmarks
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
REHEARSE=0
[ "${1:-}" = "--rehearse" ] && REHEARSE=1
PY=${PYTHON:-python3}
OUT=${OUT:-benchmarks/results/gpu_check}
mkdir -p "$OUT"
start=$(date +%s)
status=0
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}

echo "== build (nvcc: $(command -v nvcc || echo missing))"
if [ $REHEARSE = 1 ]; then
  # the extension as `make test` built it
  $PY -c "import jgsess._C" 2>/dev/null || JGSESS_CUDA=auto $PY setup.py -q build_ext --inplace \
    > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
else
  rm -rf build jgsess/_C*.so
  JGSESS_CUDA=1 $PY setup.py -q build_ext --inplace > "$OUT/build.log" 2>&1 ||
    { tail -30 "$OUT/build.log"; exit 1; }
fi
# the test-only extension beside it: the emulator of the CUDA kernels, host test hooks, probes
$PY tests/native/build.py > "$OUT/testing.log" 2>&1 || { tail -30 "$OUT/testing.log"; exit 1; }
$PY - <<'PYEOF'
import jax
from jgsess.kernels import _native
build = _native.cuda_build()
print(f"jax {jax.__version__} on {jax.devices()[0].device_kind}; CUDA kernels for "
      f"{build['sm']} (+PTX {build['ptx']}); driver {_native.cuda_driver_version()}")
PYEOF
build_s=$(( $(date +%s) - start ))

if [ $REHEARSE = 1 ]; then
  kernel_tests=(tests/emulator tests/kernels/test_global_norm.py -k "simt")
  fusion_tests=(tests/test_cuda_lowering.py tests/test_cuda_build.py)
  train=(--workloads lora --runs 1 --warmup 1)
  optim=(--sets resnet50 --optimizers adamw --dtypes f32 --runs 1 --warmup 1)
else
  kernel_tests=(tests/kernels -k "not simt")
  fusion_tests=(tests/passes tests/test_cuda_lowering.py tests/test_cuda_build.py tests/test_jit.py)
  train=(--workloads resnet50,transformer --runs 5)
  optim=(--sets resnet50,bert-base --dtypes f32,bf16 --runs 7)
fi

run_tests() {  # name, then pytest's arguments
  local name=$1
  shift
  echo "== $name tests"
  timeout 300 $PY -m pytest -q -p no:cacheprovider "$@" > "$OUT/$name.log" 2>&1
  tail -3 "$OUT/$name.log"
  grep -qE "[0-9]+ passed" "$OUT/$name.log" && ! grep -qE "[0-9]+ (failed|error)" "$OUT/$name.log" ||
    status=1
}
run_tests kernel "${kernel_tests[@]}"
run_tests fusion "${fusion_tests[@]}"

echo "== train_step.py"
timeout 240 $PY benchmarks/train_step.py "${train[@]}" --out "$OUT" > "$OUT/train_step.log" 2>&1 ||
  { tail -20 "$OUT/train_step.log"; status=1; }
echo "== optimizer_step.py"
timeout 240 $PY benchmarks/optimizer_step.py "${optim[@]}" --out "$OUT" > "$OUT/optimizer_step.log" \
  2>&1 || { tail -20 "$OUT/optimizer_step.log"; status=1; }

echo
echo "== summary ($(( $(date +%s) - start )) s; build ${build_s} s$([ $REHEARSE = 1 ] && echo '; rehearsal: emulated kernels, smallest benchmarks'))"
for name in kernel fusion; do
  echo "$name tests: $(grep -E "passed|failed" "$OUT/$name.log" | tail -1)"
done
$PY - "$OUT" <<'PYEOF'
import json, os, sys
out = sys.argv[1]
path = os.path.join(out, "train_step.json")
if os.path.exists(path):
    print(f"{'train step':24s} {'jax.jit ms':>10s} {'jgsess.jit':>10s} {'speedup':>8s}")
    for r in json.load(open(path))["results"]:
        ms = r["ms"]
        print(f"{r['workload']:24s} {ms['jax.jit']:10.3f} {ms['jgsess.jit']:10.3f} "
              f"{r['speedup']:7.2f}x")
path = os.path.join(out, "optimizer_step.json")
if os.path.exists(path):
    data = json.load(open(path))["results"]  # benchmarks/record.py: the run's record
    ceilings = data["ceilings"]
    print(f"{'set':17s} {'opt':20s} {'jax.jit ms':>10s} {'jgsess.jit':>10s} {'speedup':>8s} "
          f"{'torch':>8s} {'of ceiling':>10s}")
    for r in data["results"]:
        ms = r["ms"]
        if "jgsess.jit" not in ms:
            continue
        moved = r["params"] * r["bytes_per_param"]
        ceiling = ceilings[str((r["optimizer"], r["dtype"]))]
        share = moved / (ms["jgsess.jit"] / 1e3) / 1e9 / ceiling
        torch = f"{ms['torch fused'] / ms['jgsess.jit']:7.2f}x" if "torch fused" in ms else "-"
        print(f"{r['set']:17s} {r['optimizer'] + ' ' + r['dtype']:20s} {ms['jax.jit']:10.3f} "
              f"{ms['jgsess.jit']:10.3f} {ms['jax.jit'] / ms['jgsess.jit']:7.2f}x {torch:>8s} "
              f"{share:10.0%}")
    print(f"ceiling (STREAM triad on a CPU, device copy on a GPU): {ceilings['triad']:.0f} GB/s")
PYEOF
exit $status
