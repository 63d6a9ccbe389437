// Unit tests of the per-group mathematics (group_math.h) against brute-force enumeration over all
// k-subsets, for n = 1..9 and every k, on random rewards with ties. Run by ctest (CMakeLists.txt).
// Two executors are checked: SerialExec (cached recurrence tables, what the CPU kernel runs) and
// ScanTablesExec (tables from the generic product scan, what the CUDA executors run); the lane
// executor computing each set of calls the CUDA small-group kernel is built for (LaneCalls) is
// checked against the lane computing every call, the pack executor (several groups per vector
// register, the CPU kernel) against the lane executor, and the segment executor (the CUDA kernel
// of groups of 17..512) against SerialExec, its lanes played by host threads.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "bonkernels/group_math.h"
#include "bonkernels/lane_exec.h"
#include "bonkernels/pack_exec.h"
#include "bonkernels/segment_exec.h"
#include "bonkernels/serial_exec.h"

namespace {

int failures = 0;
int checks = 0;

void expect_close(double got, double want, double tol, const char* what, int n, int k, int i) {
  ++checks;
  const bool ok = got == want || (std::isnan(want) && std::isnan(got)) || std::fabs(got - want) <= tol * (1.0 + std::fabs(want));
  if (!ok) {
    if (failures < 20) std::printf("FAIL %s n=%d k=%d i=%d: got %.17g want %.17g\n", what, n, k, i, got, want);
    ++failures;
  }
}

struct ScanTablesExec : bk::SerialExec {
  void weights(int N, int K, Vec& at) { bk::weights_by_scan<ScanTablesExec, false>(*this, N, K, at, at); }
  void weights2(int N, int K, Vec& at, Vec& prev) { bk::weights_by_scan<ScanTablesExec, true>(*this, N, K, at, prev); }
  template <class Body>
  bool tables(const bk::Params& p, int code, int k, Body body) { return bk::with_tables(*this, p, code, k, body); }
};

// Run one estimator on one group (any order); values back in the original order, natural scale.
// The parameters of one call in the natural scale, no clamp, no clip (base: bank and rules).
bk::Params call_params(int code, int k, double eps, const bk::Params* base) {
  bk::Params p{};
  if (base) p = *base;
  p.k = k;
  p.code = code;
  p.has_clamp = 0;
  p.clip_lo = -INFINITY;
  p.clip_hi = INFINITY;
  p.mean_scale = bk::natural_scale_is_mean(code) ? 1 : 0;
  p.eps = eps;
  return p;
}

template <class Ex>
std::vector<double> run(int code, const std::vector<double>& g, const std::vector<double>& delta, int k,
                        double eps = 1e-6, const bk::Params* base = nullptr) {
  const int n = int(g.size());
  const bk::Params p = call_params(code, k, eps, base);
  std::vector<std::pair<double, int32_t>> pairs(n);
  for (int i = 0; i < n; ++i) pairs[i] = {g[i], i};
  bk::sort_pairs(pairs.data(), n);
  Ex ex;
  ex.begin_group(n);
  typename Ex::Vec x, d;
  ex.alloc(x);
  ex.alloc(d);
  for (int s = 0; s < n; ++s) {
    x[s] = pairs[s].first;
    d[s] = delta.empty() ? 0.0 : delta[pairs[s].second];
  }
  bk::compute_group(ex, p, x, d);
  std::vector<double> out(n);
  for (int s = 0; s < n; ++s) out[pairs[s].second] = ex.values()[s];
  return out;
}

// The lane executor of width W as run() drives it, its slots (the sink) marked as the CUDA
// small-group kernel marks them.
template <int W, class Slots>
struct TestLane : bk::LaneExec<W, Slots> {
  void begin_group(int n) { this->set_size(n); }
  const double* values() const { return this->sink.v; }
};

// The lane executor computing one set of calls (bk::LaneCalls), as the CUDA small-group kernel's
// instantiations do (kAll: every call).
template <int W, bk::LaneCalls C>
struct CallsSlots : bk::SlotValues<W> {
  static constexpr bk::LaneCalls kCalls = C;
};
template <int W, bk::LaneCalls C = bk::LaneCalls::kAll>
using SetLane = TestLane<W, CallsSlots<W, C>>;

// ---------------------------------------------------------------- brute force over subsets

double binom(int a, int b) {
  if (b < 0 || a < 0 || b > a) return 0.0;
  double r = 1.0;
  for (int i = 1; i <= b; ++i) r = r * (a - b + i) / i;
  return r;
}

int popcount(unsigned m) { return __builtin_popcount(m); }

double subset_max(const std::vector<double>& g, unsigned m) {
  double r = -INFINITY;
  for (size_t i = 0; i < g.size(); ++i)
    if (m >> i & 1u) r = std::max(r, g[i]);
  return r;
}

// Average over k-subsets of `set` (bitmask) of f(subset).
template <class F>
double subset_average(int n, unsigned set, int k, F f) {
  double sum = 0.0;
  for (unsigned m = 0; m < (1u << n); ++m)
    if ((m & ~set) == 0 && popcount(m) == k) sum += f(m);
  return sum / binom(popcount(set), k);
}

// (1/C(|set|,k)) sum_{I subset of set, |I| = k, i in I} f(I)
template <class F>
double subset_sum_containing(int n, unsigned set, int k, int i, F f) {
  double sum = 0.0;
  for (unsigned m = 0; m < (1u << n); ++m)
    if ((m & ~set) == 0 && popcount(m) == k && (m >> i & 1u)) sum += f(m);
  return sum / binom(popcount(set), k);
}

double mean_of(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return s / v.size();
}

std::vector<double> zscore(const std::vector<double>& v, double eps, double rtol) {
  const int n = int(v.size());
  const double m = mean_of(v);
  double ss = 0, scale = 0;
  for (double x : v) ss += (x - m) * (x - m), scale = std::max(scale, std::fabs(x));
  const double sd = std::sqrt(ss / std::max(n - 1, 1));
  std::vector<double> r(n, 0.0);
  if (n < 2 || sd <= rtol * scale) return r;
  for (int i = 0; i < n; ++i) r[i] = (v[i] - m) / (sd + eps);
  return r;
}

template <class Ex>
void check_group(const std::vector<double>& g, const std::vector<double>& delta, bool binary) {
  const int n = int(g.size());
  const unsigned all = (1u << n) - 1u;
  const double tol = 1e-12;
  for (int k = 1; k <= n; ++k) {
    std::vector<double> s(n);
    for (int i = 0; i < n; ++i)
      s[i] = subset_sum_containing(n, all, k, i, [&](unsigned m) { return subset_max(g, m); });
    const double maxk = subset_average(n, all, k, [&](unsigned m) { return subset_max(g, m); });

    auto a = run<Ex>(bk::MAXK, g, {}, k);
    for (int i = 0; i < n; ++i) expect_close(a[i], s[i], tol, "maxk", n, k, i);

    if (k <= n - 1) {
      auto loo = run<Ex>(bk::MAXK_LOO, g, {}, k);
      auto cen = run<Ex>(bk::MAXK_LOO_CENTERED, g, {}, k);
      for (int i = 0; i < n; ++i) {
        const unsigned rest = all & ~(1u << i);
        double b = 0.0;  // sum_{j != i} S(j, k, rest)
        for (int j = 0; j < n; ++j)
          if (j != i) b += subset_sum_containing(n, rest, k, j, [&](unsigned m) { return subset_max(g, m); });
        expect_close(loo[i], s[i] - b / (n - 1), tol, "maxk_loo", n, k, i);
        const double rest_maxk = subset_average(n, rest, k, [&](unsigned m) { return subset_max(g, m); });
        expect_close(cen[i], s[i] - double(k) / n * rest_maxk, tol, "maxk_loo_centered", n, k, i);
      }
    }

    auto l1 = run<Ex>(bk::MAXK_LOO1, g, {}, k);
    for (int i = 0; i < n; ++i) {
      double want;
      if (k == 1) {
        double others = 0;
        for (int j = 0; j < n; ++j)
          if (j != i) others += g[j];
        want = n > 1 ? (g[i] - others / (n - 1)) / n : 0.0;
      } else {
        want = subset_sum_containing(n, all, k, i, [&](unsigned m) {
          return subset_max(g, m) - subset_max(g, m & ~(1u << i));
        });
      }
      expect_close(l1[i], want, tol, "maxk_loo1", n, k, i);
    }

    auto off = run<Ex>(bk::MAXK_OFFPOLICY, g, delta, k);
    for (int i = 0; i < n; ++i) {
      const double want = subset_sum_containing(n, all, k, i, [&](unsigned m) {
        double w = 1.0;
        for (int l = 0; l < n; ++l)
          if (m >> l & 1u) w += delta[l];
        return w * subset_max(g, m);
      });
      expect_close(off[i], want, tol, "maxk_offpolicy", n, k, i);
    }

    auto bm = run<Ex>(bk::BON_MEAN, g, {}, k, 1e-6);
    auto zs = zscore(s, 1e-6, bk::kZscoreConstantRtol);
    for (int i = 0; i < n; ++i) expect_close(bm[i], zs[i], 1e-8, "bon_mean", n, k, i);

    if (binary) {
      double c = 0;
      for (double x : g) c += x;
      auto pk = run<Ex>(bk::PASSK, g, {}, k);
      const double rho_rest = (k == 1) ? 0.0 : 1.0 - binom(n - 1 - int(c), k - 1) / binom(n - 1, k - 1);
      for (int i = 0; i < n; ++i)  // PKPO Eq. 8 closed form
        expect_close(pk[i], g[i] == 1.0 ? double(k) / n : double(k) / n * rho_rest, tol, "passk", n, k, i);
      const double R = 1.0 - binom(n - int(c), k) / binom(n, k);
      expect_close(maxk, R, tol, "pass@k", n, k, 0);
      auto ch = run<Ex>(bk::CHEN_PASSK, g, {}, k, 1e-6);
      const bool degenerate = c == 0 || n - c < k;
      const double sigma = std::sqrt(std::max(R * (1 - R), 0.0));
      for (int i = 0; i < n; ++i) {
        const double a_pos = (1 - R) / (sigma + 1e-6);
        const double a_neg = (1 - R - binom(n - int(c) - 1, k - 1) / binom(n - 1, k - 1)) / (sigma + 1e-6);
        expect_close(ch[i], degenerate ? 0.0 : (g[i] == 1.0 ? a_pos : a_neg), 1e-9, "chen_passk", n, k, i);
      }
      const double pf = (n - c) / n;
      auto rlb = run<Ex>(bk::BON_RLB_POS, g, {}, k);
      double geo = 0;
      for (int t = 0; t < k; ++t) geo += std::pow(pf, t);
      const double gbar = k * std::pow(pf, k - 1) / geo;
      for (int i = 0; i < n; ++i)
        expect_close(rlb[i], g[i] == 1.0 ? gbar * R / c * n : 0.0, 1e-10, "bon_rlb_pos", n, k, i);
    }
  }

  // Estimators that ignore k: straight from their definitions.
  const double top = *std::max_element(g.begin(), g.end());
  double second = -INFINITY;
  for (double x : g)
    if (x < top) second = std::max(second, x);
  const double m = mean_of(g);
  auto tang = run<Ex>(bk::TANG_LOO, g, {}, 1);
  auto bmm = run<Ex>(bk::BON_MAX_MEAN, g, {}, 1);
  auto bms = run<Ex>(bk::BON_MAX_SECOND, g, {}, 1);
  auto grpo = run<Ex>(bk::GRPO, g, {}, 1, 1e-6);
  auto rloo = run<Ex>(bk::RLOO, g, {}, 1);
  auto dr = run<Ex>(bk::DR_GRPO, g, {}, 1);
  auto mrl = run<Ex>(bk::MAXRL, g, {}, 1);
  auto z = zscore(g, 1e-6, 0.0);
  for (int i = 0; i < n; ++i) {
    double others_max = -INFINITY, others_sum = 0;
    for (int j = 0; j < n; ++j)
      if (j != i) others_max = std::max(others_max, g[j]), others_sum += g[j];
    expect_close(tang[i], n > 1 ? top - others_max : 0.0, 1e-14, "tang_loo", n, 0, i);
    expect_close(bmm[i], g[i] == top ? g[i] - m : 0.0, 1e-14, "bon_max_mean", n, 0, i);
    expect_close(bms[i], (g[i] == top && second > -INFINITY) ? top - second : 0.0, 1e-14, "bon_max_second", n, 0, i);
    expect_close(grpo[i], z[i], 1e-9, "grpo", n, 0, i);
    expect_close(rloo[i], n > 1 ? g[i] - others_sum / (n - 1) : 0.0, 1e-13, "rloo", n, 0, i);
    expect_close(dr[i], g[i] - m, 1e-14, "dr_grpo", n, 0, i);
    if (std::fabs(m) > 1e-3) expect_close(mrl[i], (g[i] - m) / m, 1e-12, "maxrl", n, 0, i);
  }
}

// Too-small groups, scales, clipping and the unsupported estimator.
void check_rules() {
  std::vector<double> g = {0.3, 0.1, 0.7};
  bk::Params p{};
  p.code = bk::MAXK_LOO;
  p.k = 3;  // k_max = n - 1 = 2
  p.clip_lo = -INFINITY, p.clip_hi = INFINITY;
  bk::GroupK gk = bk::effective_k(p.code, 3, 3, 1);
  expect_close(gk.zero, 1, 0, "zero mode", 3, 3, 0);
  gk = bk::effective_k(p.code, 3, 3, 2);
  expect_close(gk.k, 2, 0, "clamp mode", 3, 3, 0);
  gk = bk::effective_k(p.code, 1, 3, 2);
  expect_close(gk.zero, 1, 0, "clamp to nothing", 1, 3, 0);
  gk = bk::effective_k(bk::GRPO, 1, 5, 0);
  expect_close(gk.zero, 0, 0, "k ignored", 1, 5, 0);
  p.code = bk::MAXK;
  p.mean_scale = 1;
  expect_close(bk::finish_value(p, 4, 0.25, false), 1.0, 0, "mean scale", 4, 0, 0);
  p.code = bk::GRPO;
  p.mean_scale = 0;
  expect_close(bk::finish_value(p, 4, 1.0, false), 0.25, 0, "sum scale", 4, 0, 0);
  p.clip_lo = -0.1, p.clip_hi = 0.2;
  expect_close(bk::finish_value(p, 1, 5.0, false), 0.2, 0, "clip hi", 1, 0, 0);
  expect_close(bk::finish_value(p, 1, -5.0, false), -0.1, 0, "clip lo", 1, 0, 0);
  expect_close(bk::native_supports(bk::MAXK_OFFPOLICY_EXACT), 0, 0, "exact is reference-only", 0, 0, 0);
}

// Constant groups give exactly 0 for every estimator that centres or z-scores, at every eps
// including 0; the z-score survives values near the largest double and subnormal residues.
void check_constant_and_extremes() {
  const int centred[] = {bk::GRPO, bk::RLOO, bk::DR_GRPO, bk::BON_MEAN, bk::BON_MAX_MEAN, bk::MAXRL};
  for (int n = 1; n <= 40; ++n)
    for (double v : {0.5402, -3.1, 1e-3, 0.0, 7.25, 1e300, -1.7e308})
      for (double eps : {0.0, 1e-6})
        for (int code : centred) {
          auto a = run<bk::SerialExec>(code, std::vector<double>(n, v), {}, 1 + n / 3, eps);
          for (int i = 0; i < n; ++i) expect_close(a[i], 0.0, 0.0, "constant group", n, code, i);
        }
  for (int n = 1; n <= 12; ++n)
    for (double v : {0.0, 1.0})
      for (int k = 1; k <= n; ++k) {
        auto a = run<bk::SerialExec>(bk::CHEN_PASSK, std::vector<double>(n, v), {}, k, 0.0);
        for (int i = 0; i < n; ++i) expect_close(a[i], 0.0, 0.0, "constant chen_passk", n, k, i);
      }
  auto z = run<bk::SerialExec>(bk::GRPO, {1.7e308, -1.7e308, 0.0, 1.0}, {}, 1, 0.0);
  const double sd = 1.7e308 * std::sqrt(2.0 / 3.0);  // the residues 0.25 and 0.75 vanish next to 1.7e308
  expect_close(z[0], (1.7e308 - 0.25) / sd, 1e-14, "grpo near DBL_MAX", 4, 0, 0);
  expect_close(z[1], (-1.7e308 - 0.25) / sd, 1e-14, "grpo near DBL_MAX", 4, 0, 1);
  z = run<bk::SerialExec>(bk::GRPO, {1.7e308, -1.7e308, -1.7e308, -1.7e308}, {}, 1, 0.0);
  expect_close(z[0], 1.5, 1e-14, "grpo spread above DBL_MAX", 4, 0, 0);
  expect_close(z[3], -0.5, 1e-14, "grpo spread above DBL_MAX", 4, 0, 3);
  z = run<bk::SerialExec>(bk::GRPO, {1e-310, 3e-310, 2e-310}, {}, 1, 0.0);
  expect_close(z[1], 1.0, 1e-12, "grpo subnormal residues", 3, 0, 1);
}

// Non-finite inputs (checks off): every estimator gives NaN for every sample of the group, and the
// CPU sorts keep every slot exactly once with NaN keys (std::sort with `<` may not).
void check_non_finite() {
  for (int n : {1, 2, 5, 24, 25, 29, 32, 33, 70}) {
    for (double bad : {double(NAN), double(INFINITY), -double(INFINITY)}) {
      std::vector<double> g(n), delta(n, 0.1);
      for (int i = 0; i < n; ++i) g[i] = (i * 7 % 5) * 0.25;
      g[n / 2] = bad;
      if (n > 3) g[0] = -double(NAN);  // a negative NaN too
      for (int code = 0; code < bk::NUM_CODES; ++code) {
        if (!bk::native_supports(code)) continue;
        for (int b : {0, 1}) {
          if (b == 1 && !bk::needs_deltas(code)) continue;
          std::vector<double> gg = g, dd = delta;
          if (b == 1) gg = std::vector<double>(n, 0.5), dd[n - 1] = bad;  // a bad delta only
          for (double v : run<bk::SerialExec>(code, gg, dd, 1)) expect_close(v, NAN, 0.0, "non-finite group", n, code, 0);
        }
      }
      std::vector<std::pair<double, int32_t>> pairs(n);
      std::vector<std::pair<uint64_t, int32_t>> buf;
      for (int with_buf = 0; with_buf < 2; ++with_buf) {
        for (int i = 0; i < n; ++i) pairs[i] = {i % 3 == 0 ? double(NAN) : g[i], i};
        bk::sort_pairs(pairs.data(), n, with_buf ? &buf : nullptr);
        std::vector<int> seen(n, 0);
        for (auto& pr : pairs) seen[pr.second]++;
        for (int i = 0; i < n; ++i) expect_close(seen[i], 1, 0.0, "sort with NaN keys is a permutation", n, 0, i);
      }
    }
  }
}

// ---------------------------------------------------------------- mixture bank (spec 12)

// d^(n,k)_j, j = 1..n (index j - 1), from binomials: independent of the kernel's recurrence.
std::vector<double> d_table(int n, int k, int width) {
  std::vector<double> d(width, 0.0);
  if (k < 1) return d;
  for (int j = 1; j <= n && j <= width; ++j) d[j - 1] = binom(j - 1, k - 1) / binom(n, k);
  return d;
}

// One block of the bank for groups of size n, following the layout of the backend interface:
// D, O, Q, B, Bp (n each), W1; weights w[k-1] for k = 1..T, folded to the group's limit ("clamp").
std::vector<double> bank_block(int code, int n, const std::vector<double>& w) {
  std::vector<double> blk(5 * n + 1, 0.0);
  const int limit = n - bk::k_margin(code);
  std::vector<double> wf(n + 1, 0.0);  // folded weights by k
  for (int k = 1; k <= int(w.size()); ++k)
    if (limit >= 1) wf[std::min(k, limit)] += w[k - 1];
  for (int k = 1; k <= n; ++k) {
    if (wf[k] == 0.0) continue;
    const bool loo1 = code == bk::MAXK_LOO1;
    if (loo1 && k == 1) {
      blk[5 * n] += wf[1];
      continue;
    }
    const auto d = d_table(n, k, n);
    for (int j = 1; j <= n; ++j) {
      const double o = j >= 2 ? d[j - 1] * (k - 1) / (j - 1) : 0.0;
      const double q = j >= 3 ? o * (k - 2) / (j - 2) : 0.0;
      blk[j - 1] += wf[k] * d[j - 1];
      blk[n + j - 1] += wf[k] * std::max(o, 0.0);
      blk[2 * n + j - 1] += wf[k] * std::max(q, 0.0);
    }
    if (code == bk::MAXK_LOO || code == bk::MAXK_LOO_CENTERED) {
      const double c = double(k) / (code == bk::MAXK_LOO ? n - 1 : n);
      const auto r = d_table(n - 1, k, n);
      for (int j = 1; j <= n; ++j) {
        blk[3 * n + j - 1] += wf[k] * c * r[j - 1];
        blk[4 * n + j - 1] += j >= 2 ? wf[k] * c * r[j - 2] : 0.0;
      }
    } else if (loo1) {
      const auto r = d_table(n - 1, k - 1, n);
      for (int j = 1; j <= n; ++j) blk[3 * n + j - 1] += wf[k] * double(k) / n * r[j - 1];
    }
  }
  return blk;
}

// Parameters of a bank call ("clamp" small groups) over `bank`, indexed by group size.
bk::Params bank_params(const std::vector<double>& bank, const std::vector<int64_t>& index) {
  bk::Params p{};
  p.small_groups = 2;
  p.bank = bank.data();
  p.bank_index = index.data();
  p.bank_len = int64_t(bank.size());
  p.bank_index_len = int64_t(index.size());
  return p;
}

// A lane of a set of calls gives the kAll lane's values bit for bit on the calls the set takes,
// and NaN on the others (which the CUDA launcher never sends it), or 0 where the too-small rule
// zeroes the group before any estimator runs. Counts the calls taken and refused.
struct SetCounts {
  int taken = 0, refused = 0;
};
// An executor of one set of calls (`set`) against the same executor computing every call (`all`):
// the same bits when the set takes the call, else NaN.
void expect_set_result(const char* what, const std::vector<double>& set, const std::vector<double>& all, bool takes,
                       int code, SetCounts& counts) {
  const int n = int(set.size());
  for (int i = 0; i < n; ++i) {
    if (takes) expect_close(set[i], all[i], 0.0, what, n, code, i);
    else if (!(set[i] == 0.0 && all[i] == 0.0))  // 0: a group the too-small rule zeroes first
      expect_close(set[i], NAN, 0.0, what, n, code, i);
  }
  counts.taken += takes;
  counts.refused += !takes && std::isnan(set[0]);
}

// A set must take at least one call and refuse at least one.
void expect_set_counts(const char* name, const SetCounts& counts) {
  ++checks;
  if (counts.taken == 0 || counts.refused == 0) {
    ++failures;
    std::printf("FAIL the %s took %d calls and refused %d (both must be > 0)\n", name, counts.taken, counts.refused);
  }
}

template <int W, bk::LaneCalls C>
void check_lane_calls(int code, const std::vector<double>& g, const std::vector<double>& delta, int k,
                      const bk::Params* base, SetCounts& counts) {
  const auto all = run<SetLane<W>>(code, g, delta, k, 1e-6, base);
  const auto set = run<SetLane<W, C>>(code, g, delta, k, 1e-6, base);
  expect_set_result("lane of a set (= lane, or NaN)", set, all, bk::lane_takes(C, code, base != nullptr && base->bank != nullptr),
                    code, counts);
}

// A bank call equals the weighted sum of single-k calls with small_groups = "clamp"; a missing or
// truncated block gives NaN; k is ignored.
void check_bank() {
  std::mt19937_64 rng(2026);
  std::uniform_real_distribution<double> uni(-1.0, 1.0);
  const int codes[] = {bk::MAXK, bk::PASSK, bk::MAXK_LOO, bk::MAXK_LOO_CENTERED, bk::MAXK_LOO1, bk::MAXK_OFFPOLICY};
  const std::vector<std::vector<double>> mixes = {{1.0}, {0.0, 1.0}, {1.0, 0.5, 1.0 / 3, 0.25}, {0.2, 0.0, 0.0, 0.0, 0.0, 0.0, 0.7}};
  for (int code : codes)
    for (const auto& w : mixes)
      for (int n = 1; n <= 9; ++n) {
        std::vector<double> g(n), delta(n);
        for (int i = 0; i < n; ++i) {
          g[i] = code == bk::PASSK ? double(uni(rng) > 0) : std::round(uni(rng) * 4) / 4;
          delta[i] = 0.3 * uni(rng);
        }
        const auto blk = bank_block(code, n, w);
        std::vector<int64_t> index(n + 1, -1);
        std::vector<double> bank(3, 99.0);  // the block does not start at 0
        index[n] = int64_t(bank.size());
        bank.insert(bank.end(), blk.begin(), blk.end());
        bk::Params base = bank_params(bank, index);
        const auto got = run<bk::SerialExec>(code, g, delta, 5, 1e-6, &base);
        const auto scan = run<ScanTablesExec>(code, g, delta, 1, 1e-6, &base);
        bk::Params single{};
        single.small_groups = 2;
        std::vector<double> want(n, 0.0);
        for (int k = 1; k <= int(w.size()); ++k) {
          if (w[k - 1] == 0.0) continue;
          const auto a = run<bk::SerialExec>(code, g, delta, k, 1e-6, &single);
          for (int i = 0; i < n; ++i) want[i] += w[k - 1] * a[i];
        }
        for (int i = 0; i < n; ++i) {
          expect_close(got[i], want[i], 1e-12, "bank = weighted single-k sum", n, code, i);
          expect_close(scan[i], got[i], 0.0, "bank on the scan executor", n, code, i);
        }
        SetCounts unused;
        check_lane_calls<32, bk::LaneCalls::kWide>(code, g, delta, 1, &base, unused);
        base.bank_len = int64_t(bank.size()) - 1;  // truncated: the block's W1 is missing
        for (double v : run<bk::SerialExec>(code, g, delta, 1, 1e-6, &base)) expect_close(v, NAN, 0.0, "truncated bank", n, code, 0);
        index[n] = -1;  // no block for this size
        base.bank_len = int64_t(bank.size());
        for (double v : run<bk::SerialExec>(code, g, delta, 1, 1e-6, &base)) expect_close(v, NAN, 0.0, "missing block", n, code, 0);
      }
}

// ---------------------------------------------------------------- the segment executor on host lanes

// P host threads play the P lanes of a segment (segment_exec.h): take() and any() meet at a
// barrier, as the lanes of a warp meet at a shuffle. Lanes that make different sequences of calls
// (which would hang or corrupt a warp) trip the size check or the timeout.
class Rendezvous {
 public:
  explicit Rendezvous(int lanes) : lanes_(lanes) {}
  int lanes() const { return lanes_; }

  template <class T>
  T exchange(int lane, const T& v, int src) {
    slot_[lane] = &v;
    size_[lane] = sizeof(T);
    wait();
    if (size_[src] != sizeof(T)) diverged("values of different types");
    T r;
    std::memcpy(static_cast<void*>(&r), slot_[src], sizeof(T));
    wait();  // the source keeps v alive until every lane has read it
    return r;
  }

 private:
  void wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    const long generation = generation_;
    if (++arrived_ == lanes_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return;
    }
    if (!cv_.wait_for(lock, std::chrono::seconds(30), [&] { return generation_ != generation; }))
      diverged("a lane stopped calling (timeout)");
  }
  [[noreturn]] static void diverged(const char* why) {
    std::printf("FAIL segment lanes diverged: %s\n", why);
    std::fflush(stdout);
    std::abort();
  }

  int lanes_;
  int arrived_ = 0;
  long generation_ = 0;
  std::mutex mutex_;
  std::condition_variable cv_;
  const void* slot_[32] = {};
  size_t size_[32] = {};
};

struct HostTeam {
  int lane;
  Rendezvous* rv;
  template <class T>
  T take(const T& v, int src) {
    return rv->exchange(lane, v, src);
  }
  bool any(bool b) {
    bool r = false;
    for (int src = 0; src < rv->lanes(); ++src) r = take(b, src) || r;  // every lane, same calls
    return r;
  }
};

struct HostSegmentSink {
  int idx[bk::kSegmentItems];  // source index of each slot (the sort writes it)
  std::vector<double>* out;
  std::vector<int>* writes;
  void operator()(int s, double v) {
    const int i = idx[s];
    if (i < 0 || i >= int(out->size())) {
      std::printf("FAIL segment emit to index %d of %d\n", i, int(out->size()));
      std::abort();
    }
    (*out)[i] = v;
    ++(*writes)[i];
  }
};

// The sink of a segment computing one set of calls (bk::LaneCalls), as the CUDA segment kernel's
// instantiations do (kAll: every call).
template <bk::LaneCalls C>
struct HostSetSink : HostSegmentSink {
  static constexpr bk::LaneCalls kCalls = C;
};

// One lane of the segment for run_segment.
template <int P, class K, bk::LaneCalls C, bool kFull>
void segment_lane(int lane, Rendezvous& rv, const bk::Params& p, const std::vector<double>& g,
                  const std::vector<double>& delta, std::vector<double>& out, std::vector<int>& writes) {
  constexpr int I = bk::kSegmentItems;
  using Ex = bk::SegmentExec<P, I, HostTeam, HostSetSink<C>, kFull>;
  const int n = int(g.size());
  Ex ex;
  ex.set_size(n);
  ex.first = lane * I;
  ex.team = HostTeam{lane, &rv};
  ex.sink.out = &out;
  ex.sink.writes = &writes;
  K key[I];
  for (int s = 0; s < I; ++s) {
    const int i = ex.first + s;
    key[s] = ex.valid(s) ? K(g[i]) : K(INFINITY);
    ex.sink.idx[s] = i;
  }
  bk::segment_sort<P, I>(ex.team, key, ex.sink.idx);
  typename Ex::Vec x, d;
  for (int s = 0; s < I; ++s) {
    x[s] = double(key[s]);
    d[s] = (ex.valid(s) && !delta.empty()) ? delta[ex.sink.idx[s]] : 0.0;
  }
  bk::compute_group(ex, p, x, d);
}

// One group on a segment of P host lanes, as the CUDA segment kernel runs it: each lane loads
// its slots (keys of type K, +inf past n), the segment sorts, each lane reads its deltas by
// source index and runs compute_group. Values back in the original order; every sample must be
// written exactly once. kFull: the executor of a group that fills the segment (n == P * 16).
template <int P, class K, bk::LaneCalls C = bk::LaneCalls::kAll, bool kFull = false>
std::vector<double> run_segment(int code, const std::vector<double>& g, const std::vector<double>& delta, int k,
                                const bk::Params* base) {
  const int n = int(g.size());
  if (kFull && n != P * bk::kSegmentItems) {
    std::printf("FAIL run_segment: a full segment of %d lanes takes %d samples, not %d\n", P, P * bk::kSegmentItems, n);
    std::abort();
  }
  const bk::Params p = call_params(code, k, 1e-6, base);
  std::vector<double> out(n, -12345.0);
  std::vector<int> writes(n, 0);
  Rendezvous rv(P);
  std::vector<std::thread> lanes;
  for (int lane = 0; lane < P; ++lane)
    lanes.emplace_back([&, lane] { segment_lane<P, K, C, kFull>(lane, rv, p, g, delta, out, writes); });
  for (auto& t : lanes) t.join();
  for (int i = 0; i < n; ++i) expect_close(writes[i], 1, 0.0, "segment writes each sample once", n, code, i);
  return out;
}

// The segment sort alone: ascending keys, every entry once, key and index still paired.
template <int P, class K>
void check_segment_sort(std::mt19937_64& rng, int n, bool ties) {
  constexpr int I = bk::kSegmentItems;
  std::normal_distribution<double> normal;
  std::vector<K> v(n);
  for (auto& x : v) x = ties ? K(std::round(normal(rng) * 2) / 2) : K(normal(rng));
  std::vector<K> sorted(P * I);
  std::vector<int> order(P * I);
  Rendezvous rv(P);
  std::vector<std::thread> lanes;
  for (int lane = 0; lane < P; ++lane)
    lanes.emplace_back([&, lane] {
      HostTeam team{lane, &rv};
      K key[I];
      int idx[I];
      for (int s = 0; s < I; ++s) {
        const int i = lane * I + s;
        key[s] = i < n ? v[i] : K(INFINITY);
        idx[s] = i;
      }
      bk::segment_sort<P, I>(team, key, idx);
      for (int s = 0; s < I; ++s) sorted[lane * I + s] = key[s], order[lane * I + s] = idx[s];
    });
  for (auto& t : lanes) t.join();
  std::vector<K> want = v;
  std::sort(want.begin(), want.end());
  std::vector<int> seen(P * I, 0);
  for (int r = 0; r < P * I; ++r) {
    if (r < n) {
      expect_close(double(sorted[r]), double(want[r]), 0.0, "segment sort", n, P, r);
      expect_close(order[r] < n, 1, 0.0, "segment sort keeps padding last", n, P, r);
      if (order[r] < n) expect_close(double(v[order[r]]), double(sorted[r]), 0.0, "segment sort keeps pairs", n, P, r);
    }
    if (order[r] >= 0 && order[r] < P * I) seen[order[r]]++;
  }
  for (int i = 0; i < P * I; ++i) expect_close(seen[i], 1, 0.0, "segment sort is a permutation", n, P, i);
}

// A test group for `code` and its deltas: 0/1 rewards for the binary estimators, else arbitrary
// values of type K when n % period != 0 and quarter steps (ties) otherwise.
template <class K>
void draw_group(std::mt19937_64& rng, int code, int n, int period, std::vector<double>& g, std::vector<double>& delta) {
  std::uniform_real_distribution<double> uni(-1.0, 1.0);
  const bool binary = code == bk::PASSK || code == bk::CHEN_PASSK || code == bk::BON_RLB || code == bk::BON_RLB_POS;
  g.resize(n);
  delta.resize(n);
  for (int i = 0; i < n; ++i) {
    g[i] = binary ? double(uni(rng) > 0) : (n % period ? double(K(uni(rng))) : std::round(uni(rng) * 4) / 4);
    delta[i] = double(K(0.3 * uni(rng)));  // the key type's deltas (float32 ones for float keys)
  }
}

// Every estimator on a segment of P lanes against SerialExec, single-k and from a bank, with float
// keys (float32 rewards, what the kernel sorts for float32/float16/bfloat16) and double keys.
template <int P, class K>
void check_segment_sizes(std::mt19937_64& rng, const std::vector<int>& sizes) {
  const std::vector<double> mix = {1.0, 0.5, 1.0 / 3, 0.25};
  for (int n : sizes) {
    for (int rep = 0; rep < 2; ++rep) check_segment_sort<P, K>(rng, n, rep == 1);
    for (int code = 0; code < bk::NUM_CODES; ++code) {
      std::vector<double> g, delta;
      draw_group<K>(rng, code, n, 3, g, delta);
      const int k = 1 + int(rng() % unsigned(n));
      const double tol = (code == bk::GRPO || code == bk::BON_MEAN || code == bk::CHEN_PASSK) ? 1e-9 : 1e-11;
      const auto want = run<bk::SerialExec>(code, g, delta, k);
      const auto got = run_segment<P, K>(code, g, delta, k, nullptr);
      for (int i = 0; i < n; ++i) expect_close(got[i], want[i], tol, "segment = serial", n, code, i);
      if (n == P * bk::kSegmentItems) {  // the executor with no slot masked: the same values, bit for bit
        const auto full = run_segment<P, K, bk::LaneCalls::kAll, true>(code, g, delta, k, nullptr);
        for (int i = 0; i < n; ++i) expect_close(full[i], got[i], 0.0, "full segment = segment", n, code, i);
      }
      if (code == bk::MAXK_OFFPOLICY && n > 1) {  // a non-finite delta NaN-fills the group (any())
        auto bad = delta;
        bad[n / 2] = INFINITY;
        for (double v : run_segment<P, K>(code, g, bad, k, nullptr)) expect_close(v, NAN, 0.0, "segment NaN delta", n, code, 0);
      }
      if (!bk::reads_weight_tables(code)) continue;
      const auto blk = bank_block(code, n, mix);
      std::vector<int64_t> index(n + 1, -1);
      index[n] = 0;
      const bk::Params base = bank_params(blk, index);
      const auto bank_want = run<bk::SerialExec>(code, g, delta, 1, 1e-6, &base);
      const auto bank_got = run_segment<P, K>(code, g, delta, 1, &base);
      for (int i = 0; i < n; ++i) expect_close(bank_got[i], bank_want[i], 1e-11, "segment bank = serial", n, code, i);
    }
  }
}

// A segment of one set of calls against the segment of every call, bit for bit, on float32
// rewards (what the float sets are sent), every estimator, with and without a bank; a call
// outside the set is NaN-filled.
template <int P, bk::LaneCalls C>
void check_segment_set(const char* name, std::mt19937_64& rng, const std::vector<int>& sizes) {
  const std::vector<double> mix = {1.0, 0.5, 1.0 / 3, 0.25};
  SetCounts counts;
  for (int n : sizes)
    for (int code = 0; code < bk::NUM_CODES; ++code) {
      std::vector<double> g, delta;
      draw_group<float>(rng, code, n, 2, g, delta);
      std::vector<int64_t> index(n + 1, -1);
      index[n] = 0;
      const auto blk = bank_block(code, n, mix);
      const bk::Params bank = bank_params(blk, index);
      for (const bk::Params* base : {static_cast<const bk::Params*>(nullptr), &bank}) {
        if (base != nullptr && !bk::reads_weight_tables(code)) continue;
        const int k = base != nullptr ? 1 : 1 + int(rng() % unsigned(n));
        const auto all = run_segment<P, float>(code, g, delta, k, base);
        const auto set = run_segment<P, float, C>(code, g, delta, k, base);
        expect_set_result("segment of a set (= segment, or NaN)", set, all, bk::lane_takes(C, code, base != nullptr),
                          code, counts);
        if (n == P * bk::kSegmentItems) {  // the kernel's copy for groups that fill the segment
          const auto full = run_segment<P, float, C, true>(code, g, delta, k, base);
          expect_set_result("full segment of a set (= segment, or NaN)", full, all,
                            bk::lane_takes(C, code, base != nullptr), code, counts);
        }
      }
    }
  expect_set_counts(name, counts);
}

void check_segments() {
  std::mt19937_64 rng(64);
  std::vector<int> pair_sizes;  // the kernel sends groups of 17..32 to 2 lanes
  for (int n = 1; n <= 32; ++n) pair_sizes.push_back(n);
  check_segment_sizes<2, float>(rng, pair_sizes);
  check_segment_sizes<2, double>(rng, {1, 7, 16, 17, 24, 31, 32});
  const std::vector<int> quad_sizes = {1, 3, 16, 17, 31, 32, 33, 40, 47, 48, 49, 63, 64};
  check_segment_sizes<4, float>(rng, quad_sizes);
  check_segment_sizes<4, double>(rng, quad_sizes);
  // The kernel's larger segments (65..512 samples); a thread per lane makes 32 lanes the slow part.
  check_segment_sizes<8, float>(rng, {65, 100, 128});
  check_segment_sizes<16, float>(rng, {129, 256});
  check_segment_sizes<32, float>(rng, {300, 512});
  // The float sets' instantiations (kCentred, kWide: float arrays, one estimator's code per copy).
  check_segment_set<2, bk::LaneCalls::kCentred>("centred segment", rng, {1, 2, 17, 24, 31, 32});
  check_segment_set<2, bk::LaneCalls::kWide>("wide segment", rng, {1, 2, 17, 24, 31, 32});
  check_segment_set<4, bk::LaneCalls::kCentred>("centred segment", rng, {17, 33, 48, 63, 64});
  // (1..16: the kWide launch at a bound of 64 sends every group below 64 here)
  check_segment_set<4, bk::LaneCalls::kWide>("wide segment", rng, {1, 2, 9, 16, 17, 33, 48, 63, 64});
  check_segment_set<8, bk::LaneCalls::kWide>("wide segment", rng, {65, 100, 128});
  check_segment_set<2, bk::LaneCalls::kWideOffPolicy>("wide off-policy segment", rng, {1, 2, 17, 24, 31, 32});
  check_segment_set<4, bk::LaneCalls::kWideOffPolicy>("wide off-policy segment", rng, {17, 33, 48, 63, 64});
  check_segment_set<8, bk::LaneCalls::kWideOffPolicy>("wide off-policy segment", rng, {65, 100, 128});
  check_segment_set<16, bk::LaneCalls::kCentred>("centred segment", rng, {129, 256});
}

}  // namespace

// The CPU sorts (insertion, std::sort, radix) against std::sort, with negatives, zeros and ties.
void check_sorts() {
  std::mt19937_64 rng(99);
  std::normal_distribution<double> normal;
  std::vector<std::pair<uint64_t, int32_t>> buf;
  for (int n : {0, 1, 2, 5, 24, 25, 100, 129, 1000, 5000}) {
    std::vector<std::pair<double, int32_t>> a(n);
    for (int i = 0; i < n; ++i) {
      const double v = (i % 7 == 0) ? -0.0 : (i % 5 == 0 ? 0.0 : std::round(normal(rng) * 8) / 4);
      a[i] = {i % 11 == 0 ? 1e300 * (normal(rng) > 0 ? 1 : -1) : v, i};
    }
    std::vector<double> want(n);
    for (int i = 0; i < n; ++i) want[i] = a[i].first;
    std::sort(want.begin(), want.end());
    for (int use_radix = 0; use_radix < 2; ++use_radix) {
      auto b = a;
      if (use_radix) bk::radix_sort_pairs(b.data(), n, buf);
      else bk::sort_pairs(b.data(), n);
      std::vector<int> seen(n, 0);
      for (int i = 0; i < n; ++i) {
        expect_close(b[i].first, want[i], 0.0, use_radix ? "radix sort" : "sort_pairs", n, 0, i);
        expect_close(a[b[i].second].first, b[i].first, 0.0, "sort keeps pairs", n, 0, i);
        seen[b[i].second]++;
      }
      for (int i = 0; i < n; ++i) expect_close(seen[i], 1, 0.0, "sort is a permutation", n, 0, i);
    }
  }
  for (int n = 1; n <= bk::kNetworkSortMax; ++n) {  // the packed float network of the CPU kernel
    for (int rep = 0; rep < 20; ++rep) {
      std::vector<float> v(n);
      for (auto& x : v) x = (rep % 2) ? float(std::round(normal(rng) * 2) / 2) : float(normal(rng));
      if (n > 2) v[1] = -0.0f, v[2] = 0.0f;
      uint64_t k[bk::kNetworkSortMax];
      for (int i = 0; i < n; ++i) k[i] = (uint64_t(bk::orderable_f32(v[i])) << 32) | uint32_t(i);
      bk::network_sort_packed(k, n);
      std::vector<float> want = v;
      std::sort(want.begin(), want.end());
      std::vector<int> seen(n, 0);
      for (int s = 0; s < n; ++s) {
        const int i = int(uint32_t(k[s]));
        expect_close(v[i], want[s], 0.0, "network sort", n, 0, s);
        seen[i]++;
      }
      for (int i = 0; i < n; ++i) expect_close(seen[i], 1, 0.0, "network sort is a permutation", n, 0, i);
    }
  }
  std::vector<uint64_t> scratch;
  for (int n : {2, 65, 100, 1000, 4096}) {  // the packed 32-bit radix sort of the larger float groups
    for (int rep = 0; rep < 4; ++rep) {
      std::vector<float> v(n);
      for (auto& x : v) x = (rep % 2) ? float(std::round(normal(rng) * 2) / 2) : float(normal(rng) * 1e3);
      v[0] = -0.0f, v[1] = 0.0f;
      if (rep == 3) v[n - 1] = std::numeric_limits<float>::infinity();
      std::vector<uint64_t> k(n);
      for (int i = 0; i < n; ++i) k[i] = (uint64_t(bk::orderable_f32(v[i])) << 32) | uint32_t(i);
      bk::radix_sort_packed32(k.data(), n, scratch);
      std::vector<float> want = v;
      std::sort(want.begin(), want.end());
      std::vector<int> seen(n, 0);
      for (int s = 0; s < n; ++s) {
        const int i = int(uint32_t(k[s]));
        expect_close(v[i], want[s], 0.0, "packed radix sort", n, 0, s);
        expect_close(bk::from_orderable_f32(uint32_t(k[s] >> 32)), v[i], 0.0, "packed radix sort keeps the value", n, 0, s);
        if (s > 0 && k[s] >> 32 == k[s - 1] >> 32)
          expect_close(uint32_t(k[s]) > uint32_t(k[s - 1]), 1, 0.0, "ties keep index order", n, 0, s);
        seen[i]++;
      }
      for (int i = 0; i < n; ++i) expect_close(seen[i], 1, 0.0, "packed radix sort is a permutation", n, 0, i);
    }
  }
}

// The GPU's inline division and square root (div_refine, sqrt_refine), fed here with
// float-precision estimates (the hardware's are ~20 bits), against IEEE / and sqrt.
void check_refinements() {
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> mant(1.0, 2.0);
  std::uniform_int_distribution<int> expo(-60, 60);
  for (int i = 0; i < 200000; ++i) {
    const double a = std::ldexp(mant(rng), expo(rng)) * (i % 2 ? -1 : 1);
    const double b = std::ldexp(mant(rng), expo(rng)) * (i % 3 ? 1 : -1);
    const double q = bk::div_refine(a, b, double(1.0f / float(b)));
    const double want = a / b;
    if (std::fabs(q - want) > 2.3e-16 * std::fabs(want)) expect_close(q, want, 0.0, "div_refine", 0, 0, i);
    const double x = std::fabs(b);
    const double r = bk::sqrt_refine(x, double(1.0f / std::sqrt(float(x))));
    if (std::fabs(r - std::sqrt(x)) > 2.3e-16 * std::sqrt(x)) expect_close(r, std::sqrt(x), 0.0, "sqrt_refine", 0, 0, i);
  }
  checks += 1;
  const double inf = INFINITY;  // IEEE special cases of a / b
  expect_close(bk::div_refine(inf, 4.0, 0.25f), inf, 0.0, "inf / b", 0, 0, 0);
  expect_close(bk::div_refine(-inf, 4.0, 0.25f), -inf, 0.0, "-inf / b", 0, 0, 0);
  expect_close(bk::div_refine(3.0, inf, 0.0), 0.0, 0.0, "a / inf", 0, 0, 0);
  expect_close(bk::div_refine(3.0, 0.0, inf), inf, 0.0, "a / 0", 0, 0, 0);
  expect_close(bk::div_refine(NAN, 2.0, 0.5), NAN, 0.0, "nan / b", 0, 0, 0);
}

// The GPU's rcp.approx.ftz.f64 as far as bk_div depends on it: about 20 good bits, subnormal
// inputs flushed to 0 (1/x = inf), subnormal results flushed to 0.
double rcp_ftz_emulated(double x) {
  if (x == 0.0 || std::fabs(x) < 0x1p-1022) return std::copysign(INFINITY, x);
  const double r = 1.0 / x;
  if (std::fabs(r) < 0x1p-1022) return std::copysign(0.0, r);
  if (std::isinf(r)) return r;
  return bk::bits_to_double(bk::double_to_bits(r) & ~((uint64_t(1) << 32) - 1));
}

// bk_div's device path (div_with_estimate over the flush-to-zero estimate) against IEEE a / b, on
// subnormal, tiny, huge and ordinary denominators: correct within an ulp, never NaN.
void check_division_ftz() {
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<double> mant(1.0, 2.0);
  std::uniform_int_distribution<int> expo_b(-1074, 1023), expo_a(-200, 200);
  bool refine_alone_fails = false;
  for (int i = 0; i < 200000; ++i) {
    const double b = std::ldexp(mant(rng), expo_b(rng)) * (i % 3 ? 1 : -1);
    const double a = std::ldexp(mant(rng), expo_a(rng)) * (i % 2 ? -1 : 1);
    const double want = a / b;
    const double got = bk::div_with_estimate(a, b, rcp_ftz_emulated);
    if (std::fabs(b) < 0x1p-1022 && std::isnan(bk::div_refine(a, b, rcp_ftz_emulated(b)))) refine_alone_fails = true;
    const bool ok = got == want || std::fabs(got - want) <= 2.3e-16 * std::fabs(want) ||
                    (std::fabs(want) < 0x1p-1000 && std::fabs(got - want) <= 0x1p-1074 * 4);
    if (!ok) expect_close(got, want, 0.0, "div_with_estimate (ftz)", 0, 0, i);
  }
  expect_close(refine_alone_fails, 1, 0.0, "a subnormal b breaks the unscaled refinement", 0, 0, 0);
  expect_close(bk::div_with_estimate(1.0, 4.9e-324, rcp_ftz_emulated), INFINITY, 0.0, "1 / min subnormal", 0, 0, 0);
  expect_close(bk::div_with_estimate(1e-310, 2e-310, rcp_ftz_emulated), 0.5, 0.0, "subnormal / subnormal", 0, 0, 0);
  expect_close(bk::div_with_estimate(3.0, 0.0, rcp_ftz_emulated), INFINITY, 0.0, "a / 0 (ftz)", 0, 0, 0);
  expect_close(bk::div_with_estimate(3.0, INFINITY, rcp_ftz_emulated), 0.0, 0.0, "a / inf (ftz)", 0, 0, 0);
  expect_close(bk::div_with_estimate(1e300, 1.5e308, rcp_ftz_emulated), 1e300 / 1.5e308, 2.3e-16, "a / huge", 0, 0, 0);
}

// div_by_count (the sum scale of the mean-natural estimators): for a power-of-two count the
// multiplication by the exact reciprocal must give IEEE a / n bit for bit, subnormal, huge and
// special values included; other counts divide.
void check_div_by_count() {
  std::mt19937_64 rng(17);
  std::uniform_real_distribution<double> mant(1.0, 2.0);
  std::uniform_int_distribution<int> expo(-1074, 1023);
  const double specials[] = {0.0, -0.0, INFINITY, -INFINITY, NAN, 4.9e-324, -4.9e-324, 1.7976931348623157e308, 0x1p-1022};
  int mismatches = 0;
  for (int i = 0; i < 400000; ++i) {
    const int n = i % 3 == 0 ? 1 << (i / 3 % 13) : 1 + int(rng() % 4096);
    const double a = i % 50 == 0 ? specials[(i / 50) % 9] : std::ldexp(mant(rng), expo(rng)) * (i % 2 ? -1 : 1);
    const double got = bk::div_by_count(a, n), want = a / n;
    if (std::memcmp(&got, &want, sizeof(got)) != 0 && !(std::isnan(got) && std::isnan(want))) ++mismatches;
  }
  expect_close(mismatches, 0, 0.0, "div_by_count == a / n bit for bit", 0, 0, 0);
}

// Each set of calls the CUDA small-group kernel is instantiated for, at its widths, on every size
// up to W and every estimator, with and without a bank. kWide and kCentred hold their arrays in
// float, so half the trials draw arbitrary float32 rewards (what they are sent), not quarter steps.
template <int W, bk::LaneCalls C>
void check_lane_set(const char* name) {
  std::mt19937_64 rng(W);
  const std::vector<double> mix = {1.0, 0.5, 1.0 / 3, 0.25};
  SetCounts counts;
  for (int code = 0; code < bk::NUM_CODES; ++code)
    for (int n = 1; n <= W; ++n) {
      std::vector<double> g, delta;
      draw_group<float>(rng, code, n, 2, g, delta);
      check_lane_calls<W, C>(code, g, delta, 2, nullptr, counts);
      if (!bk::reads_weight_tables(code)) continue;
      const auto blk = bank_block(code, n, mix);
      std::vector<int64_t> index(n + 1, -1);
      index[n] = 0;
      const bk::Params base = bank_params(blk, index);
      check_lane_calls<W, C>(code, g, delta, 1, &base, counts);
    }
  expect_set_counts(name, counts);
}

// The lane executor at W = 64, as the CUDA kernel's thread_kernel<64> runs it (no CPU path does):
// every call of its set (kWide) on float32 rewards against SerialExec, from a bank, for groups of
// 64 samples (all that kernel runs) and smaller ones (the executor takes any n up to W); and for a
// full group with the block staged (LaneExec::staged_bank) while the bank's own block holds
// garbage, so the values can only be right if the staged block is the one read.
struct StagedLane : TestLane<64, CallsSlots<64, bk::LaneCalls::kWide>> {
  static inline const double* staged = nullptr;
  void begin_group(int n) {
    this->set_size(n);
    this->staged_bank = n == 64 ? staged : nullptr;
  }
};

void check_wide_lane_64() {
  std::mt19937_64 rng(640);
  const std::vector<double> mix = {1.0, 0.5, 1.0 / 3, 0.25};
  int staged_checked = 0;
  for (int code = 0; code < bk::NUM_CODES; ++code) {
    if (!bk::lane_takes(bk::LaneCalls::kWide, code, true)) continue;
    for (int n : {1, 2, 17, 32, 33, 41, 63, 64, 64, 64}) {
      std::vector<double> g, delta;
      draw_group<float>(rng, code, n, 2, g, delta);  // odd n arbitrary floats, even n quarter steps
      const auto blk = bank_block(code, n, mix);
      std::vector<int64_t> index(n + 1, -1);
      index[n] = 0;
      const bk::Params base = bank_params(blk, index);
      const auto want = run<bk::SerialExec>(code, g, delta, 1, 1e-6, &base);
      const auto got = run<SetLane<64, bk::LaneCalls::kWide>>(code, g, delta, 1, 1e-6, &base);
      for (int i = 0; i < n; ++i) expect_close(got[i], want[i], 1e-11, "lane W = 64 (kWide) = serial", n, code, i);
      if (n != 64) continue;
      const std::vector<double> garbage(blk.size(), 12345.0);
      const bk::Params garbled = bank_params(garbage, index);
      StagedLane::staged = blk.data();
      const auto staged = run<StagedLane>(code, g, delta, 1, 1e-6, &garbled);
      StagedLane::staged = nullptr;
      for (int i = 0; i < n; ++i) expect_close(staged[i], want[i], 1e-11, "lane W = 64, staged block = serial", n, code, i);
      ++staged_checked;
    }
  }
  expect_close(staged_checked >= 6, 1, 0.0, "the staged block is checked for every kWide call", staged_checked, 0, 0);
}

// The CUDA kernel's groups of 64 off-policy (thread_group_lines, advantages.cu) with its memory:
// the rewards in registers, the clamped deltas ranked into a line of floats, their prefix sums as
// split doubles on two more lines (the rewards' and raw deltas', here holding garbage first), and
// each slot's value emitted into the deltas' line at its slot, then scattered by source index (the
// kernel's float; the test also keeps the double, where a prefix sum's lost low bits would show).
struct RankedLines {
  static constexpr bk::LaneCalls kCalls = bk::LaneCalls::kWideOffPolicy;
  using SumVec = bk::SplitDoubleLines;
  float* ranked;
  double* emitted;
  bk::SplitDoubleLines prefix;
  void bind(bk::SplitDoubleLines& a) const { a = prefix; }
  void operator()(int s, double v) {
    ranked[s] = float(v);
    emitted[s] = v;
  }
};

// The values by source index: the floats the lines hold, and the doubles emitted.
std::pair<std::vector<float>, std::vector<double>> run_ranked_lines(int code, const std::vector<double>& g,
                                                                    const std::vector<double>& delta,
                                                                    const bk::Params* base) {
  constexpr int W = 64;
  const bk::Params p = call_params(code, 1, 1e-6, base);
  std::vector<std::pair<double, int32_t>> pairs(W);
  for (int i = 0; i < W; ++i) pairs[i] = {g[i], i};
  bk::sort_pairs(pairs.data(), W);
  std::vector<float> rewards_line(W, 7.0f), deltas_line(W, -3.0f), ranked(W);  // (garbage in the lines)
  std::vector<double> emitted(W, NAN);
  bk::LaneExec<W, RankedLines, true> ex;
  ex.sink.ranked = ranked.data();
  ex.sink.emitted = emitted.data();
  ex.sink.prefix = bk::SplitDoubleLines{rewards_line.data(), deltas_line.data()};
  bk::LaneExec<W, RankedLines, true>::Vec x;
  for (int s = 0; s < W; ++s) {
    x[s] = float(pairs[s].first);
    ranked[s] = float(delta[pairs[s].second]);
  }
  bk::LineArray deltas{ranked.data()};
  bk::compute_group(ex, p, x, deltas);
  std::vector<float> out(W);
  std::vector<double> out_double(W);
  for (int s = 0; s < W; ++s) {
    out[pairs[s].second] = ranked[s];
    out_double[pairs[s].second] = emitted[s];
  }
  return {out, out_double};
}

// The ranked lines give the register arrays' values (LaneExec<64> of kWideOffPolicy) bit for bit,
// rounded to float as the kernel stores them: an emit that overwrote a slot still to be read, or a
// prefix sum that lost bits in its two words, would show. Rewards with ties and without; deltas of
// both signs, of one scale or of scales 2^0..2^-40 (their prefix sums then need every bit of a
// double: deltas of one scale sum to about 30 significant bits, and a lost low half-word would go
// unseen), all zero, and one inf (the group's NaN).
void check_ranked_lines_64() {
  std::mt19937_64 rng(6464);
  const std::vector<double> mix = {1.0, 0.5, 1.0 / 3, 0.25};
  int compared = 0;
  for (int trial = 0; trial < 12; ++trial) {
    std::vector<double> g, delta;
    draw_group<float>(rng, bk::MAXK_OFFPOLICY, 64, trial % 2 ? 3 : 2, g, delta);  // odd trials: no ties
    if (trial >= 6)
      for (double& d : delta) d = double(float(std::ldexp(d, -int(rng() % 41))));
    if (trial == 4) std::fill(delta.begin(), delta.end(), 0.0);
    if (trial == 5) delta[17] = INFINITY;
    const auto blk = bank_block(bk::MAXK_OFFPOLICY, 64, mix);
    std::vector<int64_t> index(65, -1);
    index[64] = 0;
    const bk::Params base = bank_params(blk, index);
    const auto want = run<SetLane<64, bk::LaneCalls::kWideOffPolicy>>(bk::MAXK_OFFPOLICY, g, delta, 1, 1e-6, &base);
    const auto serial = run<bk::SerialExec>(bk::MAXK_OFFPOLICY, g, delta, 1, 1e-6, &base);
    const auto [got, got_double] = run_ranked_lines(bk::MAXK_OFFPOLICY, g, delta, &base);
    for (int i = 0; i < 64; ++i) {
      expect_close(got[i], float(want[i]), 0.0, "ranked lines W = 64 = register lane, bit for bit", 64, trial, i);
      expect_close(got_double[i], want[i], 0.0, "ranked lines W = 64 = register lane, the doubles", 64, trial, i);
      expect_close(want[i], serial[i], 1e-11, "lane W = 64 (kWideOffPolicy) = serial", 64, trial, i);
      compared += !std::isnan(want[i]);
    }
    if (trial == 5) expect_close(got[0], NAN, 0.0, "ranked lines: an inf delta NaN-fills the group", 64, trial, 0);
  }
  expect_close(compared >= 11 * 64, 1, 0.0, "ranked lines compared finite values", compared, 0, 0);
}

void check_lane_sets() {
  check_wide_lane_64();
  check_ranked_lines_64();
  check_lane_set<64, bk::LaneCalls::kWideOffPolicy>("wide off-policy lane");
  check_lane_set<64, bk::LaneCalls::kWide>("wide lane");
  check_lane_set<32, bk::LaneCalls::kWide>("wide lane");
  check_lane_set<16, bk::LaneCalls::kWide>("wide lane");
  check_lane_set<8, bk::LaneCalls::kWide>("wide lane");
  check_lane_set<32, bk::LaneCalls::kWideOffPolicy>("wide off-policy lane");
  check_lane_set<16, bk::LaneCalls::kWideOffPolicy>("wide off-policy lane");
  check_lane_set<8, bk::LaneCalls::kWideOffPolicy>("wide off-policy lane");
  check_lane_set<16, bk::LaneCalls::kOnPolicy>("on-policy lane");
  check_lane_set<8, bk::LaneCalls::kOnPolicy>("on-policy lane");
  check_lane_set<16, bk::LaneCalls::kCentred>("centred lane");
  check_lane_set<8, bk::LaneCalls::kCentred>("centred lane");
}

// ---------------------------------------------------------------- the pack executor

// One group's natural values on the lane executor of width W, in the given slot order.
template <int W>
std::vector<double> lane_values(int code, const std::vector<double>& g, double eps) {
  const bk::Params p = call_params(code, 1, eps, nullptr);
  bk::LaneExec<W> ex;
  ex.set_size(int(g.size()));
  typename bk::LaneExec<W>::Vec x, d;
  for (size_t s = 0; s < g.size(); ++s) x[int(s)] = g[s], d[int(s)] = 0.0;
  bk::compute_group(ex, p, x, d);
  return std::vector<double>(ex.sink.v, ex.sink.v + g.size());
}

// L groups of n at once (centred_values on PackExec): every lane must give the lane executor's
// bits for its group.
template <int W, int L>
void check_pack(int code, const std::vector<std::vector<double>>& groups, double eps) {
  const int n = int(groups[0].size());
  struct Slots {
    double v[W][L];
    void operator()(int s, bk::Pack<L> value) {
      for (int l = 0; l < L; ++l) v[s][l] = value.v[l];
    }
  };
  bk::PackExec<W, L, Slots> ex;
  ex.set_size(n);
  typename bk::PackExec<W, L, Slots>::Vec x;
  for (int s = 0; s < n; ++s)
    for (int l = 0; l < L; ++l) x[s].v[l] = groups[l][s];
  bk::centred_values(ex, code, eps, x, [&](int s, bk::Pack<L> value) { ex.emit(s, value); });
  for (int l = 0; l < L; ++l) {
    const std::vector<double> want = lane_values<W>(code, groups[l], eps);
    for (int s = 0; s < n; ++s) {
      ++checks;
      if (std::memcmp(&ex.sink.v[s][l], &want[s], sizeof(double)) != 0) {
        if (failures < 20)
          std::printf("FAIL pack<%d,%d> code=%d n=%d lane=%d slot=%d: got %.17g want %.17g\n", W, L, code, n, l, s,
                      ex.sink.v[s][l], want[s]);
        ++failures;
      }
    }
  }
}

// Packs of random groups and of the groups with rare paths, mixed in one pack: constant groups,
// sums that overflow (the 2^-64 rescaling in one lane only), subnormal spreads, a zero mean.
template <int W, int L>
void check_packs_of_width(std::mt19937_64& rng) {
  std::uniform_real_distribution<double> uni(-1.0, 1.0);
  for (int n = 1; n <= W; ++n) {
    for (int rep = 0; rep < 6; ++rep) {
      std::vector<std::vector<double>> groups(L, std::vector<double>(n));
      for (int l = 0; l < L; ++l) {
        const int kind = rep == 0 ? 0 : (l + rep) % 6;
        for (int i = 0; i < n; ++i) {
          double v = uni(rng);
          if (kind == 1) v = 0.75;                                     // constant
          if (kind == 2) v = (i % 2 ? 1.7e308 : -1.1e308) * (0.5 + 0.5 * std::fabs(v));  // overflowing sums
          if (kind == 3) v = v * 1e-310;                               // subnormal
          if (kind == 4) v = i % 2 ? 0.5 : -0.5;                       // zero mean at even n
          if (kind == 5) v = std::round(v);                            // ties, -0.0
          groups[l][i] = v;
        }
      }
      for (int code : {bk::GRPO, bk::RLOO, bk::DR_GRPO, bk::MAXRL})
        for (double eps : {1e-6, 0.0}) check_pack<W, L>(code, groups, eps);
    }
  }
}

void check_packs() {
  std::mt19937_64 rng(777);
  check_packs_of_width<8, 2>(rng);
  check_packs_of_width<16, 2>(rng);
  check_packs_of_width<32, 2>(rng);
  check_packs_of_width<8, 4>(rng);  // (AVX registers in the CPU kernel; here any code for the vectors)
  check_packs_of_width<16, 4>(rng);
  check_packs_of_width<32, 4>(rng);
  check_packs_of_width<8, 8>(rng);  // (AVX-512 registers in the CPU kernel)
  check_packs_of_width<16, 8>(rng);
  check_packs_of_width<32, 8>(rng);
  // the helpers' lane-wise meaning
  const bk::Pack<2>::Raw raw_b = {1.0, -2.0}, raw_c = {NAN, 0x1p-1074};
  const bk::Pack<2> a = bk::Pack<2>(-0.0), b = bk::Pack<2>::of(raw_b), c = bk::Pack<2>::of(raw_c);
  const bk::Pack<2> chosen_b = bk::select(b > 0.0, b, a), chosen_c = bk::select(c > 0.0, c, a);
  const bk::Pack<2> magnitude = bk::bk_abs(b), larger = bk::MaxOp()(c, b);
  const bool helpers = chosen_b.v[0] == 1.0 && std::signbit(chosen_b.v[1]) && std::signbit(chosen_c.v[0]) &&
                       chosen_c.v[1] == 0x1p-1074 && magnitude.v[0] == 1.0 && magnitude.v[1] == 2.0 &&
                       larger.v[0] == 1.0 && larger.v[1] == 0x1p-1074 && bk::any_lane(b > 0.0) &&
                       !bk::any_lane(b > 5.0) && std::signbit(a.v[0]) && std::signbit(a.v[1]);
  ++checks;
  if (!helpers) {
    std::printf("FAIL pack helpers\n");
    ++failures;
  }
}

int main() {
  check_division_ftz();
  check_div_by_count();
  check_sorts();
  check_refinements();
  std::mt19937_64 rng(12345);
  std::uniform_real_distribution<double> uni(-1.0, 1.0);
  std::uniform_int_distribution<int> level(0, 3);
  for (int n = 1; n <= 9; ++n) {
    for (int rep = 0; rep < 4; ++rep) {
      std::vector<double> g(n), delta(n), b(n);
      for (int i = 0; i < n; ++i) {
        g[i] = rep == 0 ? uni(rng) : (rep == 1 ? 0.25 * level(rng) : (rep == 2 ? 0.5 : std::round(uni(rng) * 2)));
        delta[i] = 0.3 * uni(rng);
        b[i] = level(rng) >= 2 ? 1.0 : 0.0;
      }
      check_group<bk::SerialExec>(g, delta, false);
      check_group<ScanTablesExec>(g, delta, false);
      check_group<bk::SerialExec>(b, delta, true);
      check_group<ScanTablesExec>(b, delta, true);
    }
  }
  check_rules();
  check_constant_and_extremes();
  check_bank();
  check_lane_sets();
  check_segments();
  check_packs();
  check_non_finite();
  std::printf("%d checks, %d failures\n", checks, failures);
  return failures == 0 ? 0 : 1;
}
