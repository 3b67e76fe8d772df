#!/usr/bin/env bash
# The GPU check, for a machine with a CUDA GPU, jax's CUDA plugin, nvcc, pybind11 and no network:
# builds the CUDA extension, runs the gpu-marked tests and a short training run, then the
# optimizer benchmark; prints a short table last. Takes about 6 minutes on one H200.
#
#   bash benchmarks/gpu_check.sh          (OUT=dir keeps the benchmark's JSON and chart there)
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
OUT=${OUT:-benchmarks/results}
mkdir -p "$OUT"
start=$(date +%s)
status=0

echo "== build (nvcc: $(command -v nvcc || echo missing))"
rm -rf build jgsess/_C*.so
JGSESS_CUDA=1 $PY setup.py -q build_ext --inplace > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
$PY -c "import jax, jgsess._C as c; print('jax', jax.__version__, jax.devices()[0].device_kind, '| CUDA kernels built in:', c.has_cuda())"
build_s=$(( $(date +%s) - start ))

echo "== gpu tests (kernels vs references on the GPU, outputs poisoned first; bf16 state)"
timeout 240 $PY -m pytest -q -m gpu tests -p no:cacheprovider 2>&1 | tee "$OUT/gpu_tests.log" | tail -15
tests=$(grep -E "passed|failed" "$OUT/gpu_tests.log" | tail -1)
grep -q "failed\|error" "$OUT/gpu_tests.log" && status=1

echo "== demo (flax MLP, jgsess.jit vs jax.jit)"
timeout 120 $PY examples/demo.py --steps 100 --timing-reps 20 2>&1 | tail -4

echo "== optimizer benchmark"
timeout 300 $PY benchmarks/optimizer_step.py --runs 7 --out "$OUT" 2>&1 | tee "$OUT/bench.log" | grep -v "^  "

echo
echo "== summary ($(( $(date +%s) - start )) s; build ${build_s} s)"
echo "gpu tests: ${tests:-none ran}"
$PY - "$OUT/optimizer_step.json" <<'PYEOF'
import json, sys
data = json.load(open(sys.argv[1]))
ceilings = data["ceilings"]
print(f"{'set':17s} {'opt':20s} {'jax.jit ms':>10s} {'jgsess.jit':>10s} {'speedup':>8s} {'of ceiling':>10s}")
for r in data["results"]:
    ms = r["ms"]
    moved = r["params"] * r["bytes_per_param"]
    ceiling = ceilings[str((r["optimizer"], r["dtype"]))]
    share = moved / (ms["jgsess.jit"] / 1e3) / 1e9 / ceiling
    print(f"{r['set']:17s} {r['optimizer'] + ' ' + r['dtype']:20s} {ms['jax.jit']:10.3f} "
          f"{ms['jgsess.jit']:10.3f} {ms['jax.jit'] / ms['jgsess.jit']:7.2f}x {share:10.0%}")
print(f"ceiling (device copy on a GPU): {ceilings['triad']:.0f} GB/s")
PYEOF
exit $status
