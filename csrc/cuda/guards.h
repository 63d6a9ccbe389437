// The safety logic of the CUDA kernels, written once for the device and the host, so the C++ tests
// (csrc/tests/test_cuda_guards.cpp) run exactly what the kernels run on adversarial inputs:
//   * classify_group: what a kernel may do with a group, from its two offsets alone (bounds and
//     the launch's size bound), before it reads any value;
//   * finite_value: the NaN/inf contract (a group with a non-finite input gives NaN everywhere);
//   * clip_rounded: the small-group kernel's clip in single precision;
//   * clamp_float_delta: the delta clamp of the kernels' shared-memory tiles, in single precision.
// Torch-free and CUDA-free (plain C++ on the host).
#pragma once

#include <stdint.h>
#include <string.h>

#include "bonkernels/common.h"

namespace bk {
namespace cuda {

// What a kernel does with one group.
enum GroupAction : int {
  GROUP_COMPUTE = 0,   // [lo, hi) is a well-formed group of at most `cap` samples
  GROUP_NAN_FILL = 1,  // write NaN to [lo, hi) and read nothing (malformed, or larger than the bound)
  GROUP_SKIP = 2,      // empty: nothing to read or write
};

struct GroupSpan {
  int64_t lo, hi;  // always 0 <= lo <= hi <= total: every index a kernel touches is inside the tensors
  int action;
};

// Group [begin, end) of a batch of `total` samples, in a launch shaped for groups of at most `cap`.
// With check_inputs=False nothing upstream validated the offsets: a malformed group (negative,
// decreasing, or past the end) is NaN-filled over the part of it that lies inside the output, and
// one larger than the launch's bound is NaN-filled whole (an undersized max_group_size hint).
// Two compares per group: the kernels pay nothing measurable for it.
BK_HD GroupSpan classify_group(int64_t begin, int64_t end, int64_t total, int64_t cap) {
  if (begin >= 0 && begin <= end && end <= total) {
    if (begin == end) return {begin, end, GROUP_SKIP};
    return {begin, end, end - begin <= cap ? GROUP_COMPUTE : GROUP_NAN_FILL};
  }
  const int64_t lo = begin < 0 ? 0 : (begin > total ? total : begin);
  int64_t hi = end < 0 ? 0 : (end > total ? total : end);
  if (hi < lo) hi = lo;
  return {lo, hi, GROUP_NAN_FILL};
}

// Size buckets: a launch may run two kernels over the batch, the small-group kernel for groups of
// at most n_small samples (one thread per group), then the kernel shaped by the launch's bound for
// the larger ones. Of a group, a kernel computes it when its size lies in (n_lo, n_hi] and skips it
// otherwise; only the first kernel (n_lo = 0) NaN-fills the malformed groups and those above the
// bound, so each output is written by exactly one kernel.
BK_HD GroupSpan bucket_group(int64_t begin, int64_t end, int64_t total, int64_t n_lo, int64_t n_hi, int64_t bound) {
  GroupSpan span = classify_group(begin, end, total, bound);
  const int64_t n = span.hi - span.lo;
  if (span.action == GROUP_COMPUTE && !(n > n_lo && n <= n_hi)) span.action = GROUP_SKIP;
  if (span.action == GROUP_NAN_FILL && n_lo > 0) span.action = GROUP_SKIP;
  return span;
}

// The small-group kernel's shared-memory tile (advantages.cu): a block of one thread per group
// copies its groups' samples, consecutive in memory, into the tile with coalesced loads, each thread
// reads and writes its own group there, and the block copies the results out the same way. Sample
// p of the block's span sits at tile_slot(p): one spare word after every line of 32 (2^line_bits),
// so the threads of a warp reading sample j of groups of 8, 16 or 32 samples each hit a different
// bank. Groups of 64 take lines of 64 (line_bits = 6, tile_line_bits): with lines of 32 the
// threads' groups would lie 66 words apart, two threads to a bank.
BK_HD constexpr int tile_slot(int p, int line_bits = 5) { return p + (p >> line_bits); }
BK_HD constexpr int tile_line_bits(int W) { return W > 32 ? 6 : 5; }

// Whether the n samples from tile position base lie in one line (no spare word among them): then
// sample i sits at tile_slot(base) + i. True for every group of W = 8, 16, 32 (or, in lines of 64,
// 64) samples at a multiple of W, as in a [G, n] batch.
BK_HD constexpr bool tile_in_one_line(int base, int n, int line_bits = 5) {
  return (base & ((1 << line_bits) - 1)) + n <= (1 << line_bits);
}

// A block takes the tile when every group of it is well formed and of at most W samples (the
// block's span is then at most blockDim * W samples); otherwise, for malformed offsets or a large
// group of the launch's second kernel, the block works on the tensors directly.
BK_HD bool tile_fits(int64_t begin, int64_t end, int64_t total, int W) {
  return begin >= 0 && begin <= end && end <= total && end - begin <= W;
}

// The segment kernel's tile (advantages.cu) likewise: a block takes it when every group of it is
// well formed and runs on that kernel (more than n_lo samples, at most n_hi), so that its copy out
// writes only the samples of groups it computed; the launch's other kernel writes the others. The
// same for thread_kernel<64>, which computes the groups of exactly 64 (thread_bucket_lo).
BK_HD bool segment_tile_fits(int64_t begin, int64_t end, int64_t total, int64_t n_lo, int n_hi) {
  return tile_fits(begin, end, total, n_hi) && end - begin > n_lo;
}

// The sizes the small-group kernel thread_kernel<W> computes are (thread_bucket_lo(W), W]: every
// size up to W, as the launch's first kernel, except at W = 64, where it takes only the groups of
// exactly 64, as the launch's second kernel (the segment kernel computes the smaller ones first).
// Such a group always runs with its size a compile-time constant and lies in one line of the tile
// (thread_tile_fits): a copy of the code for groups of fewer samples did not fit in registers.
BK_HD constexpr int64_t thread_bucket_lo(int W) { return W == 64 ? W - 1 : 0; }

// Whether a group lets thread_kernel<W>'s block take the tile: tile_fits, and at W = 64 also
// computed there (segment_tile_fits), so the block's groups are all of 64 and each lies in a line.
BK_HD bool thread_tile_fits(int64_t begin, int64_t end, int64_t total, int W) {
  const int64_t lo = thread_bucket_lo(W);
  return lo == 0 ? tile_fits(begin, end, total, W) : segment_tile_fits(begin, end, total, lo, W);
}

// What one thread copies between the tensors and its block's tile (advantages.cu): positions
// first, first + step, ... below len, tensor position lo + i at tile position at + i.
struct TileCopy {
  int64_t lo;
  int len, first, step, at;
};

// The segment kernel's copy: a block whose groups all fit (whole_block) copies its span
// [block_lo, block_hi) with every thread; in any other block each segment of P lanes copies its
// own group, when it computes one, into its own P * items slots. Nothing without the tile (float64).
BK_HD TileCopy segment_copy(bool in_tile, bool whole_block, int64_t block_lo, int64_t block_hi,
                            const GroupSpan& span, bool compute, int thread, int P, int items, int block_threads) {
  const int lane = thread % P;
  if (whole_block) return {block_lo, in_tile ? int(block_hi - block_lo) : 0, thread, block_threads, 0};
  return {span.lo, in_tile && compute ? int(span.hi - span.lo) : 0, lane, P, (thread - lane) * items};
}

// The small-group kernel's copy (float32, float16, bfloat16): the whole block's span as above, or
// in any other block the thread's own computed group into its own W slots.
BK_HD TileCopy thread_copy(bool whole_block, int64_t block_lo, int64_t block_hi, const GroupSpan& span, int thread,
                           int W, int block_threads) {
  if (whole_block) return {block_lo, int(block_hi - block_lo), thread, block_threads, 0};
  return {span.lo, span.action == GROUP_COMPUTE ? int(span.hi - span.lo) : 0, 0, 1, thread * W};
}

// The device runs a copy in a fixed number of unrolled rounds (a thread's items: W or 16) with a
// compile-time step: round r moves position first + r * step when it is below len, at tile slot
// copy_round_slot(tile_slot(at + first), r, step). That equals tile_slot(at + first + r * step)
// when (at + first) % L + (r * step) % L < L, L the line (no carry into the spare-word count),
// which holds for every copy above; the second term is then a constant of the round, so each
// round's load and store take constant offsets. Both facts are host-tested on every thread's copy.
BK_HD constexpr int copy_round_slot(int slot0, int r, int step, int line_bits = 5) {
  return slot0 + tile_slot(r * step, line_bits);
}

// False for NaN and +-inf (x - x is NaN exactly then); no library call, same on host and device.
BK_HD bool finite_value(double x) { return x - x == 0.0; }

// The clip of a float output, applied after the rounding to float: rounding to nearest is monotone,
// so clip(round(a), round(lo), round(hi)) == round(clip(a, lo, hi)) for lo <= hi (and the same
// through float for float16/bfloat16 outputs). The small-group kernel clips here, in single
// precision, where the double clip costs two double compares and four selects per sample. A NaN
// passes through (as in torch.clamp); the bounds are never NaN.
BK_HD float max_keep_nan(float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
#else
  return (a != a || a > b) ? a : b;
#endif
}
BK_HD float min_keep_nan(float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  float r;
  asm("min.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
#else
  return (a != a || a < b) ? a : b;
#endif
}
BK_HD float clip_rounded(float f, float lo, float hi) { return min_keep_nan(max_keep_nan(f, lo), hi); }

// The clamp of an off-policy delta held as a float (float32, float16 and bfloat16 deltas are exact
// as floats), against bounds already rounded to the delta's dtype: lo = round(-c), hi = round(c).
// It equals clamp_delta's clamp in double followed by the rounding, round(clamp(d, -c, c)), for
// every d of the dtype: rounding to nearest is monotone, and no value of the dtype lies strictly
// between a bound and its rounding. That costs a double clamp, a rounding through the dtype and a
// branch per sample; this, a few selects. A NaN or inf delta gives NaN (it poisons its group),
// clamped or not: d - d is +0 for a finite d and NaN otherwise, and c + c * (d - d) is then c
// exactly (the sign of a zero c kept) or NaN, one fused multiply-add where a compare and a select
// cost two.
BK_HD double clamp_float_delta(float d, bool clamp, float lo, float hi) {
  const float c = clamp ? (d < lo ? lo : (d > hi ? hi : d)) : d;
  return double(::fmaf(c, d - d, c));
}

}  // namespace cuda
}  // namespace bk
