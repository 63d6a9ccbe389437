// Lane executor for compute_group (group_math.h): one thread walks one small group held in
// fixed-width arrays of W slots (W = 8, 16, ...). Every loop runs over the W slots with a
// compile-time trip count and masks the slots past n, so on the GPU (one thread per group, the
// small-group CUDA kernel) the arrays live in registers, and on the host (the CPU kernel's path for
// small groups) the compiler unrolls and vectorises them. The same per-group code runs in both
// places, so the CPU tests of the CPU kernel test the GPU's small-group path; only the sort
// differs (the CPU: lane_sort_keys for floats, sort_pairs for doubles; the GPU: lane_sort_floats,
// at W = 32 sort_finite_packed, and lane_sort_pairs; all host-tested).
//
// Weight tables: a linear estimator reads the call's bank (tables built once per call on the host
// and cached, a mixture's or one k's; group_math.h's with_tables); the others (bon_mean,
// chen_passk, bon_rlb) build d^(N,K) per group by the downward recurrence, O(n) per group.
#pragma once

#include <stdint.h>

#include "bonkernels/common.h"
#include "bonkernels/group_math.h"

namespace bk {

// The largest group the CPU kernel runs on the lane executor; the CUDA small-group kernel takes
// up to 16 samples for every call, up to 32 for float32 rewards and the LaneCalls::kWide and
// kWideOffPolicy calls, and groups of exactly 64 for float32 rewards and the kWide calls
// (kThreadKernelMax and kThreadKernelMaxWide in csrc/cuda/advantages.cu).
constexpr int kLaneWidthMax = 32;

// The serial halves of an exclusive scan over a thread's slots 0..ITEMS-1, which hold the ranks
// first + 1 .. first + ITEMS of a group of n (slot s valid when first + s < n). Every executor
// whose thread walks consecutive ranks runs them: LaneExec (first = 0, the run starting at the
// identity), SegmentExec and the CUDA block executor (the run starting at the carry from the other
// threads). kFull: every slot is valid (a group that fills the executor), so the masks fold away.
// fold_slots: op-fold of term over the valid slots, in slot order.
template <int ITEMS, bool kFull = false, class T, class Op, class Term>
BK_HD T fold_slots(int first, int n, T id, Op op, Term term) {
  T r = id;
  BK_UNROLL
  for (int s = 0; s < ITEMS; ++s)
    if (kFull || first + s < n) r = op(r, term(s, first + s + 1));
  return r;
}

// walk_slots: consume(s, j, run) at each valid slot in rank order (reverse: from the top rank
// down), run starting at `run` and folding term(s, j) after each consume.
template <int ITEMS, bool kFull = false, class T, class Op, class Term, class Consume>
BK_HD void walk_slots(int first, int n, bool reverse, T run, Op op, Term term, Consume consume) {
  if (!reverse) {
    BK_UNROLL
    for (int s = 0; s < ITEMS; ++s)
      if (kFull || first + s < n) {
        const T t = term(s, first + s + 1);
        consume(s, first + s + 1, run);
        run = op(run, t);
      }
  } else {
    BK_UNROLL
    for (int s = ITEMS - 1; s >= 0; --s)
      if (kFull || first + s < n) {
        const T t = term(s, first + s + 1);
        consume(s, first + s + 1, run);
        run = op(run, t);
      }
  }
}

// An executor's per-slot array of fixed width N (the arrays of LaneExec, SegmentExec, PackExec and
// the CUDA block executor): indices are compile-time constants in unrolled loops, so on the GPU it
// lives in registers.
template <class T, int N>
struct SlotArray {
  T v[N];
  BK_HD T& operator[](int s) { return v[s]; }
};

// Per-slot arrays kept in memory instead of registers, for a group whose arrays do not all fit in a
// thread's registers: the CUDA small-group kernel's groups of 64 off-policy (thread_kernel<64> of
// kWideOffPolicy) keep the clamped deltas and their prefix sums in the thread's own lines of its
// block's shared-memory tiles, and only the rewards and the sort's indices in registers. The host
// tests run the same types over plain memory. A line holds one 32-bit word per slot. (nvcc sees
// every line's address and may forward a value stored to a line to its later loads, holding the
// values in registers after all: the kernel's sink fences each emit against that, see
// RankedLineSink in advantages.cu.)
//
// LineArray: a float per slot (the deltas, exact in float: the set takes float32 deltas only).
struct LineArray {
  float* line;
  BK_HD float& operator[](int s) const { return line[s]; }
};

// A double per slot, split into its high and low 32-bit halves on two lines, so the value read
// back is the double written, bit for bit (the deltas' prefix sums: the same values as in a
// register array, where a float would round them).
struct SplitDoubleLines {
  float* hi;
  float* lo;
  struct Ref {
    float* hi;
    float* lo;
    BK_HD operator double() const { return bits_to_double(uint64_t(float_bits(*hi)) << 32 | float_bits(*lo)); }
    BK_HD Ref& operator=(double v) {
      const uint64_t b = double_to_bits(v);
      *hi = float_from_bits(uint32_t(b >> 32));
      *lo = float_from_bits(uint32_t(b));
      return *this;
    }
  };
  BK_HD Ref operator[](int s) const { return {hi + s, lo + s}; }
};

// Where LaneExec puts a final value: slot s of the sorted group (the caller scatters them).
template <int W>
struct SlotValues {
  double v[W];
  BK_HD void operator()(int s, double value) { v[s] = value; }
};

// The group size: a run-time n <= W, or (kFull: a group that fills the W slots, the usual case of
// [G, n] rewards) the constant W, so every `s < n` mask folds away at compile time.
template <int W, bool kFull>
struct LaneSize {
  int n = 0;
  BK_HD void set_size(int size) { n = size; }
};
template <int W>
struct LaneSize<W, true> {
  static constexpr int n = W;
  BK_HD void set_size(int) {}
};

// A sink's own array type for the values computed in the group (Sink::SumVec), else Default.
template <class Sink, class Default, class = void>
struct sink_sum_vec {
  using type = Default;
};
template <class Sink, class Default>
struct sink_sum_vec<Sink, Default, std::void_t<typename Sink::SumVec>> {
  using type = typename Sink::SumVec;
};

// Whether the sink points an array of type A at its memory (sink.bind(a)).
template <class Sink, class A, class = void>
struct sink_binds : std::false_type {};
template <class Sink, class A>
struct sink_binds<Sink, A, std::void_t<decltype(std::declval<Sink&>().bind(std::declval<A&>()))>> : std::true_type {};

template <int W, class Sink = SlotValues<W>, bool kFull = false>
struct LaneExec : LaneSize<W, kFull> {
  static constexpr bool kClipsOnStore = clips_on_store<Sink>::value;  // the sink clips (group_math.h)
  static constexpr LaneCalls kCalls = lane_calls<Sink>::value;  // the calls it computes (group_math.h)
  // The float sets (kWide, kCentred, kWideOffPolicy) hold their inputs in float: they take float32
  // rewards and deltas only (exact in float); every sum and product is still in double, and so is
  // every array of computed values (SumVec). Half the registers of a double array.
  using Elem = std::conditional_t<lane_arrays_in_float(kCalls), float, double>;
  using Vec = SlotArray<Elem, W>;
  // Values computed in the group (sum_vec_t, group_math.h): double registers, or the sink's lines
  // in memory where it has them (Sink::SumVec, bound by alloc: SplitDoubleLines).
  using SumVec = typename sink_sum_vec<Sink, SlotArray<double, W>>::type;

  using LaneSize<W, kFull>::n;  // group size, 1 <= n <= W (set_size)
  Sink sink;                    // receives emit(s, value)
  // A copy of the call's bank block for a group of n, or null (with_tables then reads the bank):
  // the CUDA kernel at W = 64 copies the block of its full groups to shared memory once per
  // thread block (in global memory, nvcc hoisted about 128 of its loads ahead and spilled).
  const double* staged_bank = nullptr;

  // Vec and a register SumVec: fixed arrays, nothing to allocate; a SumVec of the sink's lines:
  // the sink points it at them (Sink::bind).
  template <class Array>
  BK_HD void alloc(Array& a) {
    if constexpr (sink_binds<Sink, Array>::value) sink.bind(a);
  }

  template <class F>
  BK_HD void for_each(F f) {
    BK_UNROLL
    for (int s = 0; s < W; ++s)
      if (s < n) f(s, s + 1);
  }

  template <class T, class Op, class Term, class Consume>
  BK_HD void scan(bool reverse, T id, Op op, Term term, Consume consume) {
    walk_slots<W>(0, n, reverse, id, op, term, consume);
  }

  // A tree over the slots (padding slots hold the identity): depth log2(W) instead of a chain of
  // W dependent operations, and the same order on the host and the device.
  template <class T, class Op, class Term>
  BK_HD T reduce(T id, Op op, Term term) {
    T r[2 * W];  // a heap: leaves r[W + s], node t combines r[2t] and r[2t + 1]
    BK_UNROLL
    for (int s = 0; s < W; ++s) r[W + s] = s < n ? term(s, s + 1) : id;
    BK_UNROLL
    for (int t = W - 1; t >= 1; --t) r[t] = op(r[2 * t], r[2 * t + 1]);
    return r[1];
  }

  template <class Pred>
  BK_HD bool any(Pred pred) {
    bool found = false;
    BK_UNROLL
    for (int s = 0; s < W; ++s) found = found | (s < n && pred(s, s + 1));
    return found;
  }

  // d^(N,K)_j at each rank j = 1..n (prev: at j - 1), by the downward recurrence of spec 0.1 in
  // the reference's order (d_N = K/N, d_{j-1} = d_j f_j), as SerialExec's tables; N <= n here.
  BK_HD void weights(int N, int K, Vec& at) { fill_weights<false>(N, K, at, at); }
  BK_HD void weights2(int N, int K, Vec& at, Vec& prev) { fill_weights<true>(N, K, at, prev); }

  template <class Body>
  BK_HD bool tables(const Params& p, int code, int k, Body body) {
    return with_tables(*this, p, code, k, body);
  }

  BK_HD void emit(int s, double v) { sink(s, v); }

 private:
  template <bool kPrev>
  BK_HD void fill_weights(int N, int K, Vec& at, Vec& prev) {
    const double top = (N >= 1 && K >= 1) ? bk_div_moderate(double(K), double(N)) : 0.0;
    double prod = 1.0;
    BK_UNROLL
    for (int s = W - 1; s >= 0; --s) {
      const int j = s + 1;
      double v = 0.0;
      if (j <= N && N >= 1 && K >= 1) {
        v = top * prod;
        v = v > 0.0 ? v : 0.0;
        prod *= table_factor(j, N, K);
      }
      at[s] = v;
      if (kPrev && s + 1 < W) prev[s + 1] = v;  // d_j is prev at rank j + 1
    }
    if (kPrev) prev[0] = 0.0;
  }
};

// ----------------------------------------------------------------------------- sorting a lane's group

// Batcher's odd-even merge sort over W slots (W a power of two) as compile-time passes: pass (P, K)
// calls exchange(i, j) (min to i, max to j) for its pairs i < j. 63 exchanges for W = 16 and 19
// for W = 8 (a bitonic network needs 80 and 24). Templates and loops with constant bounds, so every
// slot index is a constant and the arrays stay in registers on the GPU.
template <int W, int P, int K, class Exchange>
BK_HD void odd_even_passes(Exchange& exchange) {
  BK_UNROLL
  for (int j = K % P; j + K < W; j += 2 * K) {
    BK_UNROLL
    for (int i = 0; i < K; ++i)
      if (i + j + K < W && (i + j) / (2 * P) == (i + j + K) / (2 * P)) exchange(i + j, i + j + K);
  }
  if constexpr (K > 1) odd_even_passes<W, P, K / 2>(exchange);
  else if constexpr (2 * P < W) odd_even_passes<W, 2 * P, 2 * P>(exchange);
}

// Sorts packed (orderable float bits << 32 | index) words ascending (pad past n with ~0): the CPU
// kernel's variant, where a 64-bit min and max compile to branch-free conditional moves. (On the
// GPU a 64-bit compare costs two instructions and the compiler emits one per min and per max:
// the CUDA kernel takes lane_sort_floats, or at W = 32 sort_finite_packed's 32-bit words.)
// Indices are distinct, so the order is total.
template <int W>
BK_HD void lane_sort_keys(uint64_t* a) {
  auto exchange = [&](int i, int j) {
    const uint64_t x = a[i], y = a[j];
    a[i] = x < y ? x : y;
    a[j] = x < y ? y : x;
  };
  odd_even_passes<W, 1, 1>(exchange);
}

// Sorts finite float rewards ascending, moving their indices along; padding past n is +inf, above
// every finite reward. The CUDA small-group kernel's variant for float32 and narrower: the keys
// are the rewards themselves (float min and max, no bit transform either way), and the caller
// NaN-fills a group with a NaN or inf before sorting (min/max would drop a NaN, and a real +inf
// would tie with the padding). Per exchange: one compare, a min, a max and two selects. Equal keys
// never swap their indices (the keys are equal, so key and index stay paired).
template <int W>
BK_HD void lane_sort_floats(float* key, int* idx) {
  auto exchange = [&](int i, int j) {
    const float ki = key[i], kj = key[j];
    const int ii = idx[i], ij = idx[j];
    const bool swap = kj < ki;
    key[i] = ::fminf(ki, kj);
    key[j] = ::fmaxf(ki, kj);
    idx[i] = swap ? ij : ii;
    idx[j] = swap ? ii : ij;
  };
  odd_even_passes<W, 1, 1>(exchange);
}

// The small-group kernel's prologue for float32 and narrower, on rewards already loaded into the
// first n slots of key: pads the slots past n with +inf, numbers the slots (idx[s] = s) and sorts
// (when `sort`). False, with nothing sorted, when one of the n rewards is NaN or inf: the kernel
// then NaN-fills the group by source index.
template <int W>
BK_HD bool sort_finite_floats(float* key, int* idx, int n, bool sort) {
  bool finite = true;
  BK_UNROLL
  for (int i = 0; i < W; ++i) {
    if (i < n) finite = finite & (::fabsf(key[i]) < INFINITY);  // &: no branch per slot
    else key[i] = INFINITY;
    idx[i] = i;
  }
  if (!finite) return false;
  if (sort) lane_sort_floats<W>(key, idx);
  return true;
}

// What lane_sort_packed found.
enum class PackedSort {
  kSorted,     // x and idx hold the samples in ascending order
  kNearEqual,  // sorted except within runs of near-equal rewards (lane_sort_adjacent finishes it)
  kNotFinite,  // a reward is NaN or inf: nothing was read back (the caller NaN-fills the group)
};

// Sorts float rewards ascending on packed 32-bit words: each slot's orderable bits (orderable_f32)
// with their low log2(W) bits replaced by the slot. An exchange is then one unsigned min and one
// max, where lane_sort_floats moves a key and an index in five instructions; the index rides in the
// word. x holds the rewards of slots 0..n-1 (whatever past n: those slots sort last, as the
// largest finite float with their own slot, above every sample's word). Then:
//   * at W > 32, finiteness from the two ends: the orderable order puts -NaN and -inf below every
//     finite reward and +inf and +NaN above, so the group is finite exactly when the smallest word
//     and the largest are (two compares, where a check per slot costs W). At W <= 32 the caller
//     checks each slot first (sort_finite_packed), and kNotFinite never comes back;
//   * the price of the cleared bits: rewards that agree in every other bit come out in slot order,
//     not by value. So each sorted slot's reward is read again by its source index (value(i), the
//     reward of sample i < n: one load, where carrying x through the network would cost three
//     instructions an exchange), and the order is right exactly when the rewards read back never
//     decrease. The padding reads back as +inf.
template <int W, class Value>
BK_HD PackedSort lane_sort_packed(float* x, int* idx, int n, Value value) {
  static_assert(W >= 2 && (W & (W - 1)) == 0, "lane_sort_packed: W a power of two");
  constexpr uint32_t kSlotBits = uint32_t(W - 1);
  constexpr uint32_t kLargestFinite = 0xff7fffffu;  // orderable_f32(FLT_MAX)
  constexpr uint32_t kSmallestFinite = 0x00800000u;  // orderable_f32(-FLT_MAX)
  uint32_t word[W];
  BK_UNROLL
  for (int i = 0; i < W; ++i) word[i] = ((i < n ? orderable_f32(x[i]) : kLargestFinite) & ~kSlotBits) | uint32_t(i);
  auto exchange = [&](int i, int j) {
    const uint32_t a = word[i], b = word[j];
    word[i] = a < b ? a : b;
    word[j] = a < b ? b : a;
  };
  odd_even_passes<W, 1, 1>(exchange);
  const bool finite =
      W <= 32 || (word[0] >= (kSmallestFinite & ~kSlotBits) && word[W - 1] <= (kLargestFinite | kSlotBits));
  bool decreased = false;
  BK_UNROLL
  for (int s = 0; s < W; ++s) {
    idx[s] = int(word[s] & kSlotBits);
    x[s] = s < n ? value(idx[s]) : INFINITY;  // the padding sorts last: slots n..W-1
    if (s > 0) decreased = decreased | (x[s] < x[s - 1]);
  }
  return !finite ? PackedSort::kNotFinite : (decreased ? PackedSort::kNearEqual : PackedSort::kSorted);
}

// Odd-even transposition over (key, index) pairs: W phases, alternately the pairs from slot 0 and
// from slot 1, sort any order ((W + 1) / 2 rounds of both). The rare second step of
// lane_sort_packed, so a loop that is not unrolled (one round of code). kEarlyExit: stop after a
// round that exchanged nothing. Without it (W <= 32) the one round the static estimate counts is
// shorter by a flag per exchange; at W = 64 near-equal rewards are common enough (six cleared
// bits: 0.24 % of groups of U(0, 1) float32 rewards, 7.3 % of warps of 32 groups, against 0.03 %
// and 1.0 % at W = 32) that a fixed 32 rounds would cost more than the flags (a run of two
// near-equal rewards takes one round, and the check one more; bench/results/
// static_sm90_thread64_prototype/clash_rates.py). Its exchange selects the keys where
// lane_sort_floats takes fminf/fmaxf: sharing that one made the counted paths 6-8 instructions
// longer on sm_90.
template <int W, bool kEarlyExit = (W > 32)>
BK_HD void lane_sort_adjacent(float* key, int* idx) {
  bool swapped = false;
  auto exchange = [&](int i) {
    const float a = key[i], b = key[i + 1];
    const int ia = idx[i], ib = idx[i + 1];
    const bool swap = b < a;
    key[i] = swap ? b : a;
    key[i + 1] = swap ? a : b;
    idx[i] = swap ? ib : ia;
    idx[i + 1] = swap ? ia : ib;
    if (kEarlyExit) swapped = swapped | swap;
  };
  BK_NO_UNROLL
  for (int round = 0; round < (W + 1) / 2; ++round) {
    swapped = false;
    BK_UNROLL
    for (int i = 0; i + 1 < W; i += 2) exchange(i);
    BK_UNROLL
    for (int i = 1; i + 1 < W; i += 2) exchange(i);
    if (kEarlyExit && !swapped) break;
  }
}

// sort_finite_floats with the packed sort (lane_sort_packed, then lane_sort_adjacent when two
// near-equal rewards came out of order); value(i) reads sample i's reward again, as x[i] holds it.
template <int W, class Value>
BK_HD bool sort_finite_packed(float* x, int* idx, int n, bool sort, Value value) {
  // At W <= 32 the check per slot first: sm_90 then allocates the exact step's registers with
  // fewer moves and selects (maxk_loo1, thread_kernel<32>: 1,954 instructions against 2,016 with
  // the check at the two ends alone); at W = 64 the ends alone save about 190.
  if (!sort || W <= 32) {
    if (!sort_finite_floats<W>(x, idx, n, false)) return false;
    if (!sort) return true;
  }
  const PackedSort found = lane_sort_packed<W>(x, idx, n, value);
  if (found == PackedSort::kNotFinite) return false;
  if (found == PackedSort::kNearEqual) lane_sort_adjacent<W>(x, idx);
  return true;
}

// The same network over (key, index) pairs, ordered by key then index: a total order (indices are
// distinct), so the result is a permutation of the slots whatever the keys.
template <int W>
BK_HD void lane_sort_pairs(uint64_t* key, int* idx) {
  auto exchange = [&](int i, int j) {
    const bool swap = key[j] < key[i] || (key[j] == key[i] && idx[j] < idx[i]);
    const uint64_t ki = key[i], kj = key[j];
    const int ii = idx[i], ij = idx[j];
    key[i] = swap ? kj : ki;
    key[j] = swap ? ki : kj;
    idx[i] = swap ? ij : ii;
    idx[j] = swap ? ii : ij;
  };
  odd_even_passes<W, 1, 1>(exchange);
}

}  // namespace bk
