// CPU kernel: at::parallel_for over groups; per group an O(n log n) sort, then the shared
// per-group mathematics (group_math.h) in float64, and one rounding to the output dtype.
#include "advantages_cpu.h"

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include <type_traits>
#include <vector>

#include "bonkernels/lane_exec.h"
#include "bonkernels/pack_exec.h"
#include "bonkernels/serial_exec.h"

namespace bk {
namespace {

// Reusable buffers of one thread's sorts.
struct SortScratch {
  std::vector<std::pair<double, int32_t>> pairs;
  std::vector<uint64_t> packed, packed_buffer;
  std::vector<std::pair<uint64_t, int32_t>> radix_buffer;
};

// The ascending order of one group's rewards: x[s] the s-th smallest, src[s] its index in the group
// (any order for the order-free estimators). Floats narrower than double sort as packed
// (orderable bits, index) words: the lane executor's branch-free network up to 64 samples, a 32-bit
// radix sort beyond (the rewards are recovered exactly from the words); doubles by sort_pairs.
template <typename scalar_t, class Vec>
void sorted_order(const scalar_t* v, int n, bool order_free_code, Vec& x, int32_t* src, SortScratch& scratch) {
  if (order_free_code) {
    for (int i = 0; i < n; ++i) x[i] = double(v[i]), src[i] = i;
  } else if (!std::is_same<scalar_t, double>::value) {  // (float bits, index) words
    std::vector<uint64_t>& packed = scratch.packed;
    if (packed.size() < std::max<size_t>(n, kNetworkSortMax)) packed.resize(std::max<size_t>(n, kNetworkSortMax));
    for (int i = 0; i < n; ++i) packed[i] = (uint64_t(orderable_f32(float(v[i]))) << 32) | uint32_t(i);
    if (n <= kNetworkSortMax) network_sort_packed(packed.data(), n);
    else radix_sort_packed32(packed.data(), n, scratch.packed_buffer);
    for (int s = 0; s < n; ++s) {
      src[s] = int32_t(uint32_t(packed[s]));
      x[s] = double(from_orderable_f32(uint32_t(packed[s] >> 32)));
    }
  } else {
    std::vector<std::pair<double, int32_t>>& pairs = scratch.pairs;
    if (pairs.size() < size_t(n)) pairs.resize(n);
    for (int i = 0; i < n; ++i) pairs[i] = {double(v[i]), int32_t(i)};
    sort_pairs(pairs.data(), n, &scratch.radix_buffer);
    for (int s = 0; s < n; ++s) x[s] = pairs[s].first, src[s] = pairs[s].second;
  }
}

// The deltas in sorted order, clamped in the input dtype as the reference does; a non-finite delta
// becomes NaN (it poisons its group: the NaN contract; the clamp must not hide it).
template <typename scalar_t>
double clamped_delta(scalar_t d, const Params& p) {
  double dl = double(d);
  if (!std::isfinite(dl)) return BK_NAN;
  if (p.has_clamp) {
    dl = dl < -p.clamp_delta ? -p.clamp_delta : (dl > p.clamp_delta ? p.clamp_delta : dl);
    dl = double(static_cast<scalar_t>(dl));
  }
  return dl;
}

template <typename scalar_t, class Vec>
void sorted_deltas(const scalar_t* d, int n, const int32_t* src, const Params& p, Vec& delta) {
  for (int s = 0; s < n; ++s) delta[s] = clamped_delta(d[src[s]], p);
}

// One group of n <= W samples: compute_group on the lane executor, as the CUDA small-group kernel
// runs it.
template <int W, bool kFull, typename scalar_t>
void lane_group_sized(const scalar_t* v, const scalar_t* d, scalar_t* out, int n, const Params& p,
                      SortScratch& scratch) {
  using Ex = LaneExec<W, SlotValues<W>, kFull>;
  Ex ex;
  ex.set_size(n);
  typename Ex::Vec x, delta;
  int32_t src[W];
  sorted_order(v, n, order_free(p.code), x, src, scratch);
  if (d != nullptr) sorted_deltas(d, n, src, p, delta);
  compute_group(ex, p, x, delta);
  for (int s = 0; s < n; ++s) out[src[s]] = static_cast<scalar_t>(ex.sink.v[s]);
}

// A group of exactly W samples takes the variant with the size a constant (no masks).
template <int W, typename scalar_t>
void lane_group(const scalar_t* v, const scalar_t* d, scalar_t* out, int n, const Params& p, SortScratch& scratch) {
  if (n == W) lane_group_sized<W, true>(v, d, out, n, p, scratch);
  else lane_group_sized<W, false>(v, d, out, n, p, scratch);
}

// Groups per pack of the pack executor: two doubles in one SSE2 register at the x86-64 baseline,
// which this build targets, four in one AVX register where the CPU has AVX2, eight in one AVX-512
// register where it has AVX-512 (pack_groups_wide, pack_groups_512, chosen at run time). Measured
// at n = 16, SSE2: 1.6-1.9x the lane executor's speed with packs of two, 1.2-1.4x with packs of
// four split in two registers; packs of eight 1.2-1.4x faster than packs of four (AMD EPYC).
constexpr int kPackGroups = 2, kWidePackGroups = 4, kPackGroups512 = 8;

// clip_value lane by lane: lo > a ? lo : a, then hi < a ? hi : a (a NaN passes through). For two
// lanes an SSE2 maxpd and minpd (GCC compiles the select to a compare and three logic ops, which
// made the packs of two 1.15x slower than a clip per lane), for four or eight (AVX2, AVX-512)
// compares and blends.
inline PackTypes<2>::Values clip_lanes(PackTypes<2>::Values a, double lo, double hi) {
#if defined(__SSE2__)
  return (PackTypes<2>::Values)_mm_min_pd(_mm_set1_pd(hi), _mm_max_pd(_mm_set1_pd(lo), (__m128d)a));
#else
  a = lo > a ? PackTypes<2>::Values{lo, lo} : a;
  return hi < a ? PackTypes<2>::Values{hi, hi} : a;
#endif
}
template <class V>
V clip_lanes(V a, double lo, double hi) {
  V low, high;  // (by lane, so a bound of -0.0 keeps its sign)
  for (int l = 0; l < int(sizeof(V) / sizeof(double)); ++l) low[l] = lo, high[l] = hi;
  a = low > a ? low : a;
  return high < a ? high : a;
}

// Each lane rounded to scalar_t and back (for float one conversion of the vector each way).
template <typename scalar_t, class V>
V round_lanes(V a) {
  if constexpr (std::is_same<scalar_t, float>::value) {
    typedef float Floats __attribute__((vector_size(sizeof(V) / 2)));
    return __builtin_convertvector(__builtin_convertvector(a, Floats), V);
  } else {
    for (int l = 0; l < int(sizeof(V) / sizeof(double)); ++l) a[l] = double(static_cast<scalar_t>(a[l]));
    return a;
  }
}

// Where the pack executor's values go: slot s of group l (src: the sample it holds), scaled,
// clipped and rounded, as compute_group's emit does for one group read from a bank or for the
// centred estimators (neither zeroes a group).
template <int W, int L, typename scalar_t>
struct PackStore {
  scalar_t* out;
  int n;
  const Params* p;
  const int32_t (*src)[W];
  // scale_value and clip_value on every lane at once (the same operations, so the same bits; the
  // host's bk_div_moderate is an IEEE division), then one rounding and store per lane
  void operator()(int s, Pack<L> a) {
    const bool mean_natural = natural_scale_is_mean(p->code);
    if (p->mean_scale && !mean_natural) a = a * double(n);
    else if (!p->mean_scale && mean_natural) a = a / double(n);
    a.v = clip_lanes(a.v, p->clip_lo, p->clip_hi);
    for (int l = 0; l < L; ++l) out[l * n + src[l][s]] = static_cast<scalar_t>(a.v[l]);
  }
};

// Orders two vectors of sort keys (doubles, never NaN) lane by lane: the smaller into a, the larger
// into b. For two lanes one SSE2 minpd and one maxpd (GCC compiles the select to a compare and
// three logic ops), for four or eight (AVX2, AVX-512) a compare and two blends.
inline void key_exchange(PackTypes<2>::Values& a, PackTypes<2>::Values& b) {
#if defined(__SSE2__)
  const __m128d lo = _mm_min_pd((__m128d)a, (__m128d)b), hi = _mm_max_pd((__m128d)a, (__m128d)b);
  a = (PackTypes<2>::Values)lo, b = (PackTypes<2>::Values)hi;
#else
  const auto less = a < b;
  const PackTypes<2>::Values lo = less ? a : b, hi = less ? b : a;
  a = lo, b = hi;
#endif
}
template <class V>
void key_exchange(V& a, V& b) {
  const auto less = a < b;
  const V lo = less ? a : b, hi = less ? b : a;
  a = lo, b = hi;
}

// The sort of L groups of n <= W float32/float16/bfloat16 rewards at once. A sample's word,
// (orderable float bits << 5 | index), is below 2^37, and the double whose bits are the word plus
// those of 2^52 is 2^52 + word: the doubles order as the words, so the lane sort's network runs on
// every group's keys in one vector register per slot (a compare-exchange is key_exchange), with no
// conversion either way. The order is the one-group sort's, (orderable bits << 32 |
// index): the same permutation, so the same values.
constexpr int kKeyIndexBits = 5;
static_assert(kLaneWidthMax <= (1 << kKeyIndexBits), "a sample's index must fit the key's low bits");

// The floats whose bits are the low 32 bits of each word.
template <int L>
typename PackTypes<L>::Floats low_floats(typename PackTypes<L>::Words w);
template <>
PackTypes<2>::Floats low_floats<2>(PackTypes<2>::Words w) {
  typedef float F4 __attribute__((vector_size(16)));
  const F4 f = (F4)w;
  return __builtin_shufflevector(f, f, 0, 2);  // (little-endian: the low half of a word first)
}
template <>
PackTypes<4>::Floats low_floats<4>(PackTypes<4>::Words w) {
  typedef float F8 __attribute__((vector_size(32)));
  const F8 f = (F8)w;
  return __builtin_shufflevector(f, f, 0, 2, 4, 6);
}
template <>
PackTypes<8>::Floats low_floats<8>(PackTypes<8>::Words w) {
  typedef float F16 __attribute__((vector_size(64)));
  const F16 f = (F16)w;
  return __builtin_shufflevector(f, f, 0, 2, 4, 6, 8, 10, 12, 14);
}

template <int W, int L, typename scalar_t, class Vec>
void sort_pack(const scalar_t* v, int n, Vec& x, int32_t (&src)[L][W]) {
  static_assert(!std::is_same<scalar_t, double>::value, "float64 rewards do not fit the key");
  typedef typename PackTypes<L>::Words Words;
  constexpr uint64_t kTwoPow52 = 0x4330000000000000ull, kMantissa = (uint64_t(1) << 52) - 1;
  typedef typename PackTypes<L>::Values Keys;
  Keys key[W];
  for (int s = 0; s < W; ++s) {
    uint64_t word[L];
    for (int l = 0; l < L; ++l)  // (padding: above every word, so it sorts last)
      word[l] = s < n ? uint64_t(orderable_f32(float(v[l * n + s]))) << kKeyIndexBits | uint64_t(s) : uint64_t(1) << 40;
    key[s] = (Keys)(vector_of<Words>(word) | kTwoPow52);
  }
  auto exchange = [&](int i, int j) { key_exchange(key[i], key[j]); };
  odd_even_passes<W, 1, 1>(exchange);
  for (int s = 0; s < n; ++s) {
    const Words word = (Words)key[s] & kMantissa;
    const Words o = word >> kKeyIndexBits;
    // from_orderable_f32 on every word at once, in their low 32 bits (the helper per lane: 1.15x
    // slower for the whole pack)
    const Words bits = o ^ (((o >> 31) - 1) | 0x80000000u);
    for (int l = 0; l < L; ++l) src[l][s] = int32_t(word[l] & ((1u << kKeyIndexBits) - 1));
    x[s].v = __builtin_convertvector(low_floats<L>(bits), typename Pack<L>::Raw);
  }
}

// L consecutive groups of n <= W finite samples at v (and, off-policy, finite deltas at d), for a
// call the pack executor takes (pack_takes): the same values, to the bit, as lane_group gives one
// group at a time.
template <int W, bool kFull, int L, typename scalar_t>
void pack_groups_sized(const scalar_t* v, const scalar_t* d, scalar_t* out, int n, const Params& p) {
  using Ex = PackExec<W, L, PackStore<W, L, scalar_t>, kFull>;
  Ex ex;
  ex.set_size(n);
  typename Ex::Vec x, delta;
  sum_vec_t<Ex> dsum;
  int32_t src[L][W];
  const bool sorted = sorted_pack_takes(p);
  if constexpr (!std::is_same<scalar_t, double>::value) {
    if (sorted) sort_pack<W, L>(v, n, x, src);
  }
  if (!sorted) {
    for (int s = 0; s < n; ++s) {
      double lanes[L];
      for (int l = 0; l < L; ++l) lanes[l] = double(v[l * n + s]), src[l][s] = s;
      x[s].v = vector_of<typename Pack<L>::Raw>(lanes);
    }
  }
  const bool off_policy = p.code == MAXK_OFFPOLICY;
  if (off_policy) {  // the deltas in each group's sorted order, clamped as sorted_deltas (all finite)
    for (int s = 0; s < n; ++s) {
      double lanes[L];
      for (int l = 0; l < L; ++l) lanes[l] = double(d[l * n + src[l][s]]);
      delta[s].v = vector_of<typename Pack<L>::Raw>(lanes);
      // (clip_lanes is clamped_delta's clamp for a positive clamp_delta: packs_take_deltas)
      if (p.has_clamp) delta[s].v = round_lanes<scalar_t>(clip_lanes(delta[s].v, -p.clamp_delta, p.clamp_delta));
    }
    delta_prefix(ex, delta, dsum);
  }
  ex.sink = PackStore<W, L, scalar_t>{out, n, &p, src};
  auto emit = [&](int s, Pack<L> value) { ex.emit(s, value); };
  BankTables t;
  if (!sorted) centred_values(ex, p.code, p.eps, x, emit);
  else if (!ex.bank_tables(p, t))
    for (int i = 0; i < L * n; ++i) out[i] = static_cast<scalar_t>(BK_NAN);  // no block for n: as one group
  else if (p.code == MAXK_LOO1) maxk_loo1_values(ex, t, x, first_value(ex, x), emit);
  else if (off_policy) maxk_offpolicy_values(ex, t, x, delta, dsum, emit);
  else maxk_values(ex, t, x, emit);
}

// L groups of n <= 32 samples, on 8, 16 or 32 slots (the width the lane executor takes for one
// group, so the same reductions); groups that fill the W slots take the variant with the size a
// constant (no masks).
template <int L, typename scalar_t>
void pack_groups(const scalar_t* v, const scalar_t* d, scalar_t* out, int n, const Params& p) {
  if (n == 8) pack_groups_sized<8, true, L>(v, d, out, n, p);
  else if (n < 8) pack_groups_sized<8, false, L>(v, d, out, n, p);
  else if (n == 16) pack_groups_sized<16, true, L>(v, d, out, n, p);
  else if (n < 16) pack_groups_sized<16, false, L>(v, d, out, n, p);
  else if (n == kLaneWidthMax) pack_groups_sized<kLaneWidthMax, true, L>(v, d, out, n, p);
  else pack_groups_sized<kLaneWidthMax, false, L>(v, d, out, n, p);
}

#if defined(__GNUC__) && defined(__x86_64__)
#define BK_WIDE_PACKS 1
// Packs of four groups, in AVX registers: this function and everything it calls, inlined into it
// (flatten), are compiled for AVX2, which brings no FMA, so every lane computes the same operations
// as with SSE2 (the same bits). Called only where the CPU has AVX2 (has_wide_packs).
template <typename scalar_t>
__attribute__((target("avx2"), flatten)) void pack_groups_wide(const scalar_t* v, const scalar_t* d, scalar_t* out,
                                                                 int n, const Params& p) {
  pack_groups<kWidePackGroups>(v, d, out, n, p);
}

bool has_wide_packs() {
  static const bool has = __builtin_cpu_supports("avx2");
  return has;
}

// Packs of eight groups, in AVX-512 registers, the same way. AVX-512F brings fused multiply-adds,
// which GCC would contract a * b + c into (other bits: test_native fails on such a build), so
// fp-contract=off keeps every operation as written. Called only where the CPU has the three
// extensions (has_packs_512).
template <typename scalar_t>
__attribute__((target("avx512f,avx512dq,avx512vl"), optimize("fp-contract=off"), flatten)) void pack_groups_512(
    const scalar_t* v, const scalar_t* d, scalar_t* out, int n, const Params& p) {
  pack_groups<kPackGroups512>(v, d, out, n, p);
}

bool has_packs_512() {
#if defined(__clang__)
  return false;  // (the optimize attribute is GCC's: clang could contract multiply-adds there)
#else
  static const bool has =
      __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
  return has;
#endif
}
#endif

// Whether groups g .. g + L - 1 all hold n finite rewards (and finite deltas, when given), one
// after the other; v and d point at group g's first sample.
template <typename scalar_t>
bool packable(const scalar_t* v, const scalar_t* d, const int64_t* offsets, int64_t g, int n, int L) {
  for (int l = 1; l <= L; ++l)
    if (offsets[g + l] != offsets[g] + int64_t(l) * n) return false;
  for (int i = 0; i < L * n; ++i)
    if (!std::isfinite(double(v[i]))) return false;
  if (d != nullptr)  // (a loop of its own: one loop testing both made grpo's packs 1.15x slower)
    for (int i = 0; i < L * n; ++i)
      if (!std::isfinite(double(d[i]))) return false;
  return true;
}

template <typename scalar_t>
void run_groups(const scalar_t* values, const int64_t* offsets, const scalar_t* deltas, scalar_t* out,
                int64_t num_groups, int64_t total, const Params& p, int64_t bound) {
  const int64_t mean_size = num_groups > 0 ? total / num_groups : 1;
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, mean_size));
  const bool off_policy = needs_deltas(p.code) && deltas != nullptr;
  // (float64 rewards do not fit sort_pack's key: the sorted estimators take them one at a time)
  // (a clamp_delta of 0 or below, which only the raw op accepts, clamps one group at a time too)
  const bool packs_take_deltas = off_policy && (!p.has_clamp || p.clamp_delta > 0.0);
  const bool packs = pack_takes(p) && !(sorted_pack_takes(p) && std::is_same<scalar_t, double>::value) &&
                     (!needs_deltas(p.code) || packs_take_deltas);
#if defined(BK_WIDE_PACKS)
  const bool wide = has_wide_packs(), wide_512 = has_packs_512();
#endif
  at::parallel_for(0, num_groups, grain, [&](int64_t g_begin, int64_t g_end) {
    SerialExec ex;
    SortScratch scratch;
    std::vector<int32_t> src;
    SerialExec::Vec x, delta;
    for (int64_t g = g_begin; g < g_end; ++g) {
      const int64_t base = offsets[g];
      const int64_t size = offsets[g + 1] - base;
      if (size <= 0) continue;
      if (bound >= 0 && size > bound) {  // the max_group_size promise was wrong: mark the group
        for (int64_t i = 0; i < size; ++i) out[base + i] = static_cast<scalar_t>(BK_NAN);
        continue;
      }
      const int n = int(size);
      // several groups of one size at once (eight where the CPU has AVX-512, four where it has
      // AVX2, then two); a group with a NaN or inf reward or delta goes alone (the NaN contract)
      const scalar_t* d = off_policy ? deltas + base : nullptr;
      // groups g .. g + L - 1 by pack_fn, when the CPU has its registers and they form a pack
      auto took_pack = [&](bool cpu_has, int L, auto pack_fn) {
        if (!(packs && cpu_has && n <= kLaneWidthMax && g + L <= g_end && packable(values + base, d, offsets, g, n, L)))
          return false;
        pack_fn(values + base, d, out + base, n, p);
        g += L - 1;
        return true;
      };
#if defined(BK_WIDE_PACKS)
      if (took_pack(wide_512, kPackGroups512, pack_groups_512<scalar_t>) ||
          took_pack(wide, kWidePackGroups, pack_groups_wide<scalar_t>))
        continue;
#endif
      if (took_pack(true, kPackGroups, pack_groups<kPackGroups, scalar_t>)) continue;
      if (n <= 8) {
        lane_group<8>(values + base, d, out + base, n, p, scratch);
      } else if (n <= 16) {
        lane_group<16>(values + base, d, out + base, n, p, scratch);
      } else if (n <= kLaneWidthMax) {
        lane_group<kLaneWidthMax>(values + base, d, out + base, n, p, scratch);
      } else {
        ex.begin_group(n);
        ex.alloc(x);
        ex.alloc(delta);
        if (src.size() < size_t(n)) src.resize(n);
        sorted_order(values + base, n, order_free(p.code), x, src.data(), scratch);
        if (d != nullptr) sorted_deltas(d, n, src.data(), p, delta);  // (only the off-policy estimators read delta)
        compute_group(ex, p, x, delta);
        const double* v = ex.values();
        for (int s = 0; s < n; ++s) out[base + src[s]] = static_cast<scalar_t>(v[s]);
      }
    }
  });
}

}  // namespace

void advantages_cpu(const at::Tensor& values, const at::Tensor& offsets, const at::Tensor& deltas,
                    const Params& p, at::Tensor& out, int64_t max_group_size) {
  const int64_t num_groups = offsets.numel() - 1;
  const int64_t total = values.numel();
  const int64_t* off = offsets.data_ptr<int64_t>();
  // Bounds check (cheap, O(G)): a malformed offsets tensor must not read or write out of range.
  for (int64_t g = 0; g < num_groups; ++g) {
    TORCH_CHECK_VALUE(off[g] >= 0 && off[g] <= off[g + 1] && off[g + 1] <= total,
                      "bonkernels: malformed offsets at group ", g);
  }
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, values.scalar_type(), "bonkernels_advantages_cpu", [&] {
    run_groups<scalar_t>(values.data_ptr<scalar_t>(), off, deltas.defined() ? deltas.data_ptr<scalar_t>() : nullptr,
                         out.data_ptr<scalar_t>(), num_groups, total, p, max_group_size);
  });
}

}  // namespace bk
