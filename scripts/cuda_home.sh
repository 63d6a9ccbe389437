# Sourced by the scripts that call nvcc (ci_native.sh, kernel_spills.sh): sets CUDA_HOME to the
# CUDA toolkit's root, or to "" when there is none. A CUDA_HOME with bin/nvcc is kept; else the
# usual install folders; else the folder above the nvcc on PATH.
if [ -z "${CUDA_HOME:-}" ] || [ ! -x "${CUDA_HOME}/bin/nvcc" ]; then
  CUDA_HOME=""
  for cand in /usr/local/cuda /usr/local/cuda-13.0 /usr/local/cuda-12.8; do
    if [ -x "$cand/bin/nvcc" ]; then CUDA_HOME="$cand"; break; fi
  done
  if [ -z "$CUDA_HOME" ] && command -v nvcc >/dev/null 2>&1; then
    CUDA_HOME="$(cd "$(dirname "$(readlink -f "$(command -v nvcc)")")/.." && pwd)"
  fi
fi
