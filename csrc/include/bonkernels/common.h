// Definitions shared by every native backend: host/device qualifiers, estimator codes, the
// per-call parameters, and the small value types the scans work on. Torch-free on purpose, so
// the CUDA files compile with bare nvcc and the C++ tests need nothing but a compiler.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define BK_HD __host__ __device__ __forceinline__
#elif defined(__GNUC__)
// Forced on the host too: the executors' loops take the estimators' lambdas, and only a fully
// inlined compute_group lets the compiler keep the group in registers and drop the calls.
#define BK_HD inline __attribute__((always_inline))
#else
#define BK_HD inline
#endif

#if defined(__CUDACC__)
#define BK_UNROLL _Pragma("unroll")
#define BK_NO_UNROLL _Pragma("unroll 1")
#elif defined(__GNUC__) && !defined(__clang__)
#define BK_UNROLL _Pragma("GCC unroll 64")
#define BK_NO_UNROLL _Pragma("GCC unroll 1")
#else
#define BK_UNROLL
#define BK_NO_UNROLL
#endif

// INFINITY/NAN are float constants: spell them as doubles so templated reductions stay double.
#define BK_INF (static_cast<double>(INFINITY))
#define BK_NAN (static_cast<double>(NAN))

// The estimator codes, predicates (natural_scale_is_mean, uses_k, k_margin, needs_deltas,
// order_free, linear_in_tables, native_supports) and constants (kZscoreConstantRtol), generated
// from bonkernels/estimators.py by `python -m bonkernels._codegen`.
#include "bonkernels/estimator_facts.h"

namespace bk {

// The two parts of div_refine below (GroupDivisor uses them apart): two Newton steps on the reciprocal
// estimate r0 of 1/b (finite, non-zero b); then a / b from the refined reciprocal r, one correction
// of the quotient (a * r where the corrected quotient overflows).
BK_HD double refine_reciprocal(double b, double r0) {
  const double r = fma(fma(-b, r0, 1.0), r0, r0);
  return fma(fma(-b, r, 1.0), r, r);
}
BK_HD double quotient_from_reciprocal(double a, double b, double r) {
  const double q0 = a * r;
  const double q1 = fma(fma(-b, q0, a), r, q0);
  return ::fabs(q1) < BK_INF ? q1 : q0;
}

// a / b from an estimate r0 of 1/b good to ~20 bits: two Newton steps on the reciprocal, one
// correction of the quotient (within an ulp or so). IEEE special cases as a / b: b = 0 or +-inf
// give a * r0 (+-inf or +-0), an infinite or NaN a passes through. Host-testable with any r0.
BK_HD double div_refine(double a, double b, double r0) {
  if (!(::fabs(b) < BK_INF) || b == 0.0) return a * r0;
  return quotient_from_reciprocal(a, b, refine_reciprocal(b, r0));
}

// a / b from an estimator rcp(x) of 1/x that is only good (~20 bits) for |x| in [2^-1000, 2^1000]:
// the GPU's rcp.approx.ftz flushes subnormal inputs (1/b -> inf: div_refine would give NaN) and
// subnormal results (1/b -> 0). A finite b outside that range is first brought inside by an exact
// power of two, applied to a as well; a * s over- or underflows only where a / b does too.
// Host-testable with an emulated estimator.
template <class Rcp>
BK_HD double div_with_estimate(double a, double b, Rcp rcp) {
  double r0 = rcp(b);
  const double m = ::fabs(b);
  if (!(m >= 0x1p-1000 && m <= 0x1p1000) && m != 0.0 && m < BK_INF) {  // rare: rescale
    const double s = m < 1.0 ? 0x1p600 : 0x1p-600;
    a *= s;
    b *= s;
    r0 = rcp(b);
  }
  return div_refine(a, b, r0);
}

// a / b in the per-element paths. On the GPU, IEEE double division is an out-of-line ptxas
// subroutine whose calling convention costs stack and register spills; the hardware reciprocal
// estimate refined by div_refine stays inline.
BK_HD double bk_div(double a, double b) {
#if defined(__CUDA_ARCH__)
  return div_with_estimate(a, b, [](double x) {
    double r0;
    asm("rcp.approx.ftz.f64 %0, %1;" : "=d"(r0) : "d"(x));
    return r0;
  });
#else
  return a / b;
#endif
}

// a / b for a denominator known to lie in [2^-1000, 2^1000] or to be 0 (a count such as n or j - 1,
// a power-of-two scale, a value rescaled by pow2_scale): the estimate needs no rescaling, so the
// per-element paths stay lean (bk_div's rescaling there costs registers in the largest kernels).
BK_HD double bk_div_moderate(double a, double b) {
#if defined(__CUDA_ARCH__)
  double r0;
  asm("rcp.approx.ftz.f64 %0, %1;" : "=d"(r0) : "d"(b));
  return div_refine(a, b, r0);
#else
  return a / b;
#endif
}

// sqrt(x) for a normal, finite x > 0 from an estimate y0 of 1/sqrt(x) good to ~20 bits: two
// Newton steps on the reciprocal root, one correction of the root. Host-testable with any y0.
BK_HD double sqrt_refine(double x, double y0) {
  double y = y0 * fma(-0.5 * x * y0, y0, 1.5);
  y = y * fma(-0.5 * x * y, y, 1.5);
  const double s = x * y;
  return fma(0.5 * y, fma(-s, s, x), s);
}

// sqrt for the group statistics (x >= 0): inline on the GPU for the same reason as bk_div
// (reciprocal square root estimate, two Newton steps, one correction: within an ulp or so).
BK_HD double bk_sqrt(double x) {
#if defined(__CUDA_ARCH__)
  if (!(x > 0.0) || x == BK_INF) return x > 0.0 ? x : (x == 0.0 ? 0.0 : BK_NAN);
  double unscale = 1.0;
  if (x < 1e-290) {  // keep the estimate away from flushed subnormals
    x *= 0x1p600;
    unscale = 0x1p-300;
  }
  double y0;
  asm("rsqrt.approx.ftz.f64 %0, %1;" : "=d"(y0) : "d"(x));
  return sqrt_refine(x, y0) * unscale;
#else
  return ::sqrt(x);
#endif
}

BK_HD double bits_to_double(uint64_t u) {
#if defined(__CUDA_ARCH__)
  return __longlong_as_double(static_cast<long long>(u));
#else
  double d;
  std::memcpy(&d, &u, sizeof(d));
  return d;
#endif
}

BK_HD uint64_t double_to_bits(double d) {
#if defined(__CUDA_ARCH__)
  return static_cast<uint64_t>(__double_as_longlong(d));
#else
  uint64_t u;
  std::memcpy(&u, &d, sizeof(u));
  return u;
#endif
}

// A float's bits, and the float of given bits (bit for bit: no NaN is canonicalised).
BK_HD uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
#endif
}

BK_HD float float_from_bits(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
#endif
}

// A float's bits as an unsigned integer in the same order (negatives: all bits flipped; the rest:
// sign bit set), and back. Exact for every float, so a float16/bfloat16/float32 reward is recovered
// from its sort key without a second load.
BK_HD uint32_t orderable_f32(float f) {
  const uint32_t u = float_bits(f);
  // Branch-free: negatives (sign set) flip every bit, the rest only the sign bit.
  return u ^ (uint32_t(int32_t(u) >> 31) | 0x80000000u);
}

BK_HD float from_orderable_f32(uint32_t o) {
  return float_from_bits(o ^ (~uint32_t(int32_t(o) >> 31) | 0x80000000u));  // the inverse flip
}

// The same for doubles: unsigned integers in the same order (-0 before +0; a total order on all
// 2^64 bit patterns, NaNs beyond +-inf by their sign), and back. The sort key of every sort in
// the native kernels (CPU radix and comparison sorts, the lane networks, the CUDA guards' order).
BK_HD uint64_t orderable_f64(double d) {
  const uint64_t u = double_to_bits(d);
  return (u >> 63) ? ~u : (u | 0x8000000000000000ull);
}

BK_HD double from_orderable_f64(uint64_t o) {
  return bits_to_double((o >> 63) ? (o & 0x7fffffffffffffffull) : ~o);
}

// An exact power-of-two rescaling of magnitudes up to a (a >= 0): a * shrink lies in [1, 4)
// (subnormal a: well inside the normal range) and grow = 1 / shrink, both powers of two. Squares of values scaled so
// neither overflow nor underflow; zero, inf and NaN get 1 (nothing to rescale).
struct Pow2Scale {
  double shrink, grow;
};
BK_HD Pow2Scale pow2_scale(double a) {
  const int E = int((double_to_bits(a) >> 52) & 0x7ff);  // biased exponent
  if (a == 0.0 || E == 0x7ff) return {1.0, 1.0};
  if (E == 0) return {0x1p600, 0x1p-600};
  const int inverse = E < 2046 ? 2046 - E : 1;  // biased exponent of 2^-(E-1023), at least 2^-1022
  return {bits_to_double(uint64_t(inverse) << 52), bits_to_double(uint64_t(2046 - inverse) << 52)};
}

// One call's scalar arguments, as the backend interface passes them (docs/conventions.md).
struct Params {
  int k;             // requested k (>= 1)
  int code;          // estimator code
  int small_groups;  // 0 = error (already checked), 1 = zero, 2 = clamp
  int has_clamp;     // clamp deltas to [-clamp_delta, clamp_delta] first
  double clamp_delta;
  double clip_lo, clip_hi;
  int mean_scale;    // 1: output n_g * (sum-scale value)
  double eps;
  // Mixture-table bank (spec 12), on the values' device; null without k weights. Block of groups
  // of size n at bank + bank_index[n] (-1: none): D, O, Q, B, Bp (n each) and W1 (group_math.h).
  const double* bank;
  const int64_t* bank_index;
  int64_t bank_len;        // entries in bank
  int64_t bank_index_len;  // entries in bank_index (largest group size + 1)
};

// The k a group of size n actually uses, and whether its outputs are forced to 0 (too-small rule).
struct GroupK {
  int k;
  bool zero;
};

BK_HD GroupK effective_k(int code, int n, int k, int small_groups) {
  if (!uses_k(code)) return {k < 1 ? 1 : k, false};
  const int k_max = n - k_margin(code);
  const bool too_small = k > k_max;
  int kg = k;
  bool zero;
  if (small_groups == 2) {
    if (too_small) kg = k_max;
    zero = kg < 1;
  } else {
    zero = too_small;
  }
  return {kg < 1 ? 1 : kg, zero};
}

// a / b for many a and one b per group (a group's denominator: moderate, as for bk_div_moderate,
// or 0 or +-inf). On the GPU the reciprocal is refined once per group and each quotient takes only
// div_refine's final correction (the same result as bk_div_moderate); on the host an IEEE division.
// Two registers: for b = 0 or +-inf the stored b is NaN, so the correction is NaN and the quotient
// falls back to a * rcp(b), div_refine's special case, with no flag.
struct GroupDivisor {
  double b, r;
  BK_HD explicit GroupDivisor(double denominator) : b(denominator), r(0.0) {
#if defined(__CUDA_ARCH__)
    double r0;
    asm("rcp.approx.ftz.f64 %0, %1;" : "=d"(r0) : "d"(b));
    r = r0;
    if (!(::fabs(b) < BK_INF) || b == 0.0) b = BK_NAN;
    else r = refine_reciprocal(b, r0);
#endif
  }
  BK_HD double operator()(double a) const {
#if defined(__CUDA_ARCH__)
    return quotient_from_reciprocal(a, b, r);
#else
    return a / b;
#endif
  }
};

BK_HD GroupDivisor group_divisor(double denominator) { return GroupDivisor(denominator); }

// a / n for a count n >= 1. A power of two (the usual group sizes; a constant in the kernels'
// full-group copies) divides as a multiplication by its exact reciprocal, which is the same
// correctly rounded quotient; any other n divides (bk_div_moderate).
BK_HD double div_by_count(double a, int n) {
  if ((n & (n - 1)) == 0) {
#if defined(__CUDA_ARCH__)
    const int log2n = __ffs(n) - 1;
#else
    const int log2n = __builtin_ctz(static_cast<unsigned>(n));
#endif
    return a * bits_to_double(uint64_t(1023 - log2n) << 52);
  }
  return bk_div_moderate(a, double(n));
}

// Natural value -> requested scale -> too-small zeroing (finish_value then clips).
BK_HD double scale_value(const Params& p, int n, double natural, bool zero) {
  double a = natural;
  const bool mean_natural = natural_scale_is_mean(p.code);
  if (p.mean_scale && !mean_natural) a = a * n;
  else if (!p.mean_scale && mean_natural) a = div_by_count(a, n < 1 ? 1 : n);
  if (zero) a = 0.0;
  return a;
}

// The clip; a NaN passes through, as in torch.clamp.
BK_HD double clip_value(const Params& p, double a) {
  if (a < p.clip_lo) a = p.clip_lo;
  if (a > p.clip_hi) a = p.clip_hi;
  return a;
}

BK_HD double finish_value(const Params& p, int n, double natural, bool zero) {
  return clip_value(p, scale_value(p, n, natural, zero));
}

// Small fixed-size vector of doubles (or of the host's packs, pack_exec.h), for scans that carry
// several running sums at once.
template <int M, class T = double>
struct DVec {
  T v[M];
};

// The operators take doubles, and (the templates) the host's packs of several groups' values
// (pack_exec.h); the double overloads keep mixed float/double calls as they were.
struct SumOp {
  BK_HD double operator()(double a, double b) const { return a + b; }
  template <class T>
  BK_HD T operator()(const T& a, const T& b) const { return a + b; }
  template <int M, class T>
  BK_HD DVec<M, T> operator()(const DVec<M, T>& a, const DVec<M, T>& b) const {
    DVec<M, T> r;
BK_UNROLL
    for (int i = 0; i < M; ++i) r.v[i] = a.v[i] + b.v[i];
    return r;
  }
};
struct ProdOp {
  BK_HD double operator()(double a, double b) const { return a * b; }
};
struct MaxOp {
  BK_HD double operator()(double a, double b) const { return a > b ? a : b; }
  template <class T>
  BK_HD T operator()(const T& a, const T& b) const { return select(a > b, a, b); }
};
struct MinOp {
  BK_HD double operator()(double a, double b) const { return a < b ? a : b; }
};

// c ? a : b, component by component (a ternary on structs makes nvcc select between addresses,
// which puts both operands in local memory).
BK_HD double select(bool c, double a, double b) { return c ? a : b; }

// Code that runs on one group's doubles here and on several groups at once on the host's pack
// executor (pack_exec.h overloads these for its packs): whether the condition holds for some
// group, |x|, and a divisor shared by a group's samples.
BK_HD bool any_lane(bool c) { return c; }
BK_HD double bk_abs(double x) { return ::fabs(x); }
// (|x| of a float array's entry in float: widening first cost the W = 32 small-group kernel 18 registers.)
BK_HD float bk_abs(float x) { return ::fabsf(x); }
// c ? a() : b(), evaluating only the branch taken (a pack evaluates both and selects by lane):
// an eager select would make the device compute a division the ternary skips, and hold it.
template <class A, class B>
BK_HD auto choose(bool c, A a, B b) -> decltype(a()) {
  return c ? a() : b();
}
template <int M>
BK_HD DVec<M> select(bool c, const DVec<M>& a, const DVec<M>& b) {
  DVec<M> r;
  BK_UNROLL
  for (int i = 0; i < M; ++i) r.v[i] = c ? a.v[i] : b.v[i];
  return r;
}

template <int M, class T = double>
BK_HD DVec<M, T> dvec_zero() {
  DVec<M, T> r;
BK_UNROLL
  for (int i = 0; i < M; ++i) r.v[i] = T(0.0);
  return r;
}

// Downward ratio recurrence factor of spec 0.1: d_{t-1} = d_t * (t-K)/(t-1), for 2 <= t <= N.
BK_HD double table_factor(int t, int N, int K) {
  return (t >= 2 && t <= N) ? bk_div_moderate(double(t - K), double(t - 1)) : 1.0;
}

// base^e for an integer e >= 0 by repeated squaring (a few ulp; avoids pow's out-of-line call
// on the GPU, whose calling convention costs stack and register spills).
BK_HD double ipow(double base, int e) {
  double r = 1.0;
  while (e > 0) {
    if (e & 1) r *= base;
    base *= base;
    e >>= 1;
  }
  return r;
}

// o_j = d_j (k-1)/(j-1), q_j = o_j (k-2)/(j-2): position-local, from the d table (spec 0.1).
BK_HD double o_from_d(double d, int j, int k) { return j >= 2 ? bk_div_moderate(d * double(k - 1), double(j - 1)) : 0.0; }
BK_HD double q_from_o(double o, int j, int k) {
  const double q = j >= 3 ? bk_div_moderate(o * double(k - 2), double(j - 2)) : 0.0;
  return q > 0.0 ? q : 0.0;
}

}  // namespace bk
