// Host executor for compute_group (group_math.h): one thread walks one sorted group.
// Used by the CPU kernel and by the C++ unit tests. Weight tables are cached per (N, K) across the
// groups one thread handles, since batches usually repeat the same group size.
#pragma once

#include <algorithm>
#include <cstring>
#include <cstdint>
#include <utility>
#include <vector>

#include "bonkernels/common.h"
#include "bonkernels/group_math.h"

namespace bk {

// Group size above which the CPU kernel radix-sorts (measured crossover with std::sort).
constexpr int kRadixSortMin = 128;

// Doubles as unsigned integers in the same order (flip all bits of negatives, the sign of the rest).
inline uint64_t orderable_bits(double d) {
  uint64_t u;
  std::memcpy(&u, &d, sizeof(u));
  return (u >> 63) ? ~u : (u | 0x8000000000000000ull);
}

// LSD radix sort of (key, index) pairs by the key's orderable bits, 8 bits per pass; a pass whose
// digit is the same for every key is skipped (exponent bytes usually are). O(n) per group.
inline void radix_sort_pairs(std::pair<double, int32_t>* a, int n, std::vector<std::pair<uint64_t, int32_t>>& buf) {
  if (n <= 1) return;
  buf.resize(size_t(2) * n);
  std::pair<uint64_t, int32_t>* src = buf.data();
  std::pair<uint64_t, int32_t>* dst = buf.data() + n;
  for (int i = 0; i < n; ++i) src[i] = {orderable_bits(a[i].first), a[i].second};
  for (int shift = 0; shift < 64; shift += 8) {
    uint32_t count[256] = {0};
    for (int i = 0; i < n; ++i) ++count[(src[i].first >> shift) & 0xff];
    if (count[(src[0].first >> shift) & 0xff] == uint32_t(n)) continue;
    uint32_t sum = 0;
    for (int b = 0; b < 256; ++b) {
      const uint32_t c = count[b];
      count[b] = sum;
      sum += c;
    }
    for (int i = 0; i < n; ++i) dst[count[(src[i].first >> shift) & 0xff]++] = src[i];
    std::swap(src, dst);
  }
  for (int i = 0; i < n; ++i) {  // back to doubles: the inverse of orderable_bits
    const uint64_t u = src[i].first;
    const uint64_t bits = (u >> 63) ? (u & 0x7fffffffffffffffull) : ~u;
    double d;
    std::memcpy(&d, &bits, sizeof(d));
    a[i] = {d, src[i].second};
  }
}

// Sort (key, index) pairs ascending by key: insertion sort for tiny groups (no overhead), an O(n)
// radix sort for large ones, std::sort in between. Ties may land in any order (every estimator is
// tie-invariant).
inline void sort_pairs(std::pair<double, int32_t>* a, int n, std::vector<std::pair<uint64_t, int32_t>>* buf = nullptr) {
  if (buf != nullptr && n > kRadixSortMin) {
    radix_sort_pairs(a, n, *buf);
  } else if (n <= 24) {
    for (int i = 1; i < n; ++i) {
      const auto v = a[i];
      int j = i - 1;
      while (j >= 0 && a[j].first > v.first) {
        a[j + 1] = a[j];
        --j;
      }
      a[j + 1] = v;
    }
  } else {
    std::sort(a, a + n, [](const std::pair<double, int32_t>& l, const std::pair<double, int32_t>& r) {
      return l.first < r.first;
    });
  }
}

class SerialExec {
 public:
  struct Vec {
    double* p = nullptr;
    double& operator[](int s) const { return p[s]; }
  };

  int n = 0;

  // Prepare for a group of size n (arena sized for the estimators' temporaries).
  void begin_group(int group_size) {
    n = group_size;
    used_ = 0;
    const size_t need = size_t(kMaxVecs) * size_t(n > 0 ? n : 1);
    if (arena_.size() < need) arena_.resize(need);
    if (values_.size() < size_t(n)) values_.resize(n);
  }

  void alloc(Vec& v) {
    v.p = arena_.data() + used_;
    used_ += size_t(n);
  }

  template <class F>
  void for_each(F f) {
    for (int s = 0; s < n; ++s) f(s, s + 1);
  }

  template <class T, class Op, class Term, class Consume>
  void scan(bool reverse, T id, Op op, Term term, Consume consume) {
    T run = id;
    if (!reverse) {
      for (int s = 0; s < n; ++s) {
        const T t = term(s, s + 1);
        consume(s, s + 1, run);
        run = op(run, t);
      }
    } else {
      for (int s = n - 1; s >= 0; --s) {
        const T t = term(s, s + 1);
        consume(s, s + 1, run);
        run = op(run, t);
      }
    }
  }

  template <class T, class Op, class Term>
  T reduce(T id, Op op, Term term) {
    T run = id;
    for (int s = 0; s < n; ++s) run = op(run, term(s, s + 1));
    return run;
  }

  // d^(N,K) at each rank j = 1..n (and at j - 1 into prev), from a per-thread cache.
  void weights(int N, int K, Vec& at) { fill_weights(N, K, at, nullptr); }
  void weights2(int N, int K, Vec& at, Vec& prev) { fill_weights(N, K, at, &prev); }

 private:
  void fill_weights(int N, int K, Vec& at, Vec* prev) {
    const std::vector<double>& t = table(N, K);  // t[m] = d^(N,K)_m, m = 0..N+1 (0 outside 1..N)
    for (int s = 0; s < n; ++s) {
      const int j = s + 1;
      at[s] = j <= N ? t[j] : 0.0;
      if (prev) (*prev)[s] = (j - 1 >= 1 && j - 1 <= N) ? t[j - 1] : 0.0;
    }
  }


 public:
  // Final values in sorted order; the caller scatters them back.
  void emit(int s, double v) { values_[s] = v; }
  const double* values() const { return values_.data(); }

 private:
  static constexpr int kMaxVecs = 8;

  // The downward recurrence of spec 0.1 in the reference's order: d_N = K/N, d_{j-1} = d_j f_j.
  const std::vector<double>& table(int N, int K) {
    for (auto& e : cache_)
      if (e.N == N && e.K == K) return e.d;
    if (cache_.size() >= 4) cache_.erase(cache_.begin());
    Entry e;
    e.N = N;
    e.K = K;
    e.d.assign(size_t(N > 0 ? N : 0) + 2, 0.0);
    if (N >= 1 && K >= 1) {
      const double top = double(K) / double(N);
      double prod = 1.0;
      for (int j = N; j >= 1; --j) {
        const double v = top * prod;
        e.d[j] = v > 0.0 ? v : 0.0;
        prod *= table_factor(j, N, K);
      }
    }
    cache_.push_back(std::move(e));
    return cache_.back().d;
  }

  struct Entry {
    int N, K;
    std::vector<double> d;
  };
  std::vector<double> arena_;
  std::vector<double> values_;
  std::vector<Entry> cache_;
  size_t used_ = 0;
};

}  // namespace bk
