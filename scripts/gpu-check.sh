#!/usr/bin/env bash
# opgym's GPU check, for one machine with an NVIDIA GPU, torch (with CUDA), nvcc, cmake, ninja and
# (optionally) triton and Liger-Kernel; nothing is downloaded. From the repository root:
#
#   scripts/gpu-check.sh            # results under $OUT (when set) or results/gpu-check/
#
# Stages (each one runs whatever the previous ones gave; a failed stage is reported, not fatal):
#   1. build   one build through the project's CMake (-DSKBUILD=ON, as pip's scikit-build-core does):
#              the core with the CUDA backend (sm_90, OPGYM_CUDA=on), the CUDA gtests and the torch
#              extension on the stable ABI (opgym/_stable.so, every op's CPU kernels, and
#              opgym/_stable_cuda.so, their CUDA kernels; built against the machine's own torch, they
#              load in any torch from the floor on); both land in a staged copy of the package.
#   2. gtest   the CUDA gtests (bit-exact with the CPU path, graph capture, 64-bit offsets, errors).
#   3. pytest  the precision suite with OPGYM_DEVICE=cuda, each test file in its own process (CUDA tests
#              first); 3b. tests/huge on the GPU.
#   4. run     `opgym run --device cuda` (whole network, baseline vs every opgym op).
#   5. bench   src/ops/rms_norm/tools/gpu_bench.py: captured shapes + size sweep vs HF eager, F.rms_norm,
#              torch.compile, Liger; GB/s and % of a same-byte copy; decode latency in a CUDA graph;
#              then every other op's own GPU benchmark there is, src/ops/<op>/tools/gpu_bench.py --json FILE
#              (swiglu's: the activation and the MLP vs HF eager and Liger); their shared timing is
#              scripts/gpu_timing.py.
# The machine needs no Debian package beyond the toolchain: without libsleef-dev the CPU swiglu uses
# glibc's exp (build_info says so), without libdnnl-dev the C++ swiglu_mlp is not built.
# Prints a stage summary and the benchmark table last. Whole run: under 8 minutes (stage timeouts
# are taken from a 450 s budget).
set -uo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
OUTDIR="${OUT:-$REPO/results/gpu-check}"
mkdir -p "$OUTDIR/logs"
WORK="$REPO/build-gpu"
STAGE="$WORK/pkg"          # PYTHONPATH: a copy of python/opgym with the built _stable.so and _stable_cuda.so
PY="${PYTHON:-python3}"
JOBS="$(nproc 2>/dev/null || echo 8)"
BUDGET=450
START=$SECONDS
declare -A STATUS=()
ORDER=()

left() { echo $(( BUDGET - (SECONDS - START) )); }
# cap SECONDS [RESERVE]: a stage timeout no longer than SECONDS, leaving RESERVE for what follows.
cap() { local l=$(( $(left) - ${2:-0} )); (( l < 10 )) && l=10; (( l > $1 )) && l=$1; echo "$l"; }
stage() { ORDER+=("$1"); STATUS[$1]="$2"; printf '== %-7s %s\n' "$1" "$2"; }
log() { echo "$OUTDIR/logs/$1.log"; }

# ---- environment -----------------------------------------------------------------------------------
{
  echo "date: $(date -u)"
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem --format=csv
  command -v nvcc >/dev/null && nvcc --version | tail -2
  cmake --version | head -1
  "$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'available', torch.cuda.is_available())"
  "$PY" -c "import triton; print('triton', triton.__version__)" 2>&1 | tail -1
  "$PY" -c "import liger_kernel; print('liger_kernel', getattr(liger_kernel, '__version__', '?'))" 2>&1 | tail -1
} > "$(log env)" 2>&1
cat "$(log env)"
if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  echo "gpu-check: torch sees no CUDA device; the GPU stages cannot run" >&2
fi
NVCC="$(command -v nvcc || true)"
[ -z "$NVCC" ] && [ -x /usr/local/cuda/bin/nvcc ] && NVCC=/usr/local/cuda/bin/nvcc
# CUDA_HOME for torch.utils.cpp_extension: the toolkit root that has the runtime headers (nvcc may be
# a wrapper script or a symlink elsewhere).
if [ -z "${CUDA_HOME:-}" ]; then
  for c in "$( [ -n "$NVCC" ] && dirname "$(dirname "$(readlink -f "$NVCC")")")" /usr/local/cuda /usr/local/cuda-*; do
    if [ -n "$c" ] && [ -f "$c/include/cuda_runtime.h" ]; then CUDA_HOME="$c"; break; fi
  done
fi
export CUDA_HOME="${CUDA_HOME:-}"
echo "CUDA_HOME: ${CUDA_HOME:-not found}"

# ---- 1. build: one CMake build (the project's own, as pip uses it) of the CUDA gtests and the extension --
# -DSKBUILD=ON adds python/CMakeLists.txt (the torch extension) exactly as scikit-build-core does; it
# builds against the torch of $PY, whatever its version, so no second, hand-listed build can drift from it.
mkdir -p "$WORK"
t0=$SECONDS
(
  cmake -S . -B "$WORK/cmake" -G Ninja -DCMAKE_BUILD_TYPE=Release -DOPGYM_CUDA=on -DSKBUILD=ON \
    -DPython_EXECUTABLE="$(command -v "$PY")" -DCMAKE_CUDA_ARCHITECTURES=90 ${NVCC:+-DCMAKE_CUDA_COMPILER=$NVCC} \
    -DOPGYM_BUILD_TOOLS=OFF -DOPGYM_BUILD_BENCH=OFF -DOPGYM_BUILD_TESTS=ON &&
  timeout 300 cmake --build "$WORK/cmake" -j "$JOBS" --target opgym_cuda_tests opgym_torch_stable opgym_torch_stable_cuda
) > "$(log cmake)" 2>&1; rc=$?
if (( rc == 0 )); then
  stage cmake "ok ($((SECONDS - t0)) s)"
else
  stage cmake "FAIL: see $(log cmake): $(grep -m1 -iE 'error|could not find' "$(log cmake)" | cut -c1-160)"
fi
if [ -f "$WORK/cmake/python/_stable.so" ] && [ -f "$WORK/cmake/python/_stable_cuda.so" ]; then
  rm -rf "$STAGE" && mkdir -p "$STAGE" && cp -r python/opgym "$STAGE/opgym" &&
    cp "$WORK/cmake/python/_stable.so" "$WORK/cmake/python/_stable_cuda.so" "$STAGE/opgym/"
  stage ext "ok: $STAGE/opgym/_stable.so and _stable_cuda.so (built by the cmake stage)"
else
  stage ext "FAIL: the cmake stage built no python/_stable.so and python/_stable_cuda.so"
fi

# ---- 2. CUDA gtests ---------------------------------------------------------------------------------
if [ -x "$WORK/cmake/opgym_cuda_tests" ]; then
  timeout "$(cap 90 270)" "$WORK/cmake/opgym_cuda_tests" --gtest_brief=1 > "$(log gtest)" 2>&1; rc=$?
  summary="$(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$(log gtest)" | tr '\n' ' ' | cut -c1-200)"
  if (( rc == 0 )); then stage gtest "ok: $summary"; else stage gtest "FAIL (rc $rc): $summary; see $(log gtest)"; fi
else
  stage gtest "not run: no test binary (cmake stage)"
fi

export PYTHONPATH="$STAGE${PYTHONPATH:+:$PYTHONPATH}"
HAVE_EXT=0   # 1: `import opgym` works with its CUDA kernels registered (the schemas are Python: no other way)
"$PY" -c "import opgym, torch, sys; from opgym import _library; print('cuda_load_error:', _library.cuda_load_error()); \
sys.exit(0 if 'cuda operators: yes' in torch.ops.opgym.build_info() and \
torch._C._dispatch_has_kernel_for_dispatch_key('opgym::rms_norm', 'CUDA') else 1)" > "$(log import)" 2>&1 && HAVE_EXT=1
HAVE_PYTEST=0
"$PY" -c "import pytest" 2>/dev/null && HAVE_PYTEST=1

# ---- 3. precision suite on the GPU: each test file in its own process (a crash cannot hide the rest) -----
if (( HAVE_EXT == 1 && HAVE_PYTEST )); then
  : > "$(log pytest)"
  failed=()
  end=$(( SECONDS + $(cap 150 210) ))
  # Every test file there is, the CUDA ones (tests/test_*cuda*.py) first.
  cuda_re='/test_[^/]*cuda[^/]*\.py$'
  for f in $(ls tests/test_*.py | grep -E "$cuda_re") $(ls tests/test_*.py | grep -vE "$cuda_re"); do
    (( SECONDS >= end )) && { failed+=("$(basename "$f"):not-run(time)"); continue; }
    echo "== $f" >> "$(log pytest)"
    (cd tests && OPGYM_DEVICE=cuda timeout $(( end - SECONDS > 10 ? end - SECONDS : 10 )) "$PY" -m pytest -q \
      -p no:cacheprovider "$(basename "$f")") >> "$(log pytest)" 2>&1 || failed+=("$(basename "$f"):rc$?")
  done
  summary="$(grep -cE '^[0-9]+ passed' "$(log pytest)") files passed; ${#failed[@]} not: ${failed[*]}"
  if (( ${#failed[@]} == 0 )); then stage pytest "ok: $summary"; else stage pytest "FAIL: $summary; see $(log pytest)"; fi
elif (( ! HAVE_PYTEST )); then
  stage pytest "not run: pytest is not installed for $PY"
else
  stage pytest "not run: opgym with CUDA operators does not import ($(grep -m1 -E 'Error' "$(log import)" | cut -c1-160))"
fi

# ---- 3b. every op past 2^31 elements on the GPU (tests/huge) -------------------------------------------
if (( HAVE_EXT == 1 && HAVE_PYTEST )); then
  (cd tests && OPGYM_HUGE=1 OPGYM_DEVICE=cuda timeout "$(cap 40 120)" "$PY" -m pytest -q -p no:cacheprovider huge) \
    > "$(log huge)" 2>&1; rc=$?
  summary="$(grep -E '(passed|failed|error|skipped)' "$(log huge)" | tail -1 | cut -c1-200)"
  if (( rc == 0 )); then stage huge "ok: $summary"; else stage huge "FAIL (rc $rc): $summary; see $(log huge)"; fi
else
  stage huge "not run: no CUDA operators or no pytest"
fi

# ---- 4. whole network: opgym run --device cuda --------------------------------------------------------
if (( HAVE_EXT == 1 )); then
  timeout "$(cap 90 150)" "$PY" -m opgym.cli run --device cuda --no-progress --report "$OUTDIR/run_cuda.json" \
    > "$(log run)" 2>&1; rc=$?
  if (( rc == 0 )); then stage run "ok: report $OUTDIR/run_cuda.json; $(grep -iE 'tok|speed' "$(log run)" | tail -2 | tr '\n' ' ' | cut -c1-200)"
  else stage run "FAIL (rc $rc): $(tail -1 "$(log run)" | cut -c1-200); see $(log run)"; fi
else
  stage run "not run: opgym with CUDA operators does not import"
fi

# ---- 5. benchmark -----------------------------------------------------------------------------------
TABLE="$OUTDIR/table.txt"
rm -f "$TABLE"
if (( HAVE_EXT )); then
  bl=$(( $(left) - 10 )); (( bl < 60 )) && bl=60
  timeout "$bl" "$PY" src/ops/rms_norm/tools/gpu_bench.py --json "$OUTDIR/gpu_bench.json" --table "$TABLE" --budget-s $(( bl - 40 )) \
    > "$(log bench)" 2>&1; rc=$?
  if (( rc == 0 )); then stage bench "ok: $OUTDIR/gpu_bench.json"; else stage bench "FAIL (rc $rc): $(tail -1 "$(log bench)" | cut -c1-200)"; fi
else
  stage bench "not run: no CUDA operators"
fi
if (( HAVE_EXT == 1 )); then
  for script in src/ops/*/tools/gpu_bench.py; do
    [ -f "$script" ] || continue
    op="$(basename "$(dirname "$(dirname "$script")")")"
    [ "$op" = rms_norm ] && continue  # the bench stage above
    timeout "$(cap 60 0)" "$PY" "$script" --json "$OUTDIR/gpu_bench_$op.json" > "$(log "$op")" 2>&1; rc=$?
    if (( rc == 0 )); then stage "$op" "ok: $OUTDIR/gpu_bench_$op.json"
    else stage "$op" "FAIL (rc $rc): $(tail -1 "$(log "$op")" | cut -c1-200)"; fi
  done
fi

# ---- summary, table last -------------------------------------------------------------------------------
echo
echo "gpu-check: $((SECONDS - START)) s; logs and results in $OUTDIR"
for s in "${ORDER[@]}"; do printf '  %-7s %s\n' "$s" "${STATUS[$s]}"; done
echo
if [ -f "$TABLE" ]; then cat "$TABLE"; else echo "(no benchmark table)"; tail -5 "$(log bench)" 2>/dev/null; fi
