#!/usr/bin/env bash
# Native part of CI (torch-free): build csrc/ with CMake, run the C++ unit tests (ctest: the
# per-group math against enumeration, and the CUDA kernels' safety logic emulated on the host), and
# compile every csrc/cuda/*.cu for sm_80 and sm_90 with nvcc, failing on any register spill
# (-Xptxas -v) and unless compute_90 PTX is embedded (newer GPUs JIT it). Without nvcc the CUDA
# part is skipped with a message.
#
#   scripts/ci_native.sh            # env: CUDA_HOME (toolkit root), MAX_JOBS (default 1),
#                                   #      BONKERNELS_CMAKE_BUILD_DIR (default build/cmake)
# About 10 minutes on 2 cores with nvcc (nearly all of it advantages.cu for the two architectures,
# whose kernels nvcc --split-compile optimises side by side), seconds without.
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD_DIR="${BONKERNELS_CMAKE_BUILD_DIR:-build/cmake}"
JOBS="${MAX_JOBS:-1}"

source scripts/cuda_home.sh

cmake_args=(-S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release -DCMAKE_EXPORT_COMPILE_COMMANDS=ON)
if [ -n "$CUDA_HOME" ] && [ -x "$CUDA_HOME/bin/nvcc" ]; then
  export CUDA_HOME
  echo "ci_native: nvcc at $CUDA_HOME/bin/nvcc: compiling the CUDA kernels for sm_80 and sm_90"
  cmake_args+=(-DBONKERNELS_CUDA=ON -DBONKERNELS_PTXAS_VERBOSE=ON -DBONKERNELS_CUDA_ARCHS="80;90"
               -DCMAKE_CUDA_COMPILER="$CUDA_HOME/bin/nvcc")
  have_cuda=1
else
  echo "ci_native: nvcc not found (set CUDA_HOME to the toolkit root): SKIPPING the CUDA compile check"
  cmake_args+=(-DBONKERNELS_CUDA=OFF)
  have_cuda=0
fi

cmake "${cmake_args[@]}"
mkdir -p "$BUILD_DIR"
# --clean-first: every run recompiles, so the ptxas report below is always complete.
cmake --build "$BUILD_DIR" --clean-first -j "$JOBS" 2>&1 | tee "$BUILD_DIR/build.log"
ctest --test-dir "$BUILD_DIR" --output-on-failure

if [ "$have_cuda" = 1 ]; then
  kernels=$(grep -c "Compiling entry function" "$BUILD_DIR/build.log" || true)
  spills=$(grep -E "[1-9][0-9]* bytes spill (stores|loads)" "$BUILD_DIR/build.log" || true)
  echo "ci_native: $kernels kernel compilations (all .cu files x sm_80, sm_90)"
  if [ "$kernels" -eq 0 ]; then
    echo "ci_native: FAIL: no ptxas report in the build log"
    exit 1
  fi
  if [ -n "$spills" ]; then
    echo "ci_native: FAIL: register spills to local memory:"
    echo "$spills"
    exit 1
  fi
  echo "ci_native: no register spills"
  # PTX of the newest architecture (sm_90) next to the cubins: read back from the objects with
  # cuobjdump where the toolkit has it, else from the nvcc command lines CMake ran.
  objects=$(find "$BUILD_DIR" -name '*.cu.o' | sort)
  if [ -x "$CUDA_HOME/bin/cuobjdump" ]; then
    for obj in $objects; do
      if ! "$CUDA_HOME/bin/cuobjdump" --list-ptx "$obj" 2>/dev/null | grep -q "sm_90"; then
        echo "ci_native: FAIL: no compute_90 PTX embedded in $obj"
        exit 1
      fi
    done
  else
    n_cu=$(grep -c '"file": ".*\.cu"' "$BUILD_DIR/compile_commands.json" || true)
    n_ptx=$(grep -c 'code=\[compute_90,sm_90\]' "$BUILD_DIR/compile_commands.json" || true)
    if [ "$n_cu" -eq 0 ] || [ "$n_ptx" -ne "$n_cu" ]; then
      echo "ci_native: FAIL: $n_ptx of $n_cu .cu compile commands embed compute_90 PTX"
      exit 1
    fi
    echo "ci_native: (no cuobjdump: PTX checked in the nvcc command lines)"
  fi
  echo "ci_native: compute_90 PTX embedded in $(echo "$objects" | wc -w) object(s)"
fi
echo "ci_native: OK"
