// Host tests of the CUDA kernels' safety logic (csrc/cuda/guards.h), on adversarial inputs: the
// functions the kernels call are compiled here as plain C++, and the kernels' prologue, sort and
// stores are emulated lane by lane (shuffles as array reads), so CI without a GPU checks:
//   * classify_group: every index a kernel may touch lies in [0, total), for malformed offsets
//     (negative, decreasing, past the end) and undersized launch bounds;
//   * the sub-warp kernel (W = 8, 16, 32): bitonic network over the total order is a permutation
//     for any keys (NaN, -NaN, +-inf, -0, subnormals), and the whole group flow writes every sample
//     exactly once, inside the group, NaN for a group with a non-finite value;
//   * the block kernel's flow (radix order of the keys, as cub::BlockRadixSort orders doubles);
//   * the checks can fail: the flows before the fix (NaN/inf not pre-checked, stores gated by
//     sorted position only, the IEEE compare in the network) are run through the same checks and
//     must be caught writing outside the group or leaving samples unwritten.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

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

// The kernels' network with the guards.h order (shuffle = read the partner's lane of the arrays).
void bitonic_fixed(int W, std::vector<double>& key, std::vector<int>& idx) {
  for (int size = 2; size <= W; size <<= 1)
    for (int stride = size / 2; stride > 0; stride >>= 1) {
      const std::vector<double> k0 = key;
      const std::vector<int> i0 = idx;
      for (int lane = 0; lane < W; ++lane) {
        const int p = lane ^ stride;
        if (bk::cuda::bitonic_take_partner(lane, size, stride, k0[lane], i0[lane], k0[p], i0[p])) {
          key[lane] = k0[p];
          idx[lane] = i0[p];
        }
      }
    }
}

// The network before the fix: IEEE compare (pk < key || (pk == key && pi < idx)).
void bitonic_ieee(int W, std::vector<double>& key, std::vector<int>& idx) {
  for (int size = 2; size <= W; size <<= 1)
    for (int stride = size / 2; stride > 0; stride >>= 1) {
      const std::vector<double> k0 = key;
      const std::vector<int> i0 = idx;
      for (int lane = 0; lane < W; ++lane) {
        const int p = lane ^ stride;
        const bool ascending = (lane & size) == 0, lower = (lane & stride) == 0;
        const bool partner_less = k0[p] < k0[lane] || (k0[p] == k0[lane] && i0[p] < i0[lane]);
        if ((lower == ascending) ? partner_less : !partner_less) {
          key[lane] = k0[p];
          idx[lane] = i0[p];
        }
      }
    }
}

// cub::BlockRadixSort on double keys: ascending in the sign-flipped bit order (positive NaN after
// +inf, negative NaN before -inf), stable in the index.
void radix_order(std::vector<double>& key, std::vector<int>& idx) {
  std::vector<int> perm(key.size());
  std::iota(perm.begin(), perm.end(), 0);
  std::stable_sort(perm.begin(), perm.end(), [&](int a, int b) {
    return bk::cuda::orderable_bits64(key[a]) < bk::cuda::orderable_bits64(key[b]);
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
enum class Network { kWarp, kBlock };

struct Outcome {
  bool wrote_outside = false;   // a store outside [base, base + n) of the output
  bool left_unwritten = false;  // a sample of the group never stored
  bool wrong_nan = false;       // NaN contract broken (fixed flow only checks this)
};

// One group of n values at `base` of an output with guard slots around it; `slots` sort entries
// (W lanes, or BLOCK * ITEMS), padding +inf with indices n..slots-1, as the kernels do.
Outcome run_group(Network net, Flow flow, int slots, const std::vector<double>& vals) {
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
  if (net == Network::kWarp) {
    if (flow == Flow::kFixed) bitonic_fixed(slots, key, idx);
    else bitonic_ieee(slots, key, idx);
  } else {
    radix_order(key, idx);
  }
  if (flow == Flow::kFixed && !is_permutation_of_lanes(idx)) {
    expect(false, "the fixed network is a permutation of the lanes", slots, n);
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

void test_groups(Network net, const char* name, const std::vector<int>& slot_counts) {
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
      const Outcome fixed = run_group(net, Flow::kFixed, slots, vals);
      expect(!fixed.wrote_outside, "fixed flow: no store outside the group", slots, n);
      expect(!fixed.left_unwritten, "fixed flow: every sample stored exactly once", slots, n);
      expect(!fixed.wrong_nan, "fixed flow: NaN exactly for groups with a non-finite value", slots, n);
      const Outcome before = run_group(net, Flow::kBeforeFix, slots, vals);
      if (before.wrote_outside || before.left_unwritten) ++caught_before_fix;
    }
    // Deterministic cases from the issue: a NaN in a full group; a real +inf tying with padding.
    std::vector<double> nan_last(size_t(slots - 1), 0.5);
    nan_last[0] = std::nan("");
    const Outcome a = run_group(net, Flow::kBeforeFix, slots, nan_last);
    const Outcome b = run_group(net, Flow::kFixed, slots, nan_last);
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
      const bool ab = bk::cuda::entry_less(a, 0, b, 1), ba = bk::cuda::entry_less(b, 1, a, 0);
      expect(ab != ba, "entry_less is a strict total order (exactly one direction)");
      if (!std::isnan(a) && !std::isnan(b) && a < b) expect(ab, "entry_less agrees with < on numbers");
    }
  expect(!bk::cuda::finite_value(std::nan("")) && !bk::cuda::finite_value(kInf) && !bk::cuda::finite_value(-kInf) &&
             bk::cuda::finite_value(5e-324) && bk::cuda::finite_value(-1e308),
         "finite_value");
}

}  // namespace

int main() {
  test_classify_group();
  test_total_order();
  test_groups(Network::kWarp, "sub-warp bitonic network (W = 8, 16, 32)", {8, 16, 32});
  test_groups(Network::kBlock, "block kernel (radix order)", {64, 256});
  std::printf("%d checks, %d failures\n", checks, failures);
  return failures == 0 ? 0 : 1;
}
