// CUDA kernels of the fused advantages op. Torch-free: CUB and the CUDA runtime only, so this file
// compiles with bare nvcc (see launch.h for the extern "C" entry point).
//
// Size buckets, by the launch's bound on the group size (a host-side hint, guards.h):
//   * n <= 16:   one thread per group (thread_kernel<8 or 16>): the lane executor of the CPU
//                kernel's small-group path (lane_exec.h), the group in registers, an odd-even merge
//                network on the float rewards with their indices (float64: on (key, index) pairs);
//                the samples staged through a shared-memory tile (coalesced copies in and out);
//                one instantiation per set of calls (LaneCalls below), so that the lighter calls
//                hold fewer registers and get more warps per SM; every launch but one (below)
//                starts with it;
//   * n <= 32:   float32 rewards and a call a wide lane takes (grpo; maxk, pass@k, maxk_loo1
//                from a bank: kWide; maxk_offpolicy from a bank: kWideOffPolicy):
//                thread_kernel<32> for all the groups of the launch, its inputs in float arrays;
//                otherwise thread_kernel<16>, then the segment executor for the groups of
//                17..32 samples (segment_exec.h): 2 lanes per group, 16 ranks per lane in
//                registers, each lane's slots sorted by the odd-even network and merged across
//                lanes by shuffles, the lane executor's serial scans carried across lanes;
//   * n <= 64:   float32 rewards and a kWide or kWideOffPolicy call: the segment kernel below
//                (4 lanes) first, for every group of fewer than 64 samples, then thread_kernel<64>
//                for the groups of exactly 64 (every group of a [G, 64] batch; packed sort words,
//                as at 32, and the bank's block for 64 staged in shared memory; off-policy, the
//                deltas and their prefix sums in shared-memory lines, thread_group_lines);
//                otherwise as below, with 4 lanes;
//   * n <= 512:  the same with 4, 8, 16 or 32 lanes per group (segment_kernel<P>, 16 P samples);
//                the segment kernel is instantiated per set of calls too (kAll and the float sets)
//                and stages its samples through a shared-memory tile as well;
//   * n <= 4096: the block executor, one block per group of more than 16 (256 threads up to 2048
//                samples, 512 above): cub::BlockRadixSort (over the key bits the dtype can set up
//                to 2048 samples: 9 passes for float32 and narrower, 16 for double),
//                then per-thread serial scans over ITEMS consecutive ranks combined across threads
//                with shuffles and a tiny shared array of warp totals (one word per warp).
// Weight tables: a linear estimator reads the call's table bank when it has one (built once per
// call on the host, cached); the others build their table per group.
// Safety with check_inputs=False (guards.h): every group is classified from its offsets before any
// read (malformed or larger than the launch's bound: NaN-filled inside the output, nothing read);
// a group with a NaN/inf reward (or delta) is NaN-filled by source index; every store goes
// to base + a source index < n, never to a position derived from the sort alone.
// The per-group mathematics is bk::compute_group (group_math.h), shared with the CPU kernel.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdio.h>

#include <utility>

#include <cub/block/block_radix_sort.cuh>

#include "bonkernels/common.h"
#include "bonkernels/group_math.h"
#include "bonkernels/lane_exec.h"
#include "bonkernels/segment_exec.h"
#include "cuda/guards.h"
#include "cuda/launch.h"

namespace bk {
namespace cuda {

// Static-analysis builds only (bench/static_kernels.py; never set by setup.py, CMake or CI): with
// -DBK_STATIC_ESTIMATOR_CODE=<code> the kernels take that estimator code instead of p.code (and
// with -DBK_STATIC_FP32 the float32 element type and no table bank, or with -DBK_STATIC_BANKED
// too, always a bank: the tables a single-k call reads when the host passes one), so the compiler drops every
// other branch and the SASS holds one estimator's path. Undefined (every real build): no effect.
#if defined(BK_STATIC_ESTIMATOR_CODE) || defined(BK_STATIC_FP32)
#define BK_STATIC_SPECIALISE(dtype, p) bk_static_specialise(dtype, p)
__device__ __forceinline__ void bk_static_specialise(int& dtype, Params& p) {
#if defined(BK_STATIC_ESTIMATOR_CODE)
  p.code = BK_STATIC_ESTIMATOR_CODE;
#endif
#if defined(BK_STATIC_FP32) && !defined(BK_STATIC_BANKED)
  p.bank = nullptr;
#endif
#if defined(BK_STATIC_FP32)
  dtype = BK_FLOAT32;
#endif
}
#else
#define BK_STATIC_SPECIALISE(dtype, p) ((void)0)
#endif
// Analysis only as well: -DBK_STATIC_FULL_GROUPS keeps only the path for groups that fill their
// slots, in the small-group kernel and the segment kernel's float sets (the [G, n] batches the
// estimate models).
#if defined(BK_STATIC_FULL_GROUPS)
constexpr bool kStaticFullGroups = true;
#else
constexpr bool kStaticFullGroups = false;
#endif

// ----------------------------------------------------------------------------- element access

__device__ __forceinline__ double load_value(int dtype, const void* p, int64_t i) {
  switch (dtype) {
    case BK_FLOAT32: return double(static_cast<const float*>(p)[i]);
    case BK_FLOAT64: return static_cast<const double*>(p)[i];
    case BK_FLOAT16: return double(__half2float(static_cast<const __half*>(p)[i]));
    default: return double(__bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]));
  }
}

// A value already rounded to float, into a float32/float16/bfloat16 output.
__device__ __forceinline__ void store_rounded(int dtype, void* p, int64_t i, float f) {
  switch (dtype) {
    case BK_FLOAT32: static_cast<float*>(p)[i] = f; break;
    case BK_FLOAT16: static_cast<__half*>(p)[i] = __float2half_rn(f); break;
    default: static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(f); break;
  }
}

// One rounding per output; half/bfloat16 go through float, as torch's own casts do.
__device__ __forceinline__ void store_value(int dtype, void* p, int64_t i, double v) {
  switch (dtype) {
    case BK_FLOAT32: static_cast<float*>(p)[i] = float(v); break;
    case BK_FLOAT64: static_cast<double*>(p)[i] = v; break;
    case BK_FLOAT16: static_cast<__half*>(p)[i] = __float2half_rn(float(v)); break;
    default: static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(float(v)); break;
  }
}

__device__ __forceinline__ double round_to_dtype(int dtype, double v) {
  switch (dtype) {
    case BK_FLOAT32: return double(float(v));
    case BK_FLOAT64: return v;
    case BK_FLOAT16: return double(__half2float(__float2half_rn(float(v))));
    default: return double(__bfloat162float(__float2bfloat16_rn(float(v))));
  }
}

// The clamped delta of one sample, clamped in the input dtype as the reference does (NaN when not finite).
__device__ __forceinline__ double clamp_delta(int dtype, double dl, const Params& p) {
  // A non-finite delta poisons its group (the NaN contract); the clamp must not hide it.
  if (!isfinite(dl)) return BK_NAN;
  if (p.has_clamp) {
    dl = dl < -p.clamp_delta ? -p.clamp_delta : (dl > p.clamp_delta ? p.clamp_delta : dl);
    dl = round_to_dtype(dtype, dl);
  }
  return dl;
}
__device__ __forceinline__ double load_delta(int dtype, const void* deltas, int64_t i, const Params& p) {
  return clamp_delta(dtype, load_value(dtype, deltas, i), p);
}
// clamp_delta of a delta from a tile (float32, float16, bfloat16), in single precision
// (guards.h's clamp_float_delta); the bounds are the same for every sample, so nvcc computes them once.
__device__ __forceinline__ double clamp_tile_delta(int dtype, float d, const Params& p) {
  return clamp_float_delta(d, p.has_clamp != 0, float(round_to_dtype(dtype, -p.clamp_delta)),
                           float(round_to_dtype(dtype, p.clamp_delta)));
}

// One thread's part of a tile copy (guards.h TileCopy) in kRounds unrolled rounds of step kStep:
// move(i, slot) for each position i = first + r * kStep below len, slot its tile slot
// (copy_round_slot). Each round's load, store and slot are constant offsets from the first, and
// the rounds' loads can all be in flight at once. kRounds must cover the thread's positions
// (host-tested: W or 16 items a thread).
template <int kRounds, int kStep, class Move, int kLineBits = 5>
__device__ __forceinline__ void copy_rounds(const TileCopy& c, Move move) {
  const int slot0 = tile_slot(c.at + c.first, kLineBits);
  const int left = c.len - c.first;  // one compare with a constant per round
  BK_UNROLL
  for (int r = 0; r < kRounds; ++r)
    if (r * kStep < left) move(c.first + r * kStep, copy_round_slot(slot0, r, kStep, kLineBits));
}

// A kernel's copy: the whole block's span strides by the block (kBlockStep), a group's own copy by
// kOwnStep (1 or P): the steps thread_copy and segment_copy (guards.h) give; kLineBits: the tile's
// lines (tile_slot).
template <int kRounds, int kBlockStep, int kOwnStep, int kLineBits = 5, class Move>
__device__ __forceinline__ void copy_tile(bool whole_block, const TileCopy& c, Move move) {
  if (whole_block) copy_rounds<kRounds, kBlockStep, Move, kLineBits>(c, move);
  else copy_rounds<kRounds, kOwnStep, Move, kLineBits>(c, move);
}

// ----------------------------------------------------------------------------- shuffles of scan values

__device__ __forceinline__ double shfl_up(unsigned mask, double v, int d, int w) { return __shfl_up_sync(mask, v, d, w); }
__device__ __forceinline__ double shfl_down(unsigned mask, double v, int d, int w) { return __shfl_down_sync(mask, v, d, w); }
__device__ __forceinline__ double shfl_xor(unsigned mask, double v, int d, int w) { return __shfl_xor_sync(mask, v, d, w); }
template <int M>
__device__ __forceinline__ DVec<M> shfl_up(unsigned mask, const DVec<M>& v, int d, int w) {
  DVec<M> r;
  BK_UNROLL
  for (int i = 0; i < M; ++i) r.v[i] = __shfl_up_sync(mask, v.v[i], d, w);
  return r;
}
template <int M>
__device__ __forceinline__ DVec<M> shfl_down(unsigned mask, const DVec<M>& v, int d, int w) {
  DVec<M> r;
  BK_UNROLL
  for (int i = 0; i < M; ++i) r.v[i] = __shfl_down_sync(mask, v.v[i], d, w);
  return r;
}
template <int M>
__device__ __forceinline__ DVec<M> shfl_xor(unsigned mask, const DVec<M>& v, int d, int w) {
  DVec<M> r;
  BK_UNROLL
  for (int i = 0; i < M; ++i) r.v[i] = __shfl_xor_sync(mask, v.v[i], d, w);
  return r;
}

// Inclusive scan over the W lanes of a segment (reverse: from the last lane down).
template <int W, class T, class Op>
__device__ __forceinline__ T segment_inclusive_scan(unsigned mask, int lane, bool reverse, T v, T id, Op op) {
  BK_UNROLL
  for (int off = 1; off < W; off <<= 1) {
    const T o = reverse ? shfl_down(mask, v, off, W) : shfl_up(mask, v, off, W);
    const bool has = reverse ? (lane + off < W) : (lane >= off);
    if (has) v = op(o, v);
  }
  return v;
}

template <int W, class T>
__device__ __forceinline__ T segment_shift(unsigned mask, int lane, bool reverse, T v, T id) {
  const T o = reverse ? shfl_down(mask, v, 1, W) : shfl_up(mask, v, 1, W);
  const bool has = reverse ? (lane + 1 < W) : (lane >= 1);
  return has ? o : id;
}

// NaN into out[lo, hi) (a span from classify_group: inside the output), `step` threads from `first`.
// A cold path (malformed or oversized groups only): a plain loop, not unrolled, so its code stays
// small.
__device__ __forceinline__ void nan_fill(int dtype, void* out, int64_t lo, int64_t hi, int first, int step) {
#pragma unroll 1
  for (int64_t i = lo + first; i < hi; i += step) store_value(dtype, out, i, BK_NAN);
}

// ----------------------------------------------------------------------------- one copy per estimator

// f(q), q = p with its code the compile-time constant kCode, when the set C takes kCode and the
// call is kCode's; false otherwise (and no copy of f's code is compiled for a code outside C).
template <LaneCalls C, int kCode, class F>
__device__ __forceinline__ bool call_with_code(const Params& p, F& f) {
  if constexpr (lane_code(C, kCode, true) < 0) {
    return false;
  } else {
    if (p.code != kCode) return false;
    Params q = p;
    q.code = kCode;
    f(q);
    return true;
  }
}

template <LaneCalls C, class F, int... kCodes>
__device__ __forceinline__ bool call_by_code(const Params& p, F& f, std::integer_sequence<int, kCodes...>) {
  return (call_with_code<C, kCodes>(p, f) || ...);
}

// f(q) on one copy of f's code per estimator the set C takes, each with its code a constant: a
// kernel holds the registers of its heaviest branch, and one copy for several estimators holds
// more than any of them alone. False when C does not take the call (the launcher sends none).
template <LaneCalls C, class F>
__device__ __forceinline__ bool call_per_code(const Params& p, F f) {
  return call_by_code<C>(p, f, std::make_integer_sequence<int, NUM_CODES>{});
}

// ----------------------------------------------------------------------------- segment kernel

// The lanes of a warp segment as segment_exec.h's Team: shuffles among the segment's P lanes.
template <class T>
__device__ __forceinline__ T shfl_idx(unsigned mask, const T& v, int src, int w) {
  return __shfl_sync(mask, v, src, w);
}
template <int M>
__device__ __forceinline__ DVec<M> shfl_idx(unsigned mask, const DVec<M>& v, int src, int w) {
  DVec<M> r;
  BK_UNROLL
  for (int i = 0; i < M; ++i) r.v[i] = __shfl_sync(mask, v.v[i], src, w);
  return r;
}

template <int P>
struct WarpTeam {
  int lane;       // within the segment
  unsigned mask;  // the segment's lanes
  template <class T>
  __device__ __forceinline__ T take(const T& v, int src) const {
    return shfl_idx(mask, v, src, P);
  }
  __device__ __forceinline__ bool any(bool b) const { return __any_sync(mask, b) != 0; }
};

// Where a segment group's samples are read and its results written: the block's shared-memory
// tile for float32, float16 and bfloat16 (exact as floats), the tensors for float64.
struct SegmentSamples {
  int dtype;
  bool in_tile;
  const void* values;
  const void* deltas;
  void* out;
  int64_t lo;               // the group's first sample in the tensors
  float* tile;
  const float* delta_tile;  // the deltas' tile (off-policy calls)
  int at;                   // the group's first tile position (before tile_slot)
  __device__ __forceinline__ double value(int i) const {
    return in_tile ? double(tile[tile_slot(at + i)]) : load_value(dtype, values, lo + i);
  }
  __device__ __forceinline__ double delta(int i, const Params& p) const {
    return in_tile ? clamp_tile_delta(dtype, delta_tile[tile_slot(at + i)], p) : load_delta(dtype, deltas, lo + i, p);
  }
  // One rounding per output, as store_value: the tile's float goes to float16 or bfloat16 on the
  // way out, as store_value's conversion goes through float.
  __device__ __forceinline__ void store(int i, double v) const {
    if (in_tile) tile[tile_slot(at + i)] = float(v);
    else store_value(dtype, out, lo + i, v);
  }
};

// Final values to the group's samples by source index, clipped on the way as the small-group
// kernel's OutputSink clips them (kClipsOnStore: a tile's value in single precision after the
// rounding to float, clip_rounded in guards.h; float64 in double). C: the calls of the kernel's
// instantiation (LaneCalls); kFull: the group fills the segment, so every slot holds a sample.
template <LaneCalls C, bool kFull>
struct SegmentSink {
  static constexpr LaneCalls kCalls = C;
  static constexpr bool kClipsOnStore = true;
  int idx[kSegmentItems];  // source index (within the group) of each slot, from the sort
  int n;
  int first;
  float lo, hi;  // the clip bounds rounded to float (the tile's stores)
  const Params* p;
  SegmentSamples io;
  __device__ __forceinline__ void operator()(int s, double v) {
    // compute_group emits valid slots only, and the sort leaves every sample's index below n
    // (host-tested): the min keeps even a broken sort inside its group, without a branch.
    const int i = kFull ? idx[s] : min(idx[s], n - 1);
    io.store(i, io.in_tile ? double(clip_rounded(float(v), lo, hi)) : clip_value(*p, v));  // (a float: exact)
  }
};

// Loads the lane's slots as keys of type K (+inf past n) and sorts the segment (when `sort`).
// False on every lane, with nothing sorted, when a reward of the group is NaN or inf: the caller
// NaN-fills the group by source index (the NaN contract; the sort needs finite keys).
template <int P, class K, class Ex>
__device__ __forceinline__ bool segment_load_sorted(bool sort, Ex& ex, typename Ex::Vec& x) {
  constexpr int I = kSegmentItems;
  K key[I];
  bool bad = false;
  BK_UNROLL
  for (int s = 0; s < I; ++s) {
    const int i = ex.first + s;
    const double v = ex.valid(s) ? ex.sink.io.value(i) : BK_INF;
    bad = bad || (ex.valid(s) && !finite_value(v));
    key[s] = K(v);
    ex.sink.idx[s] = i;
  }
  if (ex.team.any(bad)) return false;
  if (sort) segment_sort<P, I>(ex.team, key, ex.sink.idx);
  BK_UNROLL
  for (int s = 0; s < I; ++s) x[s] = double(key[s]);
  return true;
}

// NaN into the lane's samples of a group of n (by position: every sample of the group once).
__device__ __forceinline__ void segment_nan_fill(const SegmentSamples& io, int n, int lane) {
  BK_UNROLL
  for (int s = 0; s < kSegmentItems; ++s)
    if (lane * kSegmentItems + s < n) io.store(lane * kSegmentItems + s, BK_NAN);
}

// One group of n <= P * 16 samples on a segment of P lanes (kFull: n == P * 16, the size a
// compile-time constant); C: the calls of the kernel's instantiation.
template <int P, LaneCalls C, bool kFull>
__device__ __forceinline__ void segment_group(const SegmentSamples& io, const Params& p, int n, int lane,
                                              unsigned mask) {
  constexpr int I = kSegmentItems;
  using Ex = SegmentExec<P, I, WarpTeam<P>, SegmentSink<C, kFull>, kFull>;
  Ex ex;
  ex.set_size(n);
  ex.first = lane * I;
  ex.team.lane = lane;
  ex.team.mask = mask;
  ex.sink.n = ex.n;
  ex.sink.first = ex.first;
  ex.sink.lo = float(p.clip_lo);
  ex.sink.hi = float(p.clip_hi);
  ex.sink.p = &p;
  ex.sink.io = io;
  typename Ex::Vec x, delta;
  const bool sort = C != LaneCalls::kCentred && !order_free(p.code);
  bool loaded;
  if constexpr (lane_arrays_in_float(C))  // float32 rewards only
    loaded = segment_load_sorted<P, float>(sort, ex, x);
  else
    loaded = io.dtype == BK_FLOAT64 ? segment_load_sorted<P, double>(sort, ex, x)
                                    : segment_load_sorted<P, float>(sort, ex, x);
  if (!loaded) {
    segment_nan_fill(io, n, lane);
    return;
  }
  const bool off_policy = lane_takes_deltas(C) && needs_deltas(p.code) && io.deltas != nullptr;
  BK_UNROLL
  for (int s = 0; s < I; ++s)  // a non-finite delta makes compute_group NaN-fill the group
    delta[s] = (off_policy && ex.valid(s)) ? io.delta(ex.sink.idx[s], p) : 0.0;
  compute_group(ex, p, x, delta);
}

// Whether an instantiation's copies come in two sizes, as the small-group kernel's: a group that
// fills the segment (the usual [G, n] batch with n = 32, 64, ..., 512) then runs with the size a
// compile-time constant and no slot masked. kCentred: about half the instructions per sample
// (sm_90, grpo at n = 64: 132 -> 70) for 92-96 registers instead of 74-80 (5 blocks, not 6).
// kWide has one size: its full copy needs about 158 registers, 3 blocks instead of 4, so a
// quarter fewer warps for paths a quarter shorter; only a GPU can say whether that pays in this
// latency-bound kernel.
constexpr bool segment_full_copy(LaneCalls C) { return C == LaneCalls::kCentred; }

// segment_group as call_per_code's body (a functor: nvcc did not inline a lambda there, and the
// call cost registers and spills).
template <int P, LaneCalls C>
struct SegmentGroupBody {
  const SegmentSamples& io;
  int n;
  int lane;
  unsigned mask;
  __device__ __forceinline__ void operator()(const Params& q) const {
    if (segment_full_copy(C) && (kStaticFullGroups || n == P * kSegmentItems))
      segment_group<P, C, true>(io, q, n, lane, mask);
    else
      segment_group<P, C, false>(io, q, n, lane, mask);
  }
};

// Blocks of the segment kernel an SM must hold at once (the compiler fits the registers to it).
// kAll takes the compiler's choice (2 blocks). The float sets, one copy per estimator, need fewer
// registers: kWide fits 4 blocks (124-126 registers), kCentred 5 (92-96 with its copy for full
// groups, which spills at 6 blocks on sm_80 and sm_90), kWideOffPolicy 3 (166 on sm_90; it spills
// 20-28 bytes at 4).
template <LaneCalls C>
constexpr int segment_kernel_min_blocks() {
  switch (C) {
    case LaneCalls::kCentred: return 5;
    case LaneCalls::kWide: return 4;
    case LaneCalls::kWideOffPolicy: return 3;
    default: return 1;
  }
}

constexpr int kSegmentBlock = 128;

// P lanes per group of up to P * 16 samples (segment_exec.h): each lane holds 16 consecutive ranks
// in registers and runs the lane executor's serial code over them; sort merges and scan carries
// cross lanes by shuffles. C: the calls of the instantiation, as for the small-group kernel: kAll
// for every call, and the float sets kCentred, kWide and kWideOffPolicy with their inputs in float
// and one copy of the group's code per estimator (sm_90: kAll about 238 registers, 8 warps per SM;
// kWideOffPolicy 166, 12 warps; kWide about 126, 16 warps; kCentred 92-96, 20 warps).
// float32, float16 and bfloat16 go through a shared-memory tile, as in the small-group kernel: a
// block whose groups all run here (sizes in (n_lo, cap], well formed: the usual [G, n] batch)
// copies its span in and out with coalesced accesses; in any other block each segment copies its
// own group to and from its 16 P slots. Without the tile each lane read and wrote 16 samples of its
// own, and every warp-wide access touched 32 cache lines. float64 works on the tensors directly.
template <int P, LaneCalls C>
__global__ void __launch_bounds__(kSegmentBlock, (segment_kernel_min_blocks<C>()))
    segment_kernel(int dtype, const void* __restrict__ values, const int64_t* __restrict__ offsets,
                   const void* __restrict__ deltas, void* __restrict__ out, int64_t num_groups, int64_t total,
                   Params p, int n_lo, int n_hi) {
  BK_STATIC_SPECIALISE(dtype, p);
  if constexpr (lane_arrays_in_float(C)) dtype = BK_FLOAT32;  // (the launcher sends float32 only)
  constexpr int cap = P * kSegmentItems;
  constexpr int kGroups = kSegmentBlock / P;  // groups per block
  const int64_t g0 = int64_t(blockIdx.x) * kGroups;
  const int64_t g = g0 + threadIdx.x / P;
  const bool live = g < num_groups;  // uniform per segment
  const int lane32 = threadIdx.x & 31;
  const int lane = lane32 % P;
  const unsigned mask = (P == 32) ? 0xffffffffu : (((1u << P) - 1u) << (lane32 - lane));
  // Sizes (n_lo, n_hi] (bucket_group): mostly the launch's second kernel (n_lo = 16, n_hi = cap),
  // after the small-group kernel has NaN-filled the malformed and oversized groups; for the kWide
  // calls at cap 64 the first (n_lo = 0, n_hi = 63), which NaN-fills them itself.
  const int64_t begin = live ? offsets[g] : 0, end = live ? offsets[g + 1] : 0;
  const GroupSpan span = live ? bucket_group(begin, end, total, n_lo, n_hi, cap) : GroupSpan{0, 0, GROUP_SKIP};
  const bool compute = span.action == GROUP_COMPUTE;  // uniform per segment
  const int n = int(span.hi - span.lo);

  constexpr int kTile = kSegmentBlock * kSegmentItems;
  __shared__ float tile[tile_slot(kTile - 1) + 1];
  constexpr bool kDeltaTile = lane_takes_deltas(C);
  __shared__ float delta_tile[kDeltaTile ? tile_slot(kTile - 1) + 1 : 1];
  const bool stage_deltas = kDeltaTile && needs_deltas(p.code) && deltas != nullptr;
  const bool in_tile = lane_arrays_in_float(C) || dtype != BK_FLOAT64;  // uniform
  const bool whole_block = __syncthreads_and(!live || segment_tile_fits(begin, end, total, n_lo, n_hi));
  // The copied span: the block's (coalesced, every thread) or the segment's own group (its lanes).
  const int64_t block_lo = whole_block ? offsets[g0] : 0;
  const int64_t block_hi = whole_block ? offsets[num_groups - g0 < kGroups ? num_groups : g0 + kGroups] : 0;
  const TileCopy copy =
      segment_copy(in_tile, whole_block, block_lo, block_hi, span, compute, threadIdx.x, P, kSegmentItems, kSegmentBlock);
  const auto copy_in = [&](int i, int slot) {
    tile[slot] = float(load_value(dtype, values, copy.lo + i));
    if (stage_deltas) delta_tile[slot] = float(load_value(dtype, deltas, copy.lo + i));
  };
  // A group to NaN-fill (first kernel only) keeps its block off the tile: its lanes write it.
  if (span.action == GROUP_NAN_FILL) nan_fill(dtype, out, span.lo, span.hi, lane, P);
  copy_tile<kSegmentItems, kSegmentBlock, P>(whole_block, copy, copy_in);
  if (whole_block) __syncthreads();
  else __syncwarp(mask);
  if (compute) {
    const SegmentSamples io{dtype, in_tile, values, deltas, out, span.lo, tile, delta_tile,
                            int(copy.at + span.lo - copy.lo)};
    // One variant for every size: a second one with the size a compile-time constant (as the
    // small-group kernel has) pushes the all-estimator build past 255 registers (spills).
    if constexpr (lane_arrays_in_float(C)) {
      const bool done = call_per_code<C>(p, SegmentGroupBody<P, C>{io, n, lane, mask});
      if (!done) segment_nan_fill(io, n, lane);  // (the launcher sends no other call)
    } else {
      segment_group<P, C, false>(io, p, n, lane, mask);
    }
  }
  const auto copy_out = [&](int i, int slot) { store_rounded(dtype, out, copy.lo + i, tile[slot]); };
  if (whole_block) __syncthreads();
  else __syncwarp(mask);
  copy_tile<kSegmentItems, kSegmentBlock, P>(whole_block, copy, copy_out);
}

// ----------------------------------------------------------------------------- block executor

template <int BLOCK>
struct BlockScratch {
  static constexpr int kWarps = BLOCK / 32;
  double warp_totals[kWarps * 4];  // room for a DVec<4> per warp
};

template <class T>
struct Words;
template <>
struct Words<double> {
  static constexpr int n = 1;
  __device__ static void put(double* s, const double& v) { s[0] = v; }
  __device__ static double get(const double* s) { return s[0]; }
};
template <int M>
struct Words<DVec<M>> {
  static constexpr int n = M;
  __device__ static void put(double* s, const DVec<M>& v) {
    BK_UNROLL
    for (int i = 0; i < M; ++i) s[i] = v.v[i];
  }
  __device__ static DVec<M> get(const double* s) {
    DVec<M> r;
    BK_UNROLL
    for (int i = 0; i < M; ++i) r.v[i] = s[i];
    return r;
  }
};

// One group per block of BLOCK threads; thread t holds ranks t*ITEMS + 1 .. t*ITEMS + ITEMS.
template <int BLOCK, int ITEMS>
struct BlockExec {
  static constexpr int kWarps = BLOCK / 32;
  using Vec = SlotArray<double, ITEMS>;
  int n;
  int first;  // 0-based rank of this thread's item 0
  int idx[ITEMS];
  int64_t base;
  void* out;
  int dtype;
  BlockScratch<BLOCK>* scratch;

  __device__ __forceinline__ void alloc(Vec&) {}

  template <class F>
  __device__ __forceinline__ void for_each(F f) {
    BK_UNROLL
    for (int s = 0; s < ITEMS; ++s)
      if (first + s < n) f(s, first + s + 1);
  }

  // Exclusive scan, in rank order (reverse: from the top rank down). Two passes over the thread's
  // items (lane_exec.h's fold_slots, then walk_slots from the carry; term is cheap and
  // recomputed) so no per-item partial sums are kept in registers.
  template <class T, class Op, class Term, class Consume>
  __device__ __forceinline__ void scan(bool reverse, T id, Op op, Term term, Consume consume) {
    const T total = fold_slots<ITEMS>(first, n, id, op, term);
    walk_slots<ITEMS>(first, n, reverse, thread_exclusive(reverse, total, id, op), op, term, consume);
  }

  // Fold of the thread totals before this thread (after it when reverse).
  template <class T, class Op>
  __device__ __forceinline__ T thread_exclusive(bool reverse, T v, T id, Op op) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const T inc = segment_inclusive_scan<32>(0xffffffffu, lane, reverse, v, id, op);
    const T exc = segment_shift<32>(0xffffffffu, lane, reverse, inc, id);
    __syncthreads();  // the previous user of the scratch is done
    if (lane == (reverse ? 0 : 31)) Words<T>::put(scratch->warp_totals + warp * Words<T>::n, inc);
    __syncthreads();
    T offset = id;
    for (int w = 0; w < kWarps; ++w)
      if (reverse ? (w > warp) : (w < warp)) offset = op(offset, Words<T>::get(scratch->warp_totals + w * Words<T>::n));
    return op(offset, exc);
  }

  template <class T, class Op, class Term>
  __device__ __forceinline__ T reduce(T id, Op op, Term term) {
    T r = fold_slots<ITEMS>(first, n, id, op, term);
    BK_UNROLL
    for (int off = 16; off >= 1; off >>= 1) r = op(r, shfl_xor(0xffffffffu, r, off, 32));
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) Words<T>::put(scratch->warp_totals + warp * Words<T>::n, r);
    __syncthreads();
    T all = id;
    for (int w = 0; w < kWarps; ++w) all = op(all, Words<T>::get(scratch->warp_totals + w * Words<T>::n));
    return all;  // same order on every thread: identical values everywhere
  }

  template <class Pred>
  __device__ __forceinline__ bool any(Pred pred) {
    int mine = 0;
    BK_UNROLL
    for (int s = 0; s < ITEMS; ++s) mine |= (first + s < n && pred(s, first + s + 1)) ? 1 : 0;
    return __syncthreads_or(mine) != 0;
  }

  __device__ __forceinline__ void weights(int N, int K, Vec& at) { weights_by_scan<BlockExec, false>(*this, N, K, at, at); }
  __device__ __forceinline__ void weights2(int N, int K, Vec& at, Vec& prev) {
    weights_by_scan<BlockExec, true>(*this, N, K, at, prev);
  }
  template <class Body>
  __device__ __forceinline__ bool tables(const Params& p, int code, int k, Body body) {
    return with_tables(*this, p, code, k, body);
  }

  __device__ __forceinline__ void emit(int s, double v) {
    if (max(first + s, idx[s]) < n) store_value(dtype, out, base + idx[s], v);  // idx: the source index, < n
  }
};

// The lowest key bit the block sort looks at for rewards narrower than double (see block_kernel),
// in blocks of up to kRadixNarrowMaxBlock threads.
constexpr int kRadixBeginBitNarrow = 29;
constexpr int kRadixNarrowMaxBlock = 256;

template <int BLOCK, int ITEMS>
__global__ void __launch_bounds__(BLOCK, 1) block_kernel(int dtype, const void* __restrict__ values,
                                                      const int64_t* __restrict__ offsets,
                                                      const void* __restrict__ deltas, void* __restrict__ out,
                                                      int64_t num_groups, int64_t total, Params p, int n_lo) {
  BK_STATIC_SPECIALISE(dtype, p);
  using Sort = cub::BlockRadixSort<double, BLOCK, ITEMS, int>;
  __shared__ union {
    typename Sort::TempStorage sort;
    BlockScratch<BLOCK> scan;
  } smem;
  const int64_t g = blockIdx.x;
  if (g >= num_groups) return;  // uniform per block
  const int64_t cap = int64_t(BLOCK) * ITEMS;
  const GroupSpan span = bucket_group(offsets[g], offsets[g + 1], total, n_lo, cap, cap);
  if (span.action != GROUP_COMPUTE) {  // uniform per block
    if (span.action == GROUP_NAN_FILL) nan_fill(dtype, out, span.lo, span.hi, threadIdx.x, BLOCK);
    return;
  }
  BlockExec<BLOCK, ITEMS> ex;
  ex.base = span.lo;
  ex.n = int(span.hi - span.lo);
  ex.out = out;
  ex.dtype = dtype;
  ex.scratch = &smem.scan;
  ex.first = threadIdx.x * ITEMS;
  // Striped, coalesced loads; the sort leaves a blocked arrangement (rank = first + s).
  double keys[ITEMS];
  bool bad = false;
  const bool check_deltas = needs_deltas(p.code) && deltas != nullptr;
  BK_UNROLL
  for (int s = 0; s < ITEMS; ++s) {
    const int i = s * BLOCK + threadIdx.x;
    keys[s] = i < ex.n ? load_value(dtype, values, ex.base + i) : BK_INF;
    bad = bad || (i < ex.n && !finite_value(keys[s]));
    if (check_deltas && i < ex.n) bad = bad || !finite_value(load_value(dtype, deltas, ex.base + i));
    ex.idx[s] = i;
  }
  // A NaN would sort past the +inf padding (radix order) and a real +inf could tie with it: such a
  // group is NaN-filled by source index instead (the NaN contract), before any sort.
  if (__syncthreads_or(bad)) {
    BK_UNROLL
    for (int s = 0; s < ITEMS; ++s) {
      const int i = s * BLOCK + threadIdx.x;
      if (i < ex.n) store_value(dtype, out, ex.base + i, BK_NAN);
    }
    return;
  }
  // A float32/float16/bfloat16 reward widened to double has its low 29 mantissa bits 0 (all 1 in
  // cub's bit image of a negative key): the order lives in the upper 35 bits, 9 passes of 4 bits
  // instead of 16.
  // Two calls with constant bit ranges (a run-time range costs registers); the 512-thread block,
  // capped at 128 registers, has none to spare for the second and sorts all bits.
  if (dtype == BK_FLOAT64 || BLOCK > kRadixNarrowMaxBlock) Sort(smem.sort).Sort(keys, ex.idx);
  else Sort(smem.sort).Sort(keys, ex.idx, kRadixBeginBitNarrow, 64);
  __syncthreads();  // the scan scratch aliases the sort storage
  typename BlockExec<BLOCK, ITEMS>::Vec x, delta;
  const bool off_policy = needs_deltas(p.code) && deltas != nullptr;
  BK_UNROLL
  for (int s = 0; s < ITEMS; ++s) {
    x[s] = keys[s];
    delta[s] = (off_policy && max(ex.first + s, ex.idx[s]) < ex.n) ? load_delta(dtype, deltas, ex.base + ex.idx[s], p)
                                                                    : 0.0;
  }
  compute_group(ex, p, x, delta);
}

// ----------------------------------------------------------------------------- small-group kernel

// Group sizes the small-group kernel takes: up to 16 for every call, up to 32 for float32 rewards
// and the LaneCalls::kWide and kWideOffPolicy calls (group_math.h), and exactly 64 for float32
// rewards and the kWide and kWideOffPolicy calls (thread_bucket_lo, guards.h). Wider than 16,
// float64 (key, index) pairs and the other estimators' extra arrays would not fit in registers; at
// 64, neither would kWideOffPolicy's deltas and their prefix sums (sm_90: about 550 bytes of
// spills), which go to shared memory there (thread_group_lines).
constexpr int kThreadKernelMax = 16;
constexpr int kThreadKernelMaxWide = 64;
static_assert(thread_bucket_lo(kThreadKernelMaxWide) == kThreadKernelMaxWide - 1,
              "guards.h's size buckets give thread_kernel<kThreadKernelMaxWide> its groups of exactly that size");

// Whether thread_kernel<W> of the set C keeps its groups' deltas and their prefix sums in
// shared-memory lines (thread_group_lines) and its tiles in dynamic shared memory.
constexpr bool thread_kernel_lines(int W, LaneCalls C) {
  return W == kThreadKernelMaxWide && C == LaneCalls::kWideOffPolicy;
}

// The small-group kernel is instantiated for sets of calls (LaneCalls, group_math.h), each with
// only its calls' code and so with the registers of its own most demanding path (a kernel holds
// the registers of its largest path, so lighter calls in their own instantiation get more warps
// per SM). The launcher picks one per call (small_group_kernel): at W = 8 and 16, kCentred for
// grpo, rloo, dr_grpo and maxrl on float32 rewards, kWide for maxk, passk and maxk_loo1 from a bank
// on float32 rewards, kWideOffPolicy for maxk_offpolicy from a bank on float32 rewards, kAll for
// the other off-policy calls and kOnPolicy for every other call; at W = 32 and 64, kWide or
// kWideOffPolicy.

// Where a thread's group lives. GlobalGroup: in the tensors (float64; index i of the group is
// element lo + i). TileGroup: float32, float16 and bfloat16 samples as floats in the block's
// shared-memory tile (tile_slot, guards.h), which the block fills from the tensors with coalesced
// loads and writes back the same way: one thread per group reading its own samples straight from
// global memory touches a new cache line per sample in every warp-wide load, about 16 times the
// L1 work of a coalesced load.
struct GlobalGroup {
  static constexpr bool kMayBeF64 = true;
  int dtype;
  const void* values;
  const void* deltas;
  void* out;
  int64_t lo;
  __device__ __forceinline__ int type() const { return dtype; }
  __device__ __forceinline__ double value(int i) const { return load_value(dtype, values, lo + i); }
  __device__ __forceinline__ double f64(int i) const { return static_cast<const double*>(values)[lo + i]; }
  __device__ __forceinline__ double delta(int i, const Params& p) const { return load_delta(dtype, deltas, lo + i, p); }
  __device__ __forceinline__ void store(int i, double v) const { store_value(dtype, out, lo + i, v); }
  __device__ __forceinline__ void store_float(int i, float f) const { store_rounded(dtype, out, lo + i, f); }
  __device__ __forceinline__ bool in_one_line(int) const { return true; }
  __device__ __forceinline__ GlobalGroup one_line() const { return *this; }
  static constexpr const double* full_bank = nullptr;  // (the tile kernels' staged block)
};

// kOneLine: the group lies in one line of the tile (tile_in_one_line, guards.h: every group of a
// [G, n] batch, n = 8, 16, 32 or 64), so sample i sits at tile_slot(base) + i: constant offsets
// from one address instead of three instructions of slot arithmetic per sample. kLineBits: the
// tile's lines (tile_slot: 32 samples, or 64 at W = 64).
template <bool kOneLine, int kLineBits = 5>
struct TileGroupAt {
  static constexpr bool kMayBeF64 = false;
  float* tile;          // rewards in, advantages out (rounded to the dtype, clipped): each thread
                        // reads and writes only its own samples
  float* deltas;  // the deltas' tile (off-policy calls)
  int base;       // the group's first tile position (before tile_slot)
  int dtype;      // of the tensors: the delta clamp rounds to it
  const double* full_bank;  // the call's bank block for groups of W samples in shared memory, or
                            // null (stage_full_bank)
  float* ranked;  // a third tile for groups of 64 off-policy (thread_group_lines), else null
  __device__ __forceinline__ int slot(int i) const {
    return kOneLine ? tile_slot(base, kLineBits) + i : tile_slot(base + i, kLineBits);
  }
  __device__ __forceinline__ int type() const { return dtype; }
  __device__ __forceinline__ double value(int i) const { return double(tile[slot(i)]); }
  __device__ __forceinline__ double f64(int) const { return 0.0; }  // never called: no float64 tile
  __device__ __forceinline__ double delta(int i, const Params& p) const { return clamp_tile_delta(dtype, deltas[slot(i)], p); }
  __device__ __forceinline__ void store(int i, double v) const { tile[slot(i)] = float(v); }
  __device__ __forceinline__ void store_float(int i, float f) const { tile[slot(i)] = f; }
  __device__ __forceinline__ bool in_one_line(int n) const { return tile_in_one_line(base, n, kLineBits); }
  __device__ __forceinline__ TileGroupAt<true, kLineBits> one_line() const {
    return {tile, deltas, base, dtype, full_bank, ranked};
  }
  // The group's line of one of the block's tiles (a group in one line: kOneLine).
  __device__ __forceinline__ float* line(float* of_tile) const { return of_tile + tile_slot(base, kLineBits); }
};
template <int kLineBits>
using TileGroup = TileGroupAt<false, kLineBits>;

// Where the lane executor's final values go on the device: to the group's output, by source index,
// clipped on the way (kClipsOnStore: in single precision after the rounding for the narrow types,
// clip_rounded in guards.h; in double for float64).
template <int W, bool kFull, LaneCalls C, class Group>
struct OutputSink {
  static constexpr bool kClipsOnStore = true;
  static constexpr LaneCalls kCalls = C;  // the calls this instantiation computes
  int idx[W];  // source index (within the group) of sorted slot s
  int n;
  Group group;
  float lo, hi;  // the clip bounds rounded to float (narrow types)
  const Params* p;
  __device__ __forceinline__ void operator()(int s, double v) {
    // Never taken: the sort is a permutation of the slots with the samples first (host-tested); a
    // full group has no padding, so every index is below W = n.
    if (!kFull && idx[s] >= n) return;
    if (Group::kMayBeF64 && group.type() == BK_FLOAT64) group.store(idx[s], clip_value(*p, v));
    else group.store_float(idx[s], clip_rounded(float(v), lo, hi));
  }
};

// Loads a group of float64 rewards into (orderable bits, index) pairs and sorts them; padding past
// n sorts last. A NaN or inf sorts too (the order is total on the bits), and compute_group then
// NaN-fills the group by slot, as it does for the narrow types.
template <int W, class Ex>
__device__ __forceinline__ void load_sorted_f64(bool sort, Ex& ex, typename Ex::Vec& x) {
  uint64_t key[W];
  BK_UNROLL
  for (int i = 0; i < W; ++i) {
    key[i] = i < ex.n ? orderable_f64(ex.sink.group.f64(i)) : ~uint64_t(0);
    ex.sink.idx[i] = i;
  }
  if (sort) lane_sort_pairs<W>(key, ex.sink.idx);
  BK_UNROLL
  for (int s = 0; s < W; ++s) x[s] = from_orderable_f64(key[s]);
}

// The narrowest lane width that sorts packed words (lane_sort_packed). sm_90, maxk_loo1 at
// W = 32: 2,037 instructions a thread with lane_sort_floats, 1,779 with the packed words when no
// rewards clash (the rare exact step's one round of code, which the static estimate counts once,
// adds 175). At W = 16 the packed words save about 50 and that round costs about 90.
constexpr int kPackedSortMinWidth = 32;

// Loads a group of float32/float16/bfloat16 rewards and sorts them (the rewards are the keys;
// padding past n is +inf): lane_sort_floats, or at W >= kPackedSortMinWidth the packed words
// (sort_finite_packed). False, with nothing sorted, when a reward is NaN or inf: the caller
// NaN-fills the group by source index (the NaN contract; the sort needs finite keys).
template <int W, class Ex>
__device__ __forceinline__ bool load_sorted_narrow(bool sort, Ex& ex, typename Ex::Vec& x) {
  float key[W];
  BK_UNROLL
  for (int i = 0; i < W; ++i) key[i] = i < ex.n ? float(ex.sink.group.value(i)) : 0.0f;
  if constexpr (W >= kPackedSortMinWidth) {
    const auto& group = ex.sink.group;
    if (!sort_finite_packed<W>(key, ex.sink.idx, ex.n, sort, [&](int i) { return float(group.value(i)); }))
      return false;
  } else {
    if (!sort_finite_floats<W>(key, ex.sink.idx, ex.n, sort)) return false;
  }
  BK_UNROLL
  for (int s = 0; s < W; ++s) x[s] = double(key[s]);
  return true;
}

// One group of n <= W samples (kFull: n == W, the size a compile-time constant); C: the calls of
// the instantiation, off_policy: the call has deltas.
template <int W, bool kFull, LaneCalls C, class Group>
__device__ __forceinline__ void thread_group(const Group& group, bool off_policy, const Params& p, int n) {
  using Ex = LaneExec<W, OutputSink<W, kFull, C, Group>, kFull>;
  Ex ex;
  if constexpr (kFull && W == kThreadKernelMaxWide) ex.staged_bank = group.full_bank;
  ex.set_size(n);
  ex.sink.n = n;
  ex.sink.group = group;
  ex.sink.lo = float(p.clip_lo);
  ex.sink.hi = float(p.clip_hi);
  ex.sink.p = &p;
  typename Ex::Vec x, delta;
  // Load and sort (the order-free estimators skip the sort). One scope per key width, so the two
  // key arrays are never live together (registers). A non-finite delta makes compute_group
  // NaN-fill the group.
  const bool sort = C != LaneCalls::kCentred && !order_free(p.code);
  bool loaded = true;
  if constexpr (!lane_arrays_in_float(C)) {
    if (Group::kMayBeF64 && group.type() == BK_FLOAT64) load_sorted_f64<W>(sort, ex, x);
    else loaded = load_sorted_narrow<W>(sort, ex, x);
  } else {
    loaded = load_sorted_narrow<W>(sort, ex, x);  // float arrays: float32 rewards only
  }
  if (!loaded) {
#pragma unroll 1  // a cold path (a NaN or inf reward), as nan_fill
    for (int i = 0; i < n; ++i) group.store(i, BK_NAN);
    return;
  }
  BK_UNROLL
  for (int s = 0; s < W; ++s)  // only kAll and kWideOffPolicy take an off-policy call
    delta[s] = (lane_takes_deltas(C) && off_policy && s < ex.n) ? group.delta(ex.sink.idx[s], p) : 0.0;
  compute_group(ex, p, x, delta);
}

// Where thread_group_lines' values go: slot s's final value, clipped and rounded to float, into
// the deltas' line at s (compute_group emits slot s after its last read there); the caller then
// scatters them to the group's source indices. The deltas' prefix sums (SumVec) take the rewards'
// line and the raw deltas' line, both free once the group is sorted and its deltas ranked. Each
// emit ends with a compiler fence (an empty asm that clobbers memory), so the reverse walk's loads
// after it read the lines: without it nvcc carried the prefix sums and ranked deltas in registers
// from the forward walk that stored them and spilled 544 bytes (sm_90); volatile lines stopped
// that too, but at two loads of each value per slot.
template <int W, LaneCalls C, class Group>
struct RankedLineSink {
  static constexpr bool kClipsOnStore = true;
  static constexpr LaneCalls kCalls = C;
  using SumVec = SplitDoubleLines;
  int idx[W];  // source index (within the group) of sorted slot s
  Group group;
  float lo, hi;  // the clip bounds rounded to float
  float* ranked;
  SplitDoubleLines prefix_lines;
  __device__ __forceinline__ void bind(SplitDoubleLines& a) const { a = prefix_lines; }
  __device__ __forceinline__ void operator()(int s, double v) {
    ranked[s] = clip_rounded(float(v), lo, hi);
    asm volatile("" ::: "memory");
  }
};

// One full group of W = 64 samples off-policy (kWideOffPolicy: maxk_offpolicy on float32), with
// only the rewards and the sort's indices in registers: the deltas in rank order (float) and their
// prefix sums (double, as two words) would need 192 more, and spilled (sm_90: about 550 bytes).
// They live in the thread's own lines of three tiles instead, reused as the group goes:
//   rewards' line:  rewards in -> (after the sort) the prefix sums' high words -> the outputs
//   deltas' line:   raw deltas -> (after ranking them) the prefix sums' low words
//   ranked line:    the clamped deltas in rank order -> each slot's output (RankedLineSink)
// The arithmetic is compute_group's on LaneExec, value for value (test_group_math).
template <int W, LaneCalls C, class Group>
__device__ __forceinline__ void thread_group_lines(const Group& group, bool off_policy, const Params& p) {
  using Ex = LaneExec<W, RankedLineSink<W, C, Group>, true>;
  Ex ex;
  ex.staged_bank = group.full_bank;
  ex.sink.group = group;
  ex.sink.lo = float(p.clip_lo);
  ex.sink.hi = float(p.clip_hi);
  float* const rewards_line = group.line(group.tile);
  float* const deltas_line = group.line(group.deltas);
  ex.sink.ranked = group.line(group.ranked);
  ex.sink.prefix_lines = SplitDoubleLines{rewards_line, deltas_line};
  typename Ex::Vec x;
  if (!load_sorted_narrow<W>(true, ex, x)) {
#pragma unroll 1  // a cold path (a NaN or inf reward), as nan_fill
    for (int i = 0; i < W; ++i) group.store(i, BK_NAN);
    return;
  }
  // Addressed from the lines (one LEA per access; through group.delta and group.store the slot
  // arithmetic took two).
  const LineArray ranked{ex.sink.ranked};  // the deltas by rank, then the outputs by rank
  BK_UNROLL
  for (int s = 0; s < W; ++s)
    ranked[s] = off_policy ? float(clamp_tile_delta(group.dtype, deltas_line[ex.sink.idx[s]], p)) : 0.0f;
  compute_group(ex, p, x, ranked);
  BK_UNROLL
  for (int s = 0; s < W; ++s) rewards_line[ex.sink.idx[s]] = ranked[s];
}

// A group that fills the W slots and lies in one line of the tile (every group of a [G, n] batch;
// the static analysis build assumes it) runs with the size a compile-time constant and constant
// tile offsets; any other group runs the general copy. At W = 64 every group is such a group
// (thread_bucket_lo, thread_tile_fits: guards.h; host-tested), and the general copy, which spilled
// (sm_90: 132-264 bytes), is not compiled.
template <int W, LaneCalls C, class Group>
__device__ __forceinline__ void thread_group_sized(const Group& group, bool off_policy, const Params& p, int n) {
  if constexpr (thread_kernel_lines(W, C)) {
    if constexpr (Group::kMayBeF64)  // never: the float sets take float32 only, in the tile
      for (int i = 0; i < n; ++i) group.store(i, BK_NAN);
    else
      thread_group_lines<W, C>(group.one_line(), off_policy, p);
  } else if constexpr (W == kThreadKernelMaxWide) {
    thread_group<W, true, C>(group.one_line(), off_policy, p, n);
  } else {
    if (kStaticFullGroups || (n == W && group.in_one_line(n))) thread_group<W, true, C>(group.one_line(), off_policy, p, n);
    else thread_group<W, false, C>(group, off_policy, p, n);
  }
}

// thread_group_sized as call_per_code's body.
template <int W, LaneCalls C, class Group>
struct ThreadGroupBody {
  const Group& group;
  bool off_policy;
  int n;
  __device__ __forceinline__ void operator()(const Params& q) const { thread_group_sized<W, C>(group, off_policy, q, n); }
};

// One group of the call. At W = 8 and 16 the float-array sets (kCentred, kWide, kWideOffPolicy)
// compile one copy of the group's code per estimator, each with its code a constant: a kernel
// holds the registers of its heaviest branch, and one copy for several estimators holds more than
// any of them alone (sm_90, W = 16: kCentred 144 registers as one copy, 94 as one per estimator;
// kWide spilled at 128 as one copy). At W = 32 one copy (the per-estimator copies would not fit
// more blocks). At W = 64 one per estimator again: one copy for maxk, passk and maxk_loo1 took all
// 255 registers and spilled (sm_90: 4.6 KB).
template <int W, LaneCalls C, class Group>
__device__ __forceinline__ void thread_group_call(const Group& group, bool off_policy, const Params& p, int n) {
  if constexpr (lane_arrays_in_float(C) && (W <= kThreadKernelMax || W == kThreadKernelMaxWide)) {
    const bool done = call_per_code<C>(p, ThreadGroupBody<W, C, Group>{group, off_policy, n});
    if (!done)  // the launcher sends no other call here; NaN, as compute_group refuses one
      for (int i = 0; i < n; ++i) group.store(i, BK_NAN);
  } else {
    thread_group_sized<W, C>(group, off_policy, p, n);
  }
}

constexpr int kThreadBlock = 128;

// Words of thread_kernel<W>'s tiles: kThreadBlock groups of W samples, in lines (tile_slot).
constexpr int thread_tile_words(int W) { return tile_slot(kThreadBlock * W - 1, tile_line_bits(W)) + 1; }

// thread_kernel<64> of kWideOffPolicy keeps three tiles (thread_group_lines) and the staged bank
// block: 102,400 bytes, over the 48 KB of static shared memory a block may declare, so it takes
// them as dynamic shared memory, tiles first and the block at kLinesBankOffset; the launcher
// raises the kernel's limit to kThreadLinesSmemBytes (2 blocks per SM on sm_90, 1 on sm_80).
constexpr int kLinesTileWords = thread_tile_words(kThreadKernelMaxWide);
constexpr int kLinesBankOffset = (3 * kLinesTileWords + 1) / 2;  // in doubles, after the tiles
constexpr int kThreadLinesSmemBytes = (kLinesBankOffset + 5 * kThreadKernelMaxWide + 1) * int(sizeof(double));
static_assert(kThreadLinesSmemBytes == 102400, "bench/static_kernels.py counts 102,400 bytes (occupancy)");
static_assert(2 * (kThreadLinesSmemBytes + 1024) <= 228 * 1024, "two blocks per SM on sm_90");

// The bank block of the groups that fill thread_kernel<W> (n = W, every group of a [G, W] batch),
// copied by the block's threads into `staged` (5 W + 1 doubles); null, with nothing copied, when
// the call has no bank or no well-formed block for W (with_tables' checks). The caller's next
// barrier publishes it. At W = 64 the lane executor then reads its tables from shared memory
// (LaneExec::staged_bank): from global memory, nvcc hoisted about 128 of those loads ahead of
// their use and spilled (sm_90, maxk_loo1: 8 bytes at 254 registers; staged: 242, none).
template <int W>
__device__ __forceinline__ const double* stage_full_bank(const Params& p, double* staged) {
  const double* block = p.bank == nullptr ? nullptr : bank_block(p, W);
  if (block == nullptr) return nullptr;
  for (int i = threadIdx.x; i < 5 * W + 1; i += blockDim.x) staged[i] = block[i];
  return staged;
}

// Blocks of the small-group kernel an SM must hold at once (the compiler fits the registers to it).
// One thread's chain of dependent steps is long and only other warps hide its latency: on an H200
// the kernel reached 22 % of copy at n = 16 with 8 warps per SM (250 registers). The on-policy
// instantiations fit 5 blocks at W = 8 (96 registers) and, on sm_90, 3 at W = 16 (168) without a
// spill (sm_80's compiler spills 8 bytes there: 2 blocks); kAll keeps the compiler's choice (2
// blocks at W = 16). The float-array sets, one copy per estimator: kCentred took 58 registers at
// W = 8 and 94 at W = 16 unbounded (8 and 5 blocks), kWide fits 8 and 4 blocks (64 and 128)
// without a spill, and spills at 3 blocks at W = 32; kWideOffPolicy fits 5, 3 and 2 blocks (it
// spills 4-20 bytes at 6 and 4 blocks at W = 8 and 16). Only the device passes read it.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
constexpr int kOnPolicyBlocksAt16 = 2;
#else
constexpr int kOnPolicyBlocksAt16 = 3;
#endif
template <int W, LaneCalls C>
constexpr int thread_kernel_min_blocks() {
  switch (C) {
    case LaneCalls::kAll: return 1;
    case LaneCalls::kCentred: return W <= 8 ? 8 : 5;
    case LaneCalls::kWide: return W <= 8 ? 8 : (W <= 16 ? 4 : 2);  // (W = 64: 2 as well)
    case LaneCalls::kWideOffPolicy: return W <= 8 ? 5 : (W <= 16 ? 3 : 2);  // (W = 64: 2, by its shared memory)
    default: return W <= 8 ? 5 : kOnPolicyBlocksAt16;
  }
}

// One thread per group of at most W samples, on the lane executor (lane_exec.h): the per-group code
// of the CPU kernel's small-group path, with the group in registers (no shuffles) and its samples in
// the block's shared-memory tile. Groups of size in (W, bound] are left to the launch's second
// kernel (size buckets, guards.h); at W = 64, the second kernel itself, it takes only the groups of
// exactly 64 (thread_bucket_lo). C: the calls the instantiation takes (LaneCalls).
template <int W, LaneCalls C>
__global__ void __launch_bounds__(kThreadBlock, (thread_kernel_min_blocks<W, C>()))
    thread_kernel(int dtype, const void* __restrict__ values, const int64_t* __restrict__ offsets,
                  const void* __restrict__ deltas, void* __restrict__ out, int64_t num_groups, int64_t total,
                  Params p, int64_t bound) {
  BK_STATIC_SPECIALISE(dtype, p);
  // Float arrays take float32 only (the launcher): a constant dtype drops the other types'
  // loads and stores from its code (registers).
  if constexpr (lane_arrays_in_float(C)) dtype = BK_FLOAT32;
  const bool off_policy = needs_deltas(p.code) && deltas != nullptr;
  const int64_t g0 = int64_t(blockIdx.x) * kThreadBlock;
  const int64_t g = g0 + threadIdx.x;
  const bool live = g < num_groups;
  const int64_t begin = live ? offsets[g] : 0, end = live ? offsets[g + 1] : 0;
  const GroupSpan span =
      live ? bucket_group(begin, end, total, thread_bucket_lo(W), W, bound) : GroupSpan{0, 0, GROUP_SKIP};

  // float32, float16 and bfloat16 go through the tile: a block whose groups are all well formed and
  // of at most W samples (at W = 64: all of 64; thread_tile_fits, guards.h) copies its span in and
  // out with coalesced accesses; any other block (malformed offsets, a group of the launch's other
  // kernel) copies each computed group to and from its thread's own W slots. float64 works on the
  // tensors directly.
  constexpr int kLineBits = tile_line_bits(W);
  constexpr int kTileWords = thread_tile_words(W);
  constexpr bool kLines = thread_kernel_lines(W, C);  // three tiles, in dynamic shared memory
  constexpr bool kDeltaTile = lane_takes_deltas(C);
  constexpr bool kStageBank = W == kThreadKernelMaxWide;
  __shared__ float static_tile[kLines ? 1 : kTileWords];
  __shared__ float static_delta_tile[kDeltaTile && !kLines ? kTileWords : 1];
  __shared__ double static_bank[kStageBank && !kLines ? 5 * W + 1 : 1];
  extern __shared__ double lines_smem[];  // kLines only: kThreadLinesSmemBytes
  float* const tile = kLines ? reinterpret_cast<float*>(lines_smem) : static_tile;
  float* const delta_tile = kLines ? tile + kTileWords : static_delta_tile;
  float* const ranked_tile = kLines ? tile + 2 * kTileWords : nullptr;
  double* const bank_block = kLines ? lines_smem + kLinesBankOffset : static_bank;
  const bool stage_deltas = kDeltaTile && off_policy;
  const double* full_bank = kStageBank ? stage_full_bank<W>(p, bank_block) : nullptr;  // (before the barrier)
  const bool whole_block = __syncthreads_and(!live || thread_tile_fits(begin, end, total, W));  // uniform
  if (dtype != BK_FLOAT64) {
    const int64_t block_lo = whole_block ? offsets[g0] : 0;
    const int64_t block_hi = whole_block ? offsets[num_groups - g0 < kThreadBlock ? num_groups : g0 + kThreadBlock] : 0;
    const TileCopy copy = thread_copy(whole_block, block_lo, block_hi, span, threadIdx.x, W, kThreadBlock);
    const auto copy_in = [&](int i, int slot) {
      tile[slot] = float(load_value(dtype, values, copy.lo + i));
      if (stage_deltas) delta_tile[slot] = float(load_value(dtype, deltas, copy.lo + i));
    };
    if (!whole_block && span.action == GROUP_NAN_FILL) nan_fill(dtype, out, span.lo, span.hi, 0, 1);
    copy_tile<W, kThreadBlock, 1, kLineBits>(whole_block, copy, copy_in);
    if (whole_block) __syncthreads();
    if (span.action == GROUP_COMPUTE)
      thread_group_call<W, C>(
          TileGroup<kLineBits>{tile, delta_tile, int(copy.at + span.lo - copy.lo), dtype, full_bank, ranked_tile}, off_policy, p,
          int(span.hi - span.lo));
    const auto copy_out = [&](int i, int slot) { store_rounded(dtype, out, copy.lo + i, tile[slot]); };
    if (whole_block) __syncthreads();
    copy_tile<W, kThreadBlock, 1, kLineBits>(whole_block, copy, copy_out);
    return;
  }
  if (span.action == GROUP_NAN_FILL) nan_fill(dtype, out, span.lo, span.hi, 0, 1);
  if (span.action != GROUP_COMPUTE) return;
  thread_group_call<W, C>(GlobalGroup{dtype, values, deltas, out, span.lo}, off_policy, p, int(span.hi - span.lo));
}

// ----------------------------------------------------------------------------- launcher

// Whether the launch's call goes to an instantiation of the set (a float set: float32 rewards).
inline bool float_lane_takes(LaneCalls calls, int dtype, const Params& p) {
  return dtype == BK_FLOAT32 && lane_takes(calls, p.code, p.bank != nullptr);
}

// The float-array set that takes the call (kCentred first: grpo is in both), or kAll for none.
inline LaneCalls float_set_of(int dtype, const Params& p) {
  if (float_lane_takes(LaneCalls::kCentred, dtype, p)) return LaneCalls::kCentred;
  if (float_lane_takes(LaneCalls::kWide, dtype, p)) return LaneCalls::kWide;
  if (float_lane_takes(LaneCalls::kWideOffPolicy, dtype, p)) return LaneCalls::kWideOffPolicy;
  return LaneCalls::kAll;
}

// Whether thread_kernel<cap> takes the calls of a float set, cap = 32 or 64: at 32 it holds every
// group of a launch bounded by cap, at 64 the groups of exactly 64 (thread_bucket_lo, guards.h).
inline bool wide_thread_takes(LaneCalls floats, int cap) {
  return (cap == 32 || cap == kThreadKernelMaxWide) && (floats == LaneCalls::kWide || floats == LaneCalls::kWideOffPolicy);
}

using ThreadKernel = void (*)(int, const void*, const int64_t*, const void*, void*, int64_t, int64_t, Params, int64_t);
template <int W>
ThreadKernel thread_kernel_for(LaneCalls calls) {
  switch (calls) {
    case LaneCalls::kCentred: return thread_kernel<W, LaneCalls::kCentred>;
    case LaneCalls::kWide: return thread_kernel<W, LaneCalls::kWide>;
    case LaneCalls::kWideOffPolicy: return thread_kernel<W, LaneCalls::kWideOffPolicy>;
    case LaneCalls::kOnPolicy: return thread_kernel<W, LaneCalls::kOnPolicy>;
    default: return thread_kernel<W, LaneCalls::kAll>;
  }
}

// The small-group kernel of a call for the launch's power-of-two bound on the group size (cap):
// thread_kernel<32> of the call's set (kWide or kWideOffPolicy), or thread_kernel<64> of kWide
// (wide_thread_takes); else W = 8 where that holds every group and 16 otherwise, of the set that
// takes the call: its float set (`floats`, float_set_of), else kOnPolicy or, with deltas, kAll.
inline ThreadKernel small_group_kernel(int cap, LaneCalls floats, const Params& p) {
  if (wide_thread_takes(floats, cap)) {
    if (cap == kThreadKernelMaxWide)
      return floats == LaneCalls::kWide ? thread_kernel<kThreadKernelMaxWide, LaneCalls::kWide>
                                        : thread_kernel<kThreadKernelMaxWide, LaneCalls::kWideOffPolicy>;
    return floats == LaneCalls::kWide ? thread_kernel<32, LaneCalls::kWide> : thread_kernel<32, LaneCalls::kWideOffPolicy>;
  }
  const LaneCalls calls = floats != LaneCalls::kAll ? floats
                          : needs_deltas(p.code)   ? LaneCalls::kAll
                                                   : LaneCalls::kOnPolicy;
  return cap == 8 ? thread_kernel_for<8>(calls) : thread_kernel_for<kThreadKernelMax>(calls);
}

// The segment kernel of P lanes per group for a call: that of its float set, else kAll's.
using SegmentKernel = void (*)(int, const void*, const int64_t*, const void*, void*, int64_t, int64_t, Params, int, int);
template <int P>
SegmentKernel segment_kernel_for(LaneCalls floats) {
  switch (floats) {
    case LaneCalls::kCentred: return segment_kernel<P, LaneCalls::kCentred>;
    case LaneCalls::kWide: return segment_kernel<P, LaneCalls::kWide>;
    case LaneCalls::kWideOffPolicy: return segment_kernel<P, LaneCalls::kWideOffPolicy>;
    default: return segment_kernel<P, LaneCalls::kAll>;
  }
}

// Blocks of kSegmentBlock threads for P lanes per group.
inline unsigned segment_blocks(int64_t num_groups, int lanes) {
  return unsigned((num_groups * lanes + kSegmentBlock - 1) / kSegmentBlock);
}

template <class Kernel, class... Extra>
cudaError_t launch_smem(Kernel kernel, unsigned blocks, unsigned threads, int smem_bytes, cudaStream_t stream,
                        int dtype, const void* values, const int64_t* offsets, const void* deltas, void* out,
                        int64_t num_groups, int64_t total, const Params& p, Extra... extra) {
  kernel<<<blocks, threads, smem_bytes, stream>>>(dtype, values, offsets, deltas, out, num_groups, total, p, extra...);
  return cudaGetLastError();
}
template <class Kernel, class... Extra>
cudaError_t launch(Kernel kernel, unsigned blocks, unsigned threads, cudaStream_t stream, Extra... args) {
  return launch_smem(kernel, blocks, threads, 0, stream, args...);
}

// Whether thread_kernel<64> of kWideOffPolicy may take its kThreadLinesSmemBytes of dynamic shared
// memory on the current device: raised once per device; false where the device allows a block
// less (e.g. 99 KB on sm_86 and sm_89), and the segment kernel then takes those groups too.
inline bool thread_lines_kernel_ready() {
  constexpr int kDevices = 64;
  static int ready[kDevices] = {};  // 0 unknown, 1 yes, -1 no
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= kDevices) {
    cudaGetLastError();
    return false;
  }
  if (ready[device] == 0) {
    const cudaError_t rc = cudaFuncSetAttribute(thread_kernel<kThreadKernelMaxWide, LaneCalls::kWideOffPolicy>,
                                                cudaFuncAttributeMaxDynamicSharedMemorySize, kThreadLinesSmemBytes);
    if (rc != cudaSuccess) cudaGetLastError();  // (not sticky: clear it)
    ready[device] = rc == cudaSuccess ? 1 : -1;
  }
  return ready[device] == 1;
}

}  // namespace cuda
}  // namespace bk

extern "C" int bk_cuda_advantages(int dtype, const void* values, const int64_t* offsets, const void* deltas, void* out,
                                  int64_t total, int64_t num_groups, int max_group_size, bk::Params params,
                                  void* stream_ptr, char* err, int errlen) {
  using namespace bk::cuda;
  cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  if (num_groups <= 0 || total <= 0) return 0;
  if (max_group_size > BK_CUDA_MAX_GROUP || max_group_size < 0) {
    if (err) snprintf(err, errlen, "max_group_size %d outside [0, %d]", max_group_size, BK_CUDA_MAX_GROUP);
    return int(cudaErrorInvalidValue);
  }
  if (num_groups > int64_t(0x7fffffff)) {
    if (err) snprintf(err, errlen, "too many groups (%lld)", (long long)num_groups);
    return int(cudaErrorInvalidValue);
  }
  const int n = max_group_size;
  const bk::LaneCalls floats = float_set_of(dtype, params);
  // Size buckets (guards.h): groups of up to 16 samples run one per thread; when the bound is
  // larger, a second kernel shaped by it takes the groups above 16 (the small ones skip it). Every
  // shape holds a power of two of samples (W, or BLOCK x ITEMS), so the bound's power of two picks it.
  // Two float sets run one thread per group above 16, kWide and kWideOffPolicy: at a bound of 32
  // thread_kernel<32> takes every group; at 64 the segment kernel takes the groups below 64 first
  // and thread_kernel<64> then those of exactly 64 (every group of a [G, 64] batch), or, where the
  // device cannot give kWideOffPolicy's instantiation its shared memory, the segment kernel takes
  // them all.
  int cap = 8;
  while (cap < n) cap *= 2;
  const unsigned thread_blocks = unsigned((num_groups + kThreadBlock - 1) / kThreadBlock);
  const unsigned groups = unsigned(num_groups);
  const int lo = kThreadKernelMax;
#define BK_ARGS stream, dtype, values, offsets, deltas, out, num_groups, total, params
  cudaError_t rc;
  const bool lines = floats == bk::LaneCalls::kWideOffPolicy;  // at 64: thread_group_lines
  if (cap == kThreadKernelMaxWide && wide_thread_takes(floats, cap)) {
    if (!lines || thread_lines_kernel_ready()) {
      rc = launch(segment_kernel_for<4>(floats), segment_blocks(num_groups, 4), kSegmentBlock, BK_ARGS, 0, cap - 1);
      if (rc == cudaSuccess)
        rc = launch_smem(small_group_kernel(cap, floats, params), thread_blocks, kThreadBlock,
                         lines ? kThreadLinesSmemBytes : 0, BK_ARGS, int64_t(cap));
    } else {  // no room for the lines: the segment kernel takes every group
      rc = launch(segment_kernel_for<4>(floats), segment_blocks(num_groups, 4), kSegmentBlock, BK_ARGS, 0, cap);
    }
  } else {
    rc = launch(small_group_kernel(cap, floats, params), thread_blocks, kThreadBlock, BK_ARGS, int64_t(cap));
    if (rc == cudaSuccess) {
      switch (cap) {
        case 8:
        case kThreadKernelMax: break;  // the small-group kernel took every group
        case 32:
          if (wide_thread_takes(floats, cap)) break;  // thread_kernel<32> took every group
          rc = launch(segment_kernel_for<2>(floats), segment_blocks(num_groups, 2), kSegmentBlock, BK_ARGS, lo, cap);
          break;
        case 64: rc = launch(segment_kernel_for<4>(floats), segment_blocks(num_groups, 4), kSegmentBlock, BK_ARGS, lo, cap); break;
        case 128: rc = launch(segment_kernel_for<8>(floats), segment_blocks(num_groups, 8), kSegmentBlock, BK_ARGS, lo, cap); break;
        case 256: rc = launch(segment_kernel_for<16>(floats), segment_blocks(num_groups, 16), kSegmentBlock, BK_ARGS, lo, cap); break;
        case 512: rc = launch(segment_kernel_for<32>(floats), segment_blocks(num_groups, 32), kSegmentBlock, BK_ARGS, lo, cap); break;
        case 1024: rc = launch(block_kernel<256, 4>, groups, 256, BK_ARGS, lo); break;
        case 2048: rc = launch(block_kernel<256, 8>, groups, 256, BK_ARGS, lo); break;
        default: rc = launch(block_kernel<512, 8>, groups, 512, BK_ARGS, lo); break;  // 4096
      }
    }
  }
#undef BK_ARGS
  if (rc != cudaSuccess && err) snprintf(err, errlen, "%s: %s", cudaGetErrorName(rc), cudaGetErrorString(rc));
  return int(rc);
}
