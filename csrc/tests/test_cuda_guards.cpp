// Host tests of the CUDA kernels' safety logic (csrc/cuda/guards.h), on adversarial inputs: the
// functions the kernels call are compiled here as plain C++, and the kernels' prologue, sort and
// stores are emulated lane by lane (shuffles as array reads), so CI without a GPU checks:
//   * classify_group: every index a kernel may touch lies in [0, total), for malformed offsets
//     (negative, decreasing, past the end) and undersized launch bounds;
//   * the block kernel's flow (radix order of the keys, as cub::BlockRadixSort orders doubles):
//     for any keys (NaN, -NaN, +-inf, -0, subnormals) it writes every sample exactly once, inside
//     the group, NaN for a group with a non-finite value;
//   * the small-group kernel (one thread per group, W = 8, 16, and 32 for float32 and narrower): its lane sorts
//     (odd-even merge networks on the float rewards with their indices, after a check that refuses
//     NaN and inf; at W = 32 on packed 32-bit words, with the exact step for rewards that differ
//     only in the bits the slot replaces; and on (key, index) pairs for doubles) order every group
//     as std::sort does and are permutations for any bit patterns; size buckets (bucket_group)
//     give every sample of a batch exactly one writer across the launch's two kernels, for
//     malformed offsets and undersized bounds too; its clip in single precision after the
//     rounding gives the float of the double clip;
//   * the checks can fail: the flow before the fix (NaN/inf not pre-checked, stores gated by
//     sorted position only) is run through the same checks and must be caught writing outside the
//     group or leaving samples unwritten.
// The segment kernel (groups of 17..512) is checked in test_group_math.cpp, its lanes run by threads.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "bonkernels/lane_exec.h"
#include "cuda/guards.h"

namespace {

using bk::cuda::GroupSpan;

int failures = 0;
int checks = 0;

void expect(bool ok, const char* what, long long a = 0, long long b = 0) {
  ++checks;
  if (!ok) {
    if (failures < 30) std::printf("FAIL %s (%lld, %lld)\n", what, a, b);
    ++failures;
  }
}

const double kInf = std::numeric_limits<double>::infinity();

double neg_nan() {
  double d = std::numeric_limits<double>::quiet_NaN();
  return -d;  // sign bit set: sorts first in radix order
}

// ----------------------------------------------------------------------------- classify_group

void test_classify_group() {
  for (int64_t total = 0; total <= 6; ++total)
    for (int64_t begin = -3; begin <= 9; ++begin)
      for (int64_t end = -3; end <= 9; ++end)
        for (int64_t cap = 0; cap <= 4; ++cap) {
          const GroupSpan s = bk::cuda::classify_group(begin, end, total, cap);
          expect(0 <= s.lo && s.lo <= s.hi && s.hi <= total, "classify_group span inside [0, total]", begin, end);
          const bool well_formed = begin >= 0 && begin <= end && end <= total;
          if (well_formed) {
            expect(s.lo == begin && s.hi == end, "well-formed group keeps its span", begin, end);
            const int want = begin == end ? bk::cuda::GROUP_SKIP
                                          : (end - begin <= cap ? bk::cuda::GROUP_COMPUTE : bk::cuda::GROUP_NAN_FILL);
            expect(s.action == want, "action of a well-formed group (oversize: NaN fill)", begin, end);
          } else {
            expect(s.action == bk::cuda::GROUP_NAN_FILL, "a malformed group is NaN-filled, never computed", begin, end);
          }
        }
  // Extreme offsets (int64 garbage) stay inside too.
  const int64_t big = std::numeric_limits<int64_t>::max(), small = std::numeric_limits<int64_t>::min();
  const int64_t cases[][2] = {{small, big}, {big, small}, {-1, big}, {5, big}, {small, 3}};
  for (const auto& c : cases) {
    const GroupSpan s = bk::cuda::classify_group(c[0], c[1], 10, 4096);
    expect(0 <= s.lo && s.lo <= s.hi && s.hi <= 10 && s.action == bk::cuda::GROUP_NAN_FILL, "extreme offsets");
  }
}

// ----------------------------------------------------------------------------- the sort networks

// cub::BlockRadixSort on double keys: ascending in the sign-flipped bit order (positive NaN after
// +inf, negative NaN before -inf), stable in the index.
void radix_order(std::vector<double>& key, std::vector<int>& idx) {
  std::vector<int> perm(key.size());
  std::iota(perm.begin(), perm.end(), 0);
  std::stable_sort(perm.begin(), perm.end(), [&](int a, int b) {
    return bk::orderable_f64(key[a]) < bk::orderable_f64(key[b]);
  });
  std::vector<double> k2(key.size());
  std::vector<int> i2(key.size());
  for (size_t s = 0; s < perm.size(); ++s) k2[s] = key[perm[s]], i2[s] = idx[perm[s]];
  key.swap(k2), idx.swap(i2);
}

bool is_permutation_of_lanes(const std::vector<int>& idx) {
  std::vector<int> sorted = idx;
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 0; i < sorted.size(); ++i)
    if (sorted[i] != int(i)) return false;
  return true;
}

// ----------------------------------------------------------------------------- one group, emulated

enum class Flow { kFixed, kBeforeFix };

struct Outcome {
  bool wrote_outside = false;   // a store outside [base, base + n) of the output
  bool left_unwritten = false;  // a sample of the group never stored
  bool wrong_nan = false;       // NaN contract broken (fixed flow only checks this)
};

// One group of n values at `base` of an output with guard slots around it; `slots` sort entries
// (W lanes, or BLOCK * ITEMS), padding +inf with indices n..slots-1, as the kernels do.
Outcome run_group(Flow flow, int slots, const std::vector<double>& vals) {
  const int n = int(vals.size());
  const int guard = slots + 4, base = guard;
  std::vector<int> writes(size_t(2 * guard + n), 0);
  std::vector<double> out(writes.size(), 12345.0);
  auto store = [&](int64_t i, double v) {
    ++writes[size_t(i)];
    out[size_t(i)] = v;
  };
  bool bad = false;
  for (double v : vals) bad = bad || !bk::cuda::finite_value(v);
  int group_n = n;
  if (flow == Flow::kFixed && bad) {  // the kernels: NaN by source index, then an empty group
    for (int lane = 0; lane < n; ++lane) store(base + lane, std::nan(""));
    group_n = 0;
  }
  std::vector<double> key(static_cast<size_t>(slots));
  std::vector<int> idx(static_cast<size_t>(slots));
  for (int lane = 0; lane < slots; ++lane) {
    key[size_t(lane)] = lane < group_n ? vals[size_t(lane)] : kInf;
    idx[size_t(lane)] = lane;
  }
  radix_order(key, idx);
  if (flow == Flow::kFixed && !is_permutation_of_lanes(idx)) {
    expect(false, "the sort is a permutation of the slots", slots, n);
  }
  for (int pos = 0; pos < slots; ++pos) {  // emit: a value per sorted position < n
    const int i = idx[size_t(pos)];
    const bool gate = flow == Flow::kFixed ? (pos < group_n && i < group_n) : (pos < group_n);
    if (gate) store(int64_t(base) + i, 1.0);  // (the value itself is compute_group's business)
  }
  Outcome o;
  for (size_t i = 0; i < writes.size(); ++i) {
    const bool inside = int(i) >= base && int(i) < base + n;
    if (!inside && writes[i] != 0) o.wrote_outside = true;
    if (inside && writes[i] != 1) o.left_unwritten = true;
    if (inside && flow == Flow::kFixed && (std::isnan(out[i]) != bad)) o.wrong_nan = true;
  }
  return o;
}

double draw(std::mt19937_64& rng) {
  const double specials[] = {std::nan(""), neg_nan(), kInf, -kInf, 0.0, -0.0, 5e-324, -5e-324, 1.0, -1.0};
  std::uniform_int_distribution<int> pick(0, 19);
  const int c = pick(rng);
  if (c < 10) return specials[c];
  return std::normal_distribution<double>(0.0, 1.0)(rng);
}

void test_groups(const char* name, const std::vector<int>& slot_counts) {
  std::mt19937_64 rng(20261202);
  int caught_before_fix = 0;
  for (int slots : slot_counts) {
    for (int trial = 0; trial < 400; ++trial) {
      const int n = 1 + int(rng() % uint64_t(slots));
      std::vector<double> vals(static_cast<size_t>(n));
      const int mode = trial % 4;  // 0: finite, 1: one special, 2: many specials, 3: ties
      for (int i = 0; i < n; ++i) {
        if (mode == 2) vals[size_t(i)] = draw(rng);
        else if (mode == 3) vals[size_t(i)] = double(rng() % 3) - 1.0;
        else vals[size_t(i)] = std::normal_distribution<double>(0.0, 1.0)(rng);
      }
      if (mode == 1) vals[size_t(rng() % uint64_t(n))] = draw(rng);
      const Outcome fixed = run_group(Flow::kFixed, slots, vals);
      expect(!fixed.wrote_outside, "fixed flow: no store outside the group", slots, n);
      expect(!fixed.left_unwritten, "fixed flow: every sample stored exactly once", slots, n);
      expect(!fixed.wrong_nan, "fixed flow: NaN exactly for groups with a non-finite value", slots, n);
      const Outcome before = run_group(Flow::kBeforeFix, slots, vals);
      if (before.wrote_outside || before.left_unwritten) ++caught_before_fix;
    }
    // Deterministic cases from the issue: a NaN in a full group; a real +inf tying with padding.
    std::vector<double> nan_last(size_t(slots - 1), 0.5);
    nan_last[0] = std::nan("");
    const Outcome a = run_group(Flow::kBeforeFix, slots, nan_last);
    const Outcome b = run_group(Flow::kFixed, slots, nan_last);
    expect(b.wrote_outside == false && b.left_unwritten == false && !b.wrong_nan, "NaN group, fixed", slots);
    if (a.wrote_outside || a.left_unwritten) ++caught_before_fix;
  }
  std::printf("%s: the pre-fix flow was caught writing outside / leaving samples unwritten in %d cases\n", name,
              caught_before_fix);
  expect(caught_before_fix > 0, "the checks catch the pre-fix flow (the test can fail)");
}

void test_total_order() {
  const double keys[] = {std::nan(""), neg_nan(), kInf, -kInf, 0.0, -0.0, 5e-324, -5e-324, 1.0, -1.0, 2.0};
  for (double a : keys)
    for (double b : keys) {
      const bool ab = bk::orderable_f64(a) < bk::orderable_f64(b), ba = bk::orderable_f64(b) < bk::orderable_f64(a);
      expect(ab != ba || std::memcmp(&a, &b, sizeof a) == 0, "orderable_f64 is a strict total order on the bits");
      if (!std::isnan(a) && !std::isnan(b) && a < b) expect(ab, "orderable_f64 agrees with < on numbers");
    }
  expect(!bk::cuda::finite_value(std::nan("")) && !bk::cuda::finite_value(kInf) && !bk::cuda::finite_value(-kInf) &&
             bk::cuda::finite_value(5e-324) && bk::cuda::finite_value(-1e308),
         "finite_value");
}

// ----------------------------------------------------------------------------- small-group kernel

// The float NaN whose orderable bits equal the padding key (all ones): it must not sort into the padding.
float nan_max_payload() {
  const uint32_t u = 0x7fffffffu;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

template <int W>
void lane_sorts_once(std::mt19937_64& rng, int n, int mode) {
  std::vector<double> vals(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    if (mode == 2) vals[size_t(i)] = draw(rng);
    else if (mode == 3) vals[size_t(i)] = double(rng() % 3) - 1.0;
    else vals[size_t(i)] = std::normal_distribution<double>(0.0, 1.0)(rng);
  }
  // Doubles: (orderable bits, index) pairs, padded as the kernel pads.
  uint64_t key[W];
  int idx[W];
  for (int i = 0; i < W; ++i) {
    key[i] = i < n ? bk::orderable_f64(vals[size_t(i)]) : ~uint64_t(0);
    idx[i] = i;
  }
  bk::lane_sort_pairs<W>(key, idx);
  std::vector<int> perm(idx, idx + W);
  expect(is_permutation_of_lanes(perm), "lane_sort_pairs is a permutation of the slots", W, n);
  for (int s = 0; s + 1 < W; ++s)
    expect(key[s] < key[s + 1] || (key[s] == key[s + 1] && idx[s] < idx[s + 1]), "lane_sort_pairs ascending", W, s);
  for (int s = 0; s < n; ++s) {
    expect(idx[s] < n, "real samples sort before the padding", W, s);
    const double back = bk::from_orderable_f64(key[s]), want = vals[size_t(idx[s])];
    expect(std::memcmp(&back, &want, sizeof(back)) == 0, "from_orderable_f64 recovers the value bit for bit", W, s);
  }
  // Floats, as the small-group kernel takes float32 and narrower: the rewards are the keys
  // (sort_finite_floats pads with +inf and refuses a NaN or inf).
  float fkey[W];
  int src[W];
  std::vector<float> f(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    f[size_t(i)] = float(vals[size_t(i)]);
    if (!std::isfinite(f[size_t(i)])) f[size_t(i)] = rng() % 2 ? 3.4e38f : -3.4e38f;  // refused: checked below
    if (mode == 1 && rng() % 2) f[size_t(i)] = rng() % 2 ? -0.0f : 0.0f;  // signed zeros
    if (mode == 1 && rng() % 4 == 0) f[size_t(i)] = (rng() % 2 ? -1.0f : 1.0f) * 1e-45f;  // subnormals
    fkey[i] = f[size_t(i)];
  }
  for (int i = n; i < W; ++i) fkey[i] = -123.0f;  // garbage past n: the prologue pads it
  const bool sorted = bk::sort_finite_floats<W>(fkey, src, n, true);
  expect(sorted, "finite rewards are sorted", W, n);
  expect(is_permutation_of_lanes(std::vector<int>(src, src + W)), "lane_sort_floats is a permutation of the slots", W, n);
  for (int s = 0; s + 1 < W; ++s) expect(fkey[s] <= fkey[s + 1], "lane_sort_floats ascending", W, s);
  for (int s = 0; s < W; ++s) {
    if (s >= n) {
      expect(src[s] >= n && std::isinf(fkey[s]), "the padding sorts last", W, s);
      continue;
    }
    expect(src[s] < n, "samples sort before the padding", W, s);
    // key and index stay paired (a signed zero may sit on the slot of the other sign: equal keys)
    expect(fkey[s] == f[size_t(src[s])], "each slot's key is its sample's reward", W, s);
  }
  // The order-free estimators skip the sort: slots keep their samples.
  for (int i = 0; i < n; ++i) fkey[i] = f[size_t(i)];
  expect(bk::sort_finite_floats<W>(fkey, src, n, false), "finite rewards, unsorted", W, n);
  for (int s = 0; s < W; ++s) expect(src[s] == s && (s >= n || fkey[s] == f[size_t(s)]), "no sort: identity", W, s);
  // A NaN or +-inf anywhere among the n rewards: refused before any exchange (the kernel NaN-fills).
  const float bad[] = {std::numeric_limits<float>::quiet_NaN(), nan_max_payload(), -std::numeric_limits<float>::quiet_NaN(),
                       std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity()};
  for (float b : bad) {
    for (int i = 0; i < n; ++i) fkey[i] = f[size_t(i)];
    fkey[rng() % uint64_t(n)] = b;
    expect(!bk::sort_finite_floats<W>(fkey, src, n, true), "a NaN or inf reward is refused", W, n);
  }
}

// The CPU kernel's packed variant: (orderable float bits, index) words.
template <int W>
void packed_sort_once(std::mt19937_64& rng, int n) {
  uint64_t packed[W];
  std::vector<float> f(static_cast<size_t>(n));
  for (int i = 0; i < W; ++i) {
    if (i < n) f[size_t(i)] = float(draw(rng));
    packed[i] = i < n ? (uint64_t(bk::orderable_f32(f[size_t(i)])) << 32) | uint32_t(i) : ~uint64_t(0);
  }
  bk::lane_sort_keys<W>(packed);
  std::vector<int> src(W);
  for (int s = 0; s < W; ++s) src[size_t(s)] = s < n ? int(uint32_t(packed[s])) : s;
  expect(is_permutation_of_lanes(src), "lane_sort_keys is a permutation of the slots", W, n);
  for (int s = 0; s + 1 < W; ++s) expect(s + 1 < n ? packed[s] < packed[s + 1] : packed[s] <= packed[s + 1], "lane_sort_keys ascending", W, s);
}

// The small-group kernel's packed sort at W = 32 and 64 (sort_finite_packed): 32-bit words of the orderable
// bits with the slot in their low bits. Modes: 0 normal rewards, 1 signed zeros and subnormals,
// 2 ties among three values, 3 clashes: rewards a few units in the last place apart (they differ
// only in the bits the slot replaces, so the network alone may leave them out of order and the
// exact step must run; `clashed` counts the groups where it did).
template <int W>
void packed_float_sort_once(std::mt19937_64& rng, int n, int mode, int& clashed) {
  std::vector<float> f(static_cast<size_t>(n));
  const float base = float(std::normal_distribution<double>(0.0, 1.0)(rng));
  for (int i = 0; i < n; ++i) {
    float v = float(std::normal_distribution<double>(0.0, 1.0)(rng));
    if (mode == 1) v = rng() % 2 ? (rng() % 2 ? -0.0f : 0.0f) : (rng() % 2 ? -1.0f : 1.0f) * 1e-45f * float(1 + rng() % 3);
    if (mode == 2) v = float(int(rng() % 3) - 1);
    if (mode == 3) {
      uint32_t u;
      std::memcpy(&u, &base, sizeof(u));
      u += uint32_t(rng() % (2 * W));  // neighbours of base (same sign, finite)
      std::memcpy(&v, &u, sizeof(v));
    }
    f[size_t(i)] = v;
  }
  auto value = [&](int i) { return f[size_t(i)]; };
  float x[W];
  int idx[W];
  // The network and the reload alone: a permutation with the padding last, finite, in order
  // exactly when it says so.
  for (int i = 0; i < W; ++i) x[i] = i < n ? f[size_t(i)] : -123.0f;  // garbage past n: sorts last
  const bk::PackedSort found = bk::lane_sort_packed<W>(x, idx, n, value);
  expect(found != bk::PackedSort::kNotFinite, "lane_sort_packed: finite rewards are finite", W, n);
  expect(is_permutation_of_lanes(std::vector<int>(idx, idx + W)), "lane_sort_packed is a permutation of the slots", W, n);
  bool ascending = true;
  for (int s = 0; s + 1 < W; ++s) ascending = ascending && !(x[s + 1] < x[s]);
  expect((found == bk::PackedSort::kSorted) == ascending, "lane_sort_packed reports whether its order is right", W, n);
  if (found == bk::PackedSort::kNearEqual) ++clashed;
  // The whole prologue: refusal, padding, sort (with the exact step when needed).
  for (int i = 0; i < W; ++i) x[i] = i < n ? f[size_t(i)] : -123.0f;  // garbage past n: padded
  expect(bk::sort_finite_packed<W>(x, idx, n, true, value), "finite rewards are sorted (packed)", W, n);
  expect(is_permutation_of_lanes(std::vector<int>(idx, idx + W)), "sort_finite_packed is a permutation of the slots", W, n);
  std::vector<float> want(f);
  std::sort(want.begin(), want.end());
  for (int s = 0; s < W; ++s) {
    if (s >= n) {
      expect(idx[s] >= n && x[s] == INFINITY, "the padding sorts last (packed)", W, s);
      continue;
    }
    expect(idx[s] < n && x[s] == f[size_t(idx[s])], "each slot's reward is its sample's (packed)", W, s);
    expect(x[s] == want[size_t(s)], "sort_finite_packed orders as std::sort", W, s);
  }
  // No sort: slots keep their samples. A NaN or inf anywhere: refused.
  for (int i = 0; i < W; ++i) x[i] = i < n ? f[size_t(i)] : -123.0f;
  expect(bk::sort_finite_packed<W>(x, idx, n, false, value), "finite rewards, unsorted (packed)", W, n);
  for (int s = 0; s < W; ++s) expect(idx[s] == s && (s >= n ? x[s] == INFINITY : x[s] == f[size_t(s)]), "no sort: identity (packed)", W, s);
  // Refused by sort_finite_packed, and at W = 64 by lane_sort_packed's two ends (NaN of either
  // sign sorts beyond the infinities, so any of them reaches an end); at W <= 32 by the check per
  // slot before the sort.
  const float bad[] = {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN(), nan_max_payload(),
                       -nan_max_payload(), std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity()};
  for (float b : bad) {
    for (int i = 0; i < W; ++i) x[i] = i < n ? f[size_t(i)] : -123.0f;
    const int at = int(rng() % uint64_t(n));
    x[at] = b;
    std::vector<float> g(f);
    g[size_t(at)] = b;
    expect(!bk::sort_finite_packed<W>(x, idx, n, true, value), "a NaN or inf reward is refused (packed)", W, n);
    for (int i = 0; i < W; ++i) x[i] = i < n ? g[size_t(i)] : -123.0f;
    if (W > 32)
      expect(bk::lane_sort_packed<W>(x, idx, n, [&](int i) { return g[size_t(i)]; }) == bk::PackedSort::kNotFinite,
             "lane_sort_packed finds a NaN or inf at an end", W, n);
  }
}

// The exact step alone, from any order (not only lane_sort_packed's near-sorted ones).
template <int W>
void adjacent_sort_once(std::mt19937_64& rng) {
  const bool reversed = rng() % 8 == 0;
  float key[W];
  int idx[W];
  std::vector<float> f(W);
  for (int i = 0; i < W; ++i) {
    f[size_t(i)] = reversed ? float(W - i) : float(int(rng() % 7) - 3);  // reversed: the most rounds
    key[i] = f[size_t(i)];
    idx[i] = i;
  }
  bk::lane_sort_adjacent<W>(key, idx);
  expect(is_permutation_of_lanes(std::vector<int>(idx, idx + W)), "lane_sort_adjacent is a permutation", W);
  for (int s = 0; s < W; ++s) expect(key[s] == f[size_t(idx[s])], "lane_sort_adjacent keeps pairs", W, s);
  for (int s = 0; s + 1 < W; ++s) expect(key[s] <= key[s + 1], "lane_sort_adjacent ascending", W, s);
}

void test_lane_sorts() {
  std::mt19937_64 rng(20261203);
  for (int trial = 0; trial < 600; ++trial) {
    lane_sorts_once<8>(rng, 1 + int(rng() % 8), trial % 4);
    lane_sorts_once<16>(rng, 1 + int(rng() % 16), trial % 4);
    lane_sorts_once<32>(rng, 1 + int(rng() % 32), trial % 4);  // thread_kernel<32>: float32 and narrower
    packed_sort_once<8>(rng, 1 + int(rng() % 8));
    packed_sort_once<16>(rng, 1 + int(rng() % 16));
    packed_sort_once<32>(rng, 1 + int(rng() % 32));
  }
  int clashed = 0, clash_groups = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    const int mode = trial % 4;
    clash_groups += mode == 3 ? 3 : 0;  // three groups a trial
    packed_float_sort_once<32>(rng, 1 + int(rng() % 32), mode, clashed);
    packed_float_sort_once<64>(rng, 1 + int(rng() % 64), mode, clashed);  // thread_kernel<64>
    packed_float_sort_once<8>(rng, 1 + int(rng() % 8), mode, clashed);  // the code is generic in W
    adjacent_sort_once<32>(rng);
    adjacent_sort_once<64>(rng);  // with the early exit
    adjacent_sort_once<7>(rng);  // odd widths too
  }
  // Most clash groups need the exact step (a test that can fail only if the step runs).
  expect(clashed > clash_groups / 2, "near-equal rewards exercise the exact step", clashed, clash_groups);
}

// Every sample of a batch gets exactly one writer across the two kernels of a bucketed launch: the
// small-group kernel (sizes (0, small]) and the kernel shaped by the bound (sizes (small, bound]);
// malformed groups and groups above the bound are NaN-filled by the first kernel only. A quarter of
// the trials take the kWide launch at a bound of 64: the segment kernel (0, 63], then
// thread_kernel<64> (thread_bucket_lo(64), 64], with many groups of exactly 64.
void test_bucket_group() {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 4000; ++trial) {
    const bool wide64 = trial % 4 == 3;
    const int G = 1 + int(rng() % 6);
    std::vector<int64_t> off(static_cast<size_t>(G + 1));
    for (int g = 1; g <= G; ++g)
      off[size_t(g)] = off[size_t(g - 1)] + (wide64 && rng() % 2 ? 64 : int64_t(rng() % (wide64 ? 70 : 40)));
    if (trial % 3 == 1) off[size_t(rng() % uint64_t(G + 1))] = int64_t(rng() % 60) - 10;  // malformed
    const int64_t total = off[size_t(G)] < 0 ? 0 : off[size_t(G)];
    const int64_t small = wide64 ? bk::cuda::thread_bucket_lo(64) : trial % 3 == 0 ? 8 : (trial % 3 == 1 ? 16 : 32);
    const int64_t bound = wide64 ? 64 : small + int64_t(rng() % 30);  // the second kernel's cap (>= small)
    std::vector<int> writes(static_cast<size_t>(total), 0);
    for (int g = 0; g < G; ++g) {
      for (int kernel = 0; kernel < (bound > small ? 2 : 1); ++kernel) {
        const GroupSpan s = kernel == 0 ? bk::cuda::bucket_group(off[g], off[g + 1], total, 0, small, bound)
                                        : bk::cuda::bucket_group(off[g], off[g + 1], total, small, bound, bound);
        expect(0 <= s.lo && s.lo <= s.hi && s.hi <= total, "bucket_group span inside [0, total]", g, kernel);
        if (s.action == bk::cuda::GROUP_SKIP) continue;
        if (s.action == bk::cuda::GROUP_COMPUTE)
          expect(s.hi - s.lo <= (kernel == 0 ? small : bound), "a kernel computes only groups it can hold", g, kernel);
        for (int64_t i = s.lo; i < s.hi; ++i) ++writes[size_t(i)];
      }
    }
    // (Malformed offsets may leave samples in no group, or in two overlapping spans: only the
    // bounds above are checked then.)
    bool well_formed = off[0] == 0;
    for (int g = 0; g < G; ++g) well_formed = well_formed && off[g] >= 0 && off[g] <= off[g + 1];
    if (well_formed)
      for (int64_t i = 0; i < total; ++i) expect(writes[size_t(i)] == 1, "every sample has exactly one writer", trial, i);
  }
}

// The small-group kernel clips float outputs after rounding (clip_rounded): the same float as
// rounding the double clip (finish_value), for values, bounds and NaN alike.
void test_clip_after_rounding() {
  std::mt19937_64 rng(3);
  const double specials[] = {0.0, -0.0, 1.0, -1.0, 1e-40, -1e-40, 3.4e38, -3.4e38, 1e39, -1e39, 1e300, -1e300,
                             kInf, -kInf, std::nan(""), 0.1, 1.0 + 1e-9, 1.0 - 1e-9};
  auto draw_value = [&]() {
    const uint64_t r = rng() % 4;
    if (r == 0) return specials[rng() % (sizeof(specials) / sizeof(specials[0]))];
    if (r == 1) return double(float(std::normal_distribution<double>(0.0, 1.0)(rng))) * (1.0 + 1e-12);
    return std::normal_distribution<double>(0.0, 2.0)(rng);
  };
  for (int trial = 0; trial < 200000; ++trial) {
    bk::Params p{};
    p.code = bk::GRPO;
    p.mean_scale = 1;
    double lo = draw_value(), hi = draw_value();
    if (std::isnan(lo)) lo = -kInf;
    if (std::isnan(hi)) hi = kInf;
    if (lo > hi) std::swap(lo, hi);
    if (trial % 5 == 0) lo = -kInf, hi = kInf;  // no clip, the default
    p.clip_lo = lo, p.clip_hi = hi;
    const double a = draw_value();
    const float want = float(bk::clip_value(p, a));
    const float got = bk::cuda::clip_rounded(float(a), float(lo), float(hi));
    expect(std::isnan(want) ? std::isnan(got) : std::memcmp(&want, &got, sizeof(got)) == 0 || (want == 0.0f && got == 0.0f),
           "clip after rounding == rounding after the clip", trial);
  }
}

// bfloat16 rounding on the host, to nearest even through float, as the device's
// __float2bfloat16_rn(float(v)) (the round_to_dtype of advantages.cu).
float round_bf16(double v) {
  float f = float(v);
  if (!(std::fabs(f) < kInf)) return f;
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  u += 0x7fffu + ((u >> 16) & 1u);
  u &= 0xffff0000u;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// The tiles' delta clamp (clamp_float_delta, in float against bounds rounded to the dtype) gives
// what clamp_delta gives: NaN for a non-finite delta, else the clamp in double, then the rounding
// to the dtype. float32 and bfloat16 (the coarsest dtype a tile holds), with bounds next to the
// deltas, zero, infinite and off.
void test_delta_clamp() {
  std::mt19937_64 rng(5);
  const double specials[] = {0.0, -0.0, 1.0, -1.0, 0.2, -0.2, 1e-40, 3.4e38, -3.4e38, 1e39, kInf, -kInf, std::nan("")};
  for (int bf16 = 0; bf16 < 2; ++bf16) {
    auto round = [&](double v) { return bf16 ? round_bf16(v) : float(v); };
    for (int trial = 0; trial < 200000; ++trial) {
      const uint64_t r = rng() % 4;
      const double raw = r == 0 ? specials[rng() % (sizeof(specials) / sizeof(specials[0]))]
                                : std::normal_distribution<double>(0.0, 2.0)(rng);
      const float d = round(raw);  // a delta of the dtype
      double c = std::fabs(std::normal_distribution<double>(0.0, 1.5)(rng));
      if (trial % 7 == 0) c = std::fabs(double(d)) * (1.0 + (double(rng() % 5) - 2.0) * 1e-9);  // at the delta
      if (trial % 11 == 0) c = trial % 2 ? 0.0 : kInf;
      if (std::isnan(c)) c = 1.0;
      const bool clamp = trial % 5 != 0;
      double dl = double(d);
      float want;
      if (!(std::fabs(dl) < kInf)) {
        want = NAN;
      } else if (clamp) {
        dl = dl < -c ? -c : (dl > c ? c : dl);
        want = round(dl);
      } else {
        want = d;
      }
      const double got_d = bk::cuda::clamp_float_delta(d, clamp, round(-c), round(c));
      const float got = float(got_d);
      expect(double(got) == got_d || std::isnan(got_d), "the clamped delta is a float", trial);
      expect(std::isnan(want) ? std::isnan(got) : std::memcmp(&want, &got, sizeof(got)) == 0,
             bf16 ? "bfloat16 delta clamp in float == rounded double clamp" : "float32 delta clamp in float == rounded double clamp",
             trial);
    }
  }
}

// The positions of one thread's copy as the device visits them (copy_rounds, advantages.cu: a
// fixed number of rounds, round r at position first + r * step if below len, at tile slot
// copy_round_slot). Checks that the rounds reach every position the plain loop over [first, len)
// reaches, in the same order, and that each round's slot is tile_slot(at + position) (lines of
// 2^line_bits).
std::vector<int> copy_round_positions(const bk::cuda::TileCopy& c, int rounds, long long tag, int line_bits = 5) {
  std::vector<int> visited, reference;
  const int slot0 = bk::cuda::tile_slot(c.at + c.first, line_bits);
  for (int r = 0; r < rounds; ++r) {
    if (r * c.step >= c.len - c.first) continue;
    const int i = c.first + r * c.step;
    expect(bk::cuda::copy_round_slot(slot0, r, c.step, line_bits) == bk::cuda::tile_slot(c.at + i, line_bits),
           "a round's slot is its position's", tag, i);
    visited.push_back(i);
  }
  for (int i = c.first; i < c.len; i += c.step) reference.push_back(i);
  expect(visited == reference, "the copy's rounds cover its positions", tag, c.len);
  return visited;
}

// One thread's copy in, replayed into `source` (the tensor position each tile slot holds): each
// position must lie inside the tile and the tensors and have no other writer. False (the caller
// stops) when one lies outside.
bool record_copy_in(const bk::cuda::TileCopy& c, int rounds, int tile_size, int64_t total, long long tag,
                    std::vector<int64_t>& source, int line_bits = 5) {
  for (int i : copy_round_positions(c, rounds, tag, line_bits)) {
    const bool inside = c.at + i >= 0 && c.at + i < tile_size && c.lo + i >= 0 && c.lo + i < total;
    expect(inside, "copy inside the tile and the tensors", tag, c.at + i);
    if (!inside) return false;
    expect(source[size_t(c.at + i)] == -1, "one writer per tile slot", tag, c.at + i);
    source[size_t(c.at + i)] = c.lo + i;
  }
  return true;
}

// The small-group kernel's tile (advantages.cu, thread_kernel): a block of 128 threads takes it
// when every live group passes thread_tile_fits; then its groups must tile [0, len) exactly (each
// position read, computed and written back by one thread, and by the kernel that computes it),
// with len <= 128 W, and the slots of a warp reading sample j of full groups fall in 32 banks (the
// tile's lines: tile_line_bits(W), 32 samples or 64 at W = 64).
void test_tile() {
  const int kBlock = 128;
  std::mt19937_64 rng(11);
  for (int W : {8, 16, 32, 64}) {
    const int lb = bk::cuda::tile_line_bits(W);
    const int tile_words = bk::cuda::tile_slot(kBlock * W - 1, lb) + 1;
    for (int j = 0; j < W; ++j)
      for (int warp = 0; warp < kBlock / 32; ++warp) {
        unsigned banks = 0;
        for (int t = 32 * warp; t < 32 * warp + 32; ++t) banks |= 1u << (bk::cuda::tile_slot(t * W + j, lb) % 32);
        expect(banks == 0xffffffffu, "full groups: a warp's reads of sample j hit 32 banks", W, j);
      }
    for (int p = 1; p < kBlock * W; ++p)
      expect(bk::cuda::tile_slot(p, lb) > bk::cuda::tile_slot(p - 1, lb) && bk::cuda::tile_slot(p, lb) < tile_words,
             "tile slots increase inside the tile", W, p);
    for (int base = 0; base < kBlock * W; ++base) {  // tile_in_one_line: the one-line groups' constant offsets
      expect(base % W != 0 || bk::cuda::tile_in_one_line(base, W, lb), "a group of W at a multiple of W is in one line", W,
             base);
      for (int n = 1; n <= W && base + n <= kBlock * W; ++n) {
        bool linear = true;
        for (int i = 0; i < n; ++i) linear = linear && bk::cuda::tile_slot(base + i, lb) == bk::cuda::tile_slot(base, lb) + i;
        expect(bk::cuda::tile_in_one_line(base, n, lb) == linear, "one line exactly when the slots run on", W, base);
      }
    }
    for (int trial = 0; trial < 2000; ++trial) {
      const int G = 1 + int(rng() % 300);
      std::vector<int64_t> off(static_cast<size_t>(G + 1));
      const int top = trial % 4 == 0 ? 3 * W : W + 1;  // some groups above W
      for (int g = 1; g <= G; ++g) off[size_t(g)] = off[size_t(g - 1)] + int64_t(rng() % uint64_t(top));
      if (trial % 5 == 1) off[size_t(rng() % uint64_t(G + 1))] = int64_t(rng() % 200) - 20;  // malformed
      const int64_t total = std::max<int64_t>(off[size_t(G)], 0) + int64_t(trial % 3 == 2 ? 5 : 0);
      for (int64_t g0 = 0; g0 < G; g0 += kBlock) {
        const int64_t last = std::min<int64_t>(G, g0 + kBlock);
        bool fits = true;  // (at W = 64 few of these random blocks fit: test_thread_copy draws full ones)
        for (int64_t g = g0; g < last; ++g) fits = fits && bk::cuda::thread_tile_fits(off[g], off[g + 1], total, W);
        if (!fits) continue;
        const int64_t lo = off[size_t(g0)], len = off[size_t(last)] - lo;
        expect(lo >= 0 && len >= 0 && len <= int64_t(kBlock) * W && lo + len <= total, "tile span inside", W, len);
        std::vector<int> owner(static_cast<size_t>(std::max<int64_t>(len, 0)), 0);
        for (int64_t g = g0; g < last; ++g) {
          const GroupSpan s = bk::cuda::bucket_group(off[g], off[g + 1], total, bk::cuda::thread_bucket_lo(W), W, W);
          expect(s.action != bk::cuda::GROUP_NAN_FILL, "a fitting group is computed or empty", W, g);
          for (int64_t i = s.lo; i < s.hi; ++i)
            if (i - lo >= 0 && i - lo < len) ++owner[size_t(i - lo)];
        }
        for (int64_t i = 0; i < len; ++i) expect(owner[size_t(i)] == 1, "each tile position has one owner", W, i);
      }
    }
  }
}

// The small-group kernel's copies (thread_copy) replayed for every thread of every block, as in
// test_segment_copy: each tile slot has at most one writer and lies inside the tile, each computed
// group finds its samples at its tile position (base = at + span.lo - lo), and the copy out writes
// every computed sample once and nothing else. At W = 64 (the groups of exactly 64:
// thread_bucket_lo) every computed group also lies in one line of the tile, as the kernel's only
// copy of the group code assumes.
void test_thread_copy() {
  const int kBlock = 128;
  std::mt19937_64 rng(14);
  int whole = 0, own = 0, whole64 = 0;
  for (int W : {8, 16, 32, 64}) {
    const int lb = bk::cuda::tile_line_bits(W);
    const int kTile = kBlock * W, bound = 4 * W;
    const int64_t n_lo = bk::cuda::thread_bucket_lo(W);
    for (int trial = 0; trial < 600; ++trial) {
      const int G = 1 + int(rng() % 300);
      std::vector<int64_t> off(static_cast<size_t>(G + 1));
      const int top = trial % 3 == 0 ? 2 * W : W + 1;  // a third of the trials: many groups above W
      // At W = 64 a third of the trials: groups of exactly 64 (the [G, 64] batch), one in 500 not.
      const bool full = W == 64 && trial % 3 == 2;
      for (int g = 1; g <= G; ++g)
        off[size_t(g)] = off[size_t(g - 1)] + (full && rng() % 500 ? W : int64_t(rng() % uint64_t(top)));
      if (trial % 7 == 3) off[size_t(rng() % uint64_t(G + 1))] = int64_t(rng() % 300) - 20;  // malformed
      const int64_t total = std::max<int64_t>(off[size_t(G)], 0) + 3;
      for (int64_t g0 = 0; g0 < G; g0 += kBlock) {
        const int64_t last = std::min<int64_t>(G, g0 + kBlock);
        bool whole_block = true;
        for (int64_t g = g0; g < last; ++g)
          whole_block = whole_block && bk::cuda::thread_tile_fits(off[g], off[g + 1], total, W);
        const int64_t block_lo = whole_block ? off[size_t(g0)] : 0, block_hi = whole_block ? off[size_t(last)] : 0;
        std::vector<int64_t> source(static_cast<size_t>(kTile), -1);
        std::vector<int> written(static_cast<size_t>(total), 0), computed(static_cast<size_t>(total), 0);
        std::vector<GroupSpan> spans(kBlock);
        std::vector<bk::cuda::TileCopy> copies(kBlock);
        for (int t = 0; t < kBlock; ++t) {  // copy in for every thread, then check and copy out
          const int64_t g = g0 + t;
          spans[size_t(t)] = g < G ? bk::cuda::bucket_group(off[g], off[g + 1], total, n_lo, W, bound)
                                   : GroupSpan{0, 0, bk::cuda::GROUP_SKIP};
          copies[size_t(t)] = bk::cuda::thread_copy(whole_block, block_lo, block_hi, spans[size_t(t)], t, W, kBlock);
          if (!record_copy_in(copies[size_t(t)], W, kTile, total, W, source, lb)) return;
        }
        for (int t = 0; t < kBlock; ++t) {
          const GroupSpan& span = spans[size_t(t)];
          const auto& c = copies[size_t(t)];
          if (span.action == bk::cuda::GROUP_COMPUTE) {
            const int64_t base = c.at + (span.lo - c.lo);
            if (W == 64)
              expect(span.hi - span.lo == W && bk::cuda::tile_in_one_line(int(base), W, lb),
                     "thread_kernel<64> computes only full groups in one line", base, span.hi - span.lo);
            for (int64_t j = 0; j < span.hi - span.lo; ++j) {
              expect(base + j >= 0 && base + j < kTile && source[size_t(base + j)] == span.lo + j, "a thread finds its samples",
                     W, j);
              ++computed[size_t(span.lo + j)];
            }
          }
          for (int i : copy_round_positions(c, W, W, lb)) ++written[size_t(c.lo + i)];
        }
        ++(whole_block ? whole : own);
        whole64 += W == 64 && whole_block;
        for (int64_t i = 0; i < total; ++i)
          expect(written[size_t(i)] == computed[size_t(i)], "the copy out writes each computed sample once", W, i);
      }
    }
  }
  expect(whole > 300 && own > 300, "both thread copies are exercised", whole, own);
  expect(whole64 > 100, "thread_kernel<64>'s blocks take the tile", whole64, 0);
}

// Offsets of G groups for the segment kernel's tests: mostly sizes it computes, (16, cap]; about
// one group in `odd` is small (16 or fewer: the small-group kernel's) or one sample too large.
std::vector<int64_t> segment_offsets(std::mt19937_64& rng, int G, int cap, int odd) {
  const int kLo = 16;
  std::vector<int64_t> off(static_cast<size_t>(G + 1));
  for (int g = 1; g <= G; ++g) {
    const int kind = int(rng() % uint64_t(odd));
    const int64_t n = kind == 0 ? int64_t(rng() % (kLo + 1)) : kind == 1 ? cap + 1 : kLo + 1 + int64_t(rng() % uint64_t(cap - kLo));
    off[size_t(g)] = off[size_t(g - 1)] + n;
  }
  return off;
}

// The segment kernel's launches: P lanes per group, sizes (n_lo, n_hi]. Mostly the second kernel
// (n_lo = 16, n_hi = 16 P); for the kWide and kWideOffPolicy calls at a bound of 64 the first,
// (0, 63], or the only one, (0, 64], where a device cannot give thread_kernel<64> of
// kWideOffPolicy its shared memory.
struct SegmentBucket {
  int P, n_lo, n_hi;
};
const SegmentBucket kSegmentBuckets[] = {{2, 16, 32}, {4, 16, 64}, {4, 0, 63}, {4, 0, 64},
                                         {8, 16, 128}, {16, 16, 256}, {32, 16, 512}};

// Whether the block of groups [g0, last) takes the whole-block tile: every group passes segment_tile_fits.
bool segment_block_fits(const std::vector<int64_t>& off, int64_t g0, int64_t last, int64_t total, const SegmentBucket& b) {
  bool fits = true;
  for (int64_t g = g0; g < last; ++g) fits = fits && bk::cuda::segment_tile_fits(off[g], off[g + 1], total, b.n_lo, b.n_hi);
  return fits;
}

// The segment kernel's tile (advantages.cu, segment_kernel<P>): a block of 128 threads, 128 / P
// groups, takes it when every live group passes segment_tile_fits; then its groups must tile
// [0, len) exactly, len <= 128 * 16, and each position must belong to a group that the segment
// kernel computes (its copy out must not overwrite what the launch's other kernel wrote).
void test_segment_tile() {
  const int kBlock = 128, kItems = 16;
  std::mt19937_64 rng(12);
  int taken = 0;
  for (const SegmentBucket& b : kSegmentBuckets) {
    const int P = b.P, cap = P * kItems, groups = kBlock / P;
    for (int trial = 0; trial < 2000; ++trial) {
      const int G = 1 + int(rng() % 200);
      std::vector<int64_t> off = segment_offsets(rng, G, cap, 50);
      if (trial % 5 == 1) off[size_t(rng() % uint64_t(G + 1))] = int64_t(rng() % 200) - 20;  // malformed
      const int64_t total = std::max<int64_t>(off[size_t(G)], 0) + int64_t(trial % 3 == 2 ? 5 : 0);
      for (int64_t g0 = 0; g0 < G; g0 += groups) {
        const int64_t last = std::min<int64_t>(G, g0 + groups);
        if (!segment_block_fits(off, g0, last, total, b)) continue;
        ++taken;
        const int64_t lo = off[size_t(g0)], len = off[size_t(last)] - lo;
        expect(lo >= 0 && len > 0 && len <= int64_t(kBlock) * kItems && lo + len <= total, "segment tile span inside", P, len);
        std::vector<int> owner(static_cast<size_t>(std::max<int64_t>(len, 0)), 0);
        for (int64_t g = g0; g < last; ++g) {
          const GroupSpan s = bk::cuda::bucket_group(off[g], off[g + 1], total, b.n_lo, b.n_hi, cap);
          expect(s.action == bk::cuda::GROUP_COMPUTE, "a fitting group is computed by the segment kernel", P, g);
          for (int64_t i = s.lo; i < s.hi; ++i)
            if (i - lo >= 0 && i - lo < len) ++owner[size_t(i - lo)];
        }
        for (int64_t i = 0; i < len; ++i) expect(owner[size_t(i)] == 1, "each segment tile position has one owner", P, i);
      }
    }
  }
  expect(taken > 1000, "blocks take the segment tile", taken, 0);
}

// The segment kernel's copies (segment_copy) replayed for every thread of every block, as the
// kernel computes its arguments: each tile slot is written by at most one thread and lies inside
// the tile; each computed group finds its own samples at its tile position (io.at = at + span.lo -
// lo); the copy out writes every sample of a computed group exactly once and nothing else (once
// per group: malformed offsets can give two groups the same samples, as without the tile).
void test_segment_copy() {
  const int kBlock = 128, kItems = 16, kTile = kBlock * kItems;
  std::mt19937_64 rng(13);
  int whole = 0, own = 0;
  for (const SegmentBucket& b : kSegmentBuckets) {
    const int P = b.P, cap = P * kItems, groups = kBlock / P;
    for (int trial = 0; trial < 600; ++trial) {
      const int G = 1 + int(rng() % 100);
      std::vector<int64_t> off = segment_offsets(rng, G, cap, trial % 2 ? 4 : 60);  // half the trials: many odd sizes
      if (trial % 7 == 3) off[size_t(rng() % uint64_t(G + 1))] = int64_t(rng() % 300) - 20;  // malformed
      const int64_t total = std::max<int64_t>(off[size_t(G)], 0) + 3;
      const bool in_tile = trial % 9 != 0;  // float64: no copies
      for (int64_t g0 = 0; g0 < G; g0 += groups) {
        const int64_t last = std::min<int64_t>(G, g0 + groups);
        const bool whole_block = segment_block_fits(off, g0, last, total, b);
        const int64_t block_lo = whole_block ? off[size_t(g0)] : 0, block_hi = whole_block ? off[size_t(last)] : 0;
        std::vector<int64_t> source(kTile, -1);  // the tensor position each tile slot holds
        std::vector<int> written(static_cast<size_t>(total), 0);
        std::vector<int> computed(static_cast<size_t>(total), 0);  // (malformed offsets can overlap two groups)
        std::vector<bk::cuda::TileCopy> copies(kBlock);
        for (int pass = 0; pass < 2; ++pass)  // copy in for every thread, then check and copy out
          for (int t = 0; t < kBlock; ++t) {
            const int64_t g = g0 + t / P;
            const bool live = g < G;
            const GroupSpan span = live ? bk::cuda::bucket_group(off[g], off[g + 1], total, b.n_lo, b.n_hi, cap)
                                        : GroupSpan{0, 0, bk::cuda::GROUP_SKIP};
            const bool compute = span.action == bk::cuda::GROUP_COMPUTE;
            if (pass == 0) {
              const auto c = bk::cuda::segment_copy(in_tile, whole_block, block_lo, block_hi, span, compute, t, P, kItems, kBlock);
              copies[size_t(t)] = c;
              if (!record_copy_in(c, kItems, kTile, total, P, source)) return;
              continue;
            }
            const auto& c = copies[size_t(t)];
            if (compute && in_tile && t % P == 0) {  // the group's lanes read at io.at = at + span.lo - lo
              const int64_t at = c.at + (span.lo - c.lo);
              for (int64_t j = 0; j < span.hi - span.lo; ++j) {
                expect(at + j >= 0 && at + j < kTile && source[size_t(at + j)] == span.lo + j, "a group finds its samples",
                       P, j);
                ++computed[size_t(span.lo + j)];
              }
            }
            for (int i : copy_round_positions(c, kItems, P)) ++written[size_t(c.lo + i)];
          }
        (whole_block ? whole : own) += in_tile;
        for (int64_t i = 0; i < total; ++i)
          expect(written[size_t(i)] == computed[size_t(i)], "the copy out writes each computed sample once", P, i);
      }
    }
  }
  expect(whole > 500 && own > 500, "both copies are exercised", whole, own);
}

}  // namespace

int main() {
  test_classify_group();
  test_total_order();
  test_groups("block kernel (radix order)", {64, 256});
  test_lane_sorts();
  test_bucket_group();
  test_clip_after_rounding();
  test_delta_clamp();
  test_tile();
  test_segment_tile();
  test_thread_copy();
  test_segment_copy();
  std::printf("%d checks, %d failures\n", checks, failures);
  return failures == 0 ? 0 : 1;
}
