#!/usr/bin/env bash
# Registers and spills of ONE kernel instantiation of csrc/cuda/advantages.cu, in seconds instead of
# the full compile's minutes: a copy of the file cut before its launcher, with an explicit
# instantiation of the kernel, through nvcc -ptx and ptxas -v. Its numbers are the full build's
# for that kernel (nvcc compiles each kernel on its own). For trying a change to one kernel; CI's
# check remains scripts/ci_native.sh, which compiles every kernel.
#
#   scripts/kernel_spills.sh ARCH KERNEL [DEFINE...]
#   scripts/kernel_spills.sh 90 "thread_kernel<64, LaneCalls::kWideOffPolicy>"
#   scripts/kernel_spills.sh 80 "segment_kernel<4, LaneCalls::kWide>" BK_STATIC_FP32
#
# ARCH: 80 or 90. KERNEL: thread_kernel<W, LaneCalls::...>, segment_kernel<P, LaneCalls::...> or
# block_kernel<BLOCK, ITEMS>. DEFINEs go to nvcc as -D. Prints one line: registers and spill bytes
# (ptxas -v; the cut leaves some constants unused, warning 177, silenced). Work files in
# $KERNEL_SPILLS_DIR (default: a temporary directory, removed).
set -euo pipefail
cd "$(dirname "$0")/.."

if [ $# -lt 2 ]; then
  sed -n '2,15p' "$0" >&2
  exit 2
fi
arch=$1
kernel=$2
shift 2
defines=()
for d in "$@"; do defines+=("-D$d"); done

# The kernels' trailing parameters after Params (see their definitions).
case "$kernel" in
  thread_kernel*) extra="int64_t" ;;
  segment_kernel*) extra="int, int" ;;
  block_kernel*) extra="int" ;;
  *) echo "kernel_spills: unknown kernel '$kernel'" >&2; exit 2 ;;
esac

work="${KERNEL_SPILLS_DIR:-}"
if [ -z "$work" ]; then
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
fi
mkdir -p "$work"
src="$work/one_kernel.cu"
marker='^// -* launcher$'
if ! grep -q "$marker" csrc/cuda/advantages.cu; then
  echo "kernel_spills: no '// ---- launcher' line in csrc/cuda/advantages.cu to cut at" >&2
  exit 1
fi
sed "\\#$marker#,\$d" csrc/cuda/advantages.cu > "$src"
cat >> "$src" <<EOF
}  // namespace cuda
}  // namespace bk
namespace bk {
namespace cuda {
template __global__ void $kernel(int, const void*, const int64_t*, const void*, void*, int64_t, int64_t, Params, $extra);
}  // namespace cuda
}  // namespace bk
EOF

# nvcc and ptxas of the toolkit ci_native.sh compiles with
source scripts/cuda_home.sh
if [ -z "$CUDA_HOME" ]; then
  echo "kernel_spills: nvcc not found (put the CUDA toolkit's bin on PATH or set CUDA_HOME)" >&2
  exit 2
fi
nvcc="$CUDA_HOME/bin/nvcc"
ptxas="$CUDA_HOME/bin/ptxas"

"$nvcc" -O3 -std=c++17 --expt-relaxed-constexpr -diag-suppress 177 -I csrc/include -I csrc -arch="sm_$arch" -ptx "${defines[@]}" \
  "$src" -o "$work/one_kernel.ptx"
"$ptxas" -arch="sm_$arch" -O3 -v "$work/one_kernel.ptx" -o "$work/one_kernel.cubin" > "$work/ptxas.log" 2>&1
regs=$(grep -oE 'Used [0-9]+ registers' "$work/ptxas.log" | head -1)
spills=$(grep -oE '[0-9]+ bytes spill stores, [0-9]+ bytes spill loads' "$work/ptxas.log" | head -1)
echo "sm_$arch $kernel: $regs, $spills"
