// Host executor for compute_group (group_math.h): one thread walks one sorted group.
// Used by the CPU kernel for groups above the lane executor's width (lane_exec.h) and by the C++
// unit tests. Weight tables are cached per (N, K) across the
// groups one thread handles, since batches usually repeat the same group size.
#pragma once

#include <algorithm>
#include <cstring>
#include <memory>
#include <utility>
#include <cstdint>
#include <cstddef>
#include <vector>

#include "bonkernels/common.h"
#include "bonkernels/group_math.h"
#include "bonkernels/lane_exec.h"  // lane_sort_keys

namespace bk {

// Group size above which the CPU kernel radix-sorts (faster than std::sort at n = 64 already).
constexpr int kRadixSortMin = 32;

// LSD radix sort of (key, index) pairs by the key's orderable bits, 8 bits per pass; a pass whose
// digit is the same for every key is skipped (exponent bytes usually are). O(n) per group.
inline void radix_sort_pairs(std::pair<double, int32_t>* a, int n, std::vector<std::pair<uint64_t, int32_t>>& buf) {
  if (n <= 1) return;
  buf.resize(size_t(2) * n);
  std::pair<uint64_t, int32_t>* src = buf.data();
  std::pair<uint64_t, int32_t>* dst = buf.data() + n;
  for (int i = 0; i < n; ++i) src[i] = {orderable_f64(a[i].first), a[i].second};
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
  for (int i = 0; i < n; ++i) a[i] = {from_orderable_f64(src[i].first), src[i].second};
}

// Small groups of float/half/bfloat16 values: the float's orderable bits and the index packed in
// one uint64, sorted by the lane executor's branch-free network (lane_exec.h) over W = 8, 16, 32 or
// 64 slots (padded with ~0); comparison sorts mispredict on random keys.
constexpr int kNetworkSortMax = 64;

// Sorts the packed keys k[0..n) (n <= kNetworkSortMax; k needs room for the padded width).
inline void network_sort_packed(uint64_t* k, int n) {
  const int W = n <= 8 ? 8 : (n <= 16 ? 16 : (n <= 32 ? 32 : 64));
  for (int i = n; i < W; ++i) k[i] = ~uint64_t(0);
  if (W == 8) lane_sort_keys<8>(k);
  else if (W == 16) lane_sort_keys<16>(k);
  else if (W == 32) lane_sort_keys<32>(k);
  else lane_sort_keys<64>(k);
}

// LSD radix sort of packed (orderable float bits << 32 | index) words by their upper 32 bits, 11
// bits a pass (3 passes, their histograms from one read; a pass whose digit is the same for every
// word is skipped): the sort of the larger groups of float32/float16/bfloat16 rewards, half the
// bytes and passes of a sort of the doubles they widen to. Stable, so equal keys keep their index order. buf: scratch (grown).
inline void radix_sort_packed32(uint64_t* a, int n, std::vector<uint64_t>& buf) {
  if (n <= 1) return;
  if (buf.size() < size_t(n)) buf.resize(n);
  constexpr int kPasses = 3, kShift[kPasses] = {32, 43, 54};
  constexpr uint64_t kMask = 2047;
  uint32_t count[kPasses][2048] = {};  // every pass's histogram from one read of the words
  for (int i = 0; i < n; ++i) {
    const uint64_t w = a[i];
    ++count[0][(w >> 32) & kMask];
    ++count[1][(w >> 43) & kMask];
    ++count[2][w >> 54];
  }
  uint64_t* src = a;
  uint64_t* dst = buf.data();
  for (int pass = 0; pass < kPasses; ++pass) {
    const int shift = kShift[pass];
    uint32_t* c = count[pass];
    if (c[(src[0] >> shift) & kMask] == uint32_t(n)) continue;
    uint32_t sum = 0;
    for (int b = 0; b < 2048; ++b) {
      const uint32_t k = c[b];
      c[b] = sum;
      sum += k;
    }
    for (int i = 0; i < n; ++i) dst[c[(src[i] >> shift) & kMask]++] = src[i];
    std::swap(src, dst);
  }
  if (src != a) std::memcpy(a, src, sizeof(uint64_t) * size_t(n));
}

// Sort (key, index) pairs ascending by key: insertion sort for tiny groups, std::sort up to
// kRadixSortMin, an O(n) radix sort beyond. Ties may land in any order (every estimator is
// tie-invariant). NaN keys are safe: every pair comes out once (the group is then all NaN).
inline void sort_pairs(std::pair<double, int32_t>* a, int n, std::vector<std::pair<uint64_t, int32_t>>* buf = nullptr) {
  if (n <= 24) {
    for (int i = 1; i < n; ++i) {
      const auto v = a[i];
      int j = i - 1;
      while (j >= 0 && a[j].first > v.first) {
        a[j + 1] = a[j];
        --j;
      }
      a[j + 1] = v;
    }
  } else if (buf != nullptr && n > kRadixSortMin) {
    radix_sort_pairs(a, n, *buf);
  } else {
    // By the orderable bits: a total order even with NaN keys (a NaN breaks `<`'s strict weak
    // order, and std::sort may then run past the range).
    std::sort(a, a + n, [](const std::pair<double, int32_t>& l, const std::pair<double, int32_t>& r) {
      return orderable_f64(l.first) < orderable_f64(r.first);
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
    group_clock_ = ++clock_;
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

  // Four interleaved partial folds: a chain of n dependent adds (4 cycles each) would cost more
  // than the rest of a large group's work.
  template <class T, class Op, class Term>
  T reduce(T id, Op op, Term term) {
    T r0 = id, r1 = id, r2 = id, r3 = id;
    int s = 0;
    for (; s + 4 <= n; s += 4) {
      r0 = op(r0, term(s, s + 1));
      r1 = op(r1, term(s + 1, s + 2));
      r2 = op(r2, term(s + 2, s + 3));
      r3 = op(r3, term(s + 3, s + 4));
    }
    for (; s < n; ++s) r0 = op(r0, term(s, s + 1));
    return op(op(r0, r1), op(r2, r3));
  }

  template <class Pred>
  bool any(Pred pred) {
    for (int s = 0; s < n; ++s)
      if (pred(s, s + 1)) return true;
    return false;
  }

  // d^(N,K) at each rank j = 1..n (and at j - 1 into prev): views into a per-thread cache of
  // tables (no copy; group_math only reads them). N >= n - 1 in every use, so t[j] exists.
  void weights(int N, int K, Vec& at) { at.p = table(N, K) + 1; }
  void weights2(int N, int K, Vec& at, Vec& prev) {
    prev.p = table(N, K);
    at.p = prev.p + 1;
  }

  // A linear estimator's tables: the call's bank block, or one k's tables from the cache above.
  template <class Body>
  bool tables(const Params& p, int code, int k, Body body) {
    return with_tables(*this, p, code, k, body);
  }

  // Final values in sorted order; the caller scatters them back.
  void emit(int s, double v) { values_[s] = v; }
  const double* values() const { return values_.data(); }

 private:
  static constexpr int kMaxVecs = 8;
  static constexpr size_t kCacheEntries = 6;

  // t[m] = d^(N,K)_m for m = 0..max(N, n)+1 (0 outside 1..N), by the downward recurrence of spec
  // 0.1 in the reference's order: d_N = K/N, d_{j-1} = d_j f_j. The least recently used table is
  // evicted, never one the current group already holds a view of.
  double* table(int N, int K) {
    ++clock_;
    const size_t len = size_t(std::max(N, n) > 0 ? std::max(N, n) : 0) + 2;
    for (auto& e : cache_)
      if (e->N == N && e->K == K && e->d.size() >= len) {
        e->used = clock_;
        return e->d.data();
      }
    if (cache_.size() >= kCacheEntries) {
      size_t victim = 0;
      for (size_t i = 1; i < cache_.size(); ++i)
        if (cache_[i]->used < cache_[victim]->used) victim = i;
      if (cache_[victim]->used < group_clock_) cache_.erase(cache_.begin() + victim);
    }
    auto e = std::make_unique<Entry>();
    e->N = N;
    e->K = K;
    e->used = clock_;
    e->d.assign(len, 0.0);
    if (N >= 1 && K >= 1) {
      const double top = double(K) / double(N);
      double prod = 1.0;
      for (int j = N; j >= 1; --j) {
        const double v = top * prod;
        e->d[j] = v > 0.0 ? v : 0.0;
        prod *= table_factor(j, N, K);
      }
    }
    cache_.push_back(std::move(e));
    return cache_.back()->d.data();
  }

  struct Entry {
    int N, K;
    uint64_t used;
    std::vector<double> d;
  };
  std::vector<double> arena_;
  std::vector<double> values_;
  std::vector<std::unique_ptr<Entry>> cache_;
  size_t used_ = 0;
  uint64_t clock_ = 0;
  uint64_t group_clock_ = 0;  // clock_ when the current group began
};

}  // namespace bk
