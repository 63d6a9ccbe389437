// Lane executor for compute_group (group_math.h): one thread walks one small group held in
// fixed-width arrays of W slots (W = 8, 16, ...). Every loop runs over the W slots with a
// compile-time trip count and masks the slots past n, so on the GPU (one thread per group, the
// small-group CUDA kernel) the arrays live in registers, and on the host (the CPU kernel's path for
// small groups) the compiler unrolls and vectorises them. The same code runs in both places: the
// CPU tests of the CPU kernel are the tests of the GPU's small-group path.
//
// Weight tables: a linear estimator reads the call's bank (tables built once per call on the host
// and cached, a mixture's or one k's; group_math.h's with_tables); the others (bon_mean,
// chen_passk, bon_rlb) build d^(N,K) per group by the downward recurrence, O(n) per group.
#pragma once

#include <stdint.h>

#include "bonkernels/common.h"
#include "bonkernels/group_math.h"

namespace bk {

// The largest group the lane executor takes. The CPU kernel uses it up to this width; the CUDA
// small-group kernel up to kLaneWidthCuda (registers: see csrc/cuda/advantages.cu).
constexpr int kLaneWidthMax = 32;

template <int W>
struct LaneExec {
  struct Vec {
    double v[W];
    BK_HD double& operator[](int s) { return v[s]; }
  };

  int n = 0;        // group size, 1 <= n <= W
  double out[W];    // emitted values, by sorted slot (the caller scatters them)

  BK_HD void alloc(Vec&) {}

  template <class F>
  BK_HD void for_each(F f) {
    BK_UNROLL
    for (int s = 0; s < W; ++s)
      if (s < n) f(s, s + 1);
  }

  template <class T, class Op, class Term, class Consume>
  BK_HD void scan(bool reverse, T id, Op op, Term term, Consume consume) {
    T run = id;
    if (!reverse) {
      BK_UNROLL
      for (int s = 0; s < W; ++s)
        if (s < n) {
          const T t = term(s, s + 1);
          consume(s, s + 1, run);
          run = op(run, t);
        }
    } else {
      BK_UNROLL
      for (int s = W - 1; s >= 0; --s)
        if (s < n) {
          const T t = term(s, s + 1);
          consume(s, s + 1, run);
          run = op(run, t);
        }
    }
  }

  // A tree over the slots (padding slots hold the identity): depth log2(W) instead of a chain of
  // W dependent operations, and the same order on the host and the device.
  template <class T, class Op, class Term>
  BK_HD T reduce(T id, Op op, Term term) {
    T r[W];
    BK_UNROLL
    for (int s = 0; s < W; ++s) r[s] = s < n ? term(s, s + 1) : id;
    BK_UNROLL
    for (int half = W / 2; half >= 1; half >>= 1) {
      BK_UNROLL
      for (int s = 0; s < half; ++s) r[s] = op(r[s], r[s + half]);
    }
    return r[0];
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
  BK_HD void weights(int N, int K, Vec& at) { fill_weights(N, K, at, nullptr); }
  BK_HD void weights2(int N, int K, Vec& at, Vec& prev) { fill_weights(N, K, at, &prev); }

  template <class Body>
  BK_HD bool tables(const Params& p, int code, int k, Body body) {
    return with_tables(*this, p, code, k, body);
  }

  BK_HD void emit(int s, double v) { out[s] = v; }

 private:
  BK_HD void fill_weights(int N, int K, Vec& at, Vec* prev) {
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
      if (prev != nullptr && s + 1 < W) (*prev)[s + 1] = v;  // d_j is prev at rank j + 1
    }
    if (prev != nullptr) (*prev)[0] = 0.0;
  }
};

}  // namespace bk
