// The per-group mathematics of every native estimator, written once for every executor.
//
// A group arrives sorted ascending (x, and the deltas permuted alongside). The estimators are the
// closed forms of docs/spec.md ("spec N.M" is its section N.M; summary in docs/conventions.md),
// with the closed forms and variable names of bonkernels/reference.py, evaluated with weight
// tables, exclusive prefix/suffix scans and group reductions. How those primitives run is the executor's business:
//   * LaneExec (lane_exec.h): one thread walks a group of up to 32 samples held in fixed-width
//     arrays; the CPU kernel's small groups and, the same code, the CUDA kernel of groups <= 16;
//   * SerialExec (serial_exec.h): one CPU thread walks a larger group; tables cached per (n, k);
//   * SegmentExec (segment_exec.h): P lanes per group of up to 16 P samples, 16 ranks per lane,
//     shuffles between them (the CUDA kernel of groups of 17..512);
//   * the CUDA block executor (csrc/cuda): one block per group (513..4096), shuffles and shared memory;
//   * PackExec (pack_exec.h): the CPU kernel's groups of one size, two or four at a time in vector
//     registers, for centred_values (grpo, rloo, dr_grpo, maxrl), maxk_values, maxk_loo1_values
//     and maxk_offpolicy_values (maxk, passk, maxk_loo1, maxk_offpolicy from a bank) only (real_t
//     below).
//
// Executor interface (Ex):
//   int n;                                       group size (> 0 when compute_group runs)
//   Ex::Vec                                      per-position storage, v[s] is a double& (PackExec:
//                                                a pack of doubles, Ex::Real)
//   void alloc(Vec&)                             make a Vec usable
//   for_each(f)                                  f(s, j) for every slot s holding rank j <= n
//   scan(reverse, id, op, term, consume)         consume(s, j, op-fold of term over ranks before j
//                                                (after j when reverse)); term(s, j) -> T
//   reduce(id, op, term) -> T                    op-fold of term(s, j) over the group, on every lane
//   any(pred) -> bool                            pred(s, j) holds for some slot, on every lane
//   weights(N, K, at)                            at[s] = d^(N,K)_j (0 for j > N)
//   weights2(N, K, at, prev)                     also prev[s] = d^(N,K)_{j-1}
//   tables(p, code, k, body) -> bool            body(t) with the weight tables of a linear estimator
//                                                (below): one k's, or the call's bank block
//   emit(s, value)                               the final value of slot s (scattered by the executor)
// Ranks j are 1-based, as in the spec. Lambdas only ever see valid slots (j <= n).
#pragma once

#include <type_traits>
#include <utility>

#include "bonkernels/common.h"

namespace bk {

// d^(N,K)_j = C(j-1,K-1)/C(N,K) (0 for j > N) by a reversed exclusive product scan of the
// downward-recurrence factors: d_j = (K/N) suffix_product_j, suffix_product_j = prod_{N >= t > j}
// table_factor(t) = prod (t-K)/(t-1). Every factor lies in [0, 1] for t > K and the factor at
// t = K is 0, so nothing overflows (spec 0.1; reference.weight_tables, Triton _max_table).
template <class Ex, bool kPrev>
BK_HD void weights_by_scan(Ex& ex, int N, int K, typename Ex::Vec& at, typename Ex::Vec& prev) {
  const double top = bk_div_moderate(double(K), double(N < 1 ? 1 : N));
  ex.scan(true, 1.0, ProdOp(), [&](int, int j) { return table_factor(j, N, K); },
          [&](int s, int j, double suffix_product) {
            const double a = (j <= N && K >= 1) ? top * suffix_product : 0.0;
            at[s] = a > 0.0 ? a : 0.0;
            if (kPrev) {
              const double b = (j >= 2 && j <= N + 1 && K >= 1) ? top * suffix_product * table_factor(j, N, K) : 0.0;
              prev[s] = b > 0.0 ? b : 0.0;
            }
          });
}

// The type of one group's sums and products: double, or on the host's pack executor
// (pack_exec.h) a pack holding several groups' values, one per vector lane. The code written over
// it (first_value, group_centre, zscore_emit, centred_values) reads group-dependent conditions
// through select and any_lane, so it means the same for one group and for a pack.
template <class Ex, class = void>
struct real_of {
  using type = double;
};
template <class Ex>
struct real_of<Ex, std::void_t<typename Ex::Real>> {
  using type = typename Ex::Real;
};
template <class Ex>
using real_t = typename real_of<Ex>::type;

// Whether an executor fetches the value at rank 1 itself (rank1_value).
template <class Ex, class V, class = void>
struct has_rank1_value : std::false_type {};
template <class Ex, class V>
struct has_rank1_value<Ex, V, std::void_t<decltype(std::declval<Ex&>().rank1_value(std::declval<V&>()))>>
    : std::true_type {};

// The value at rank 1 (slot of the smallest x, or of the first sample for the order-free
// estimators): a sum with one non-zero term, so it is exact and a NaN or inf passes through.
template <class Ex, class V>
BK_HD real_t<Ex> first_value(Ex& ex, V& v) {
  using R = real_t<Ex>;
  // An executor that can fetch rank 1 directly (SegmentExec: one shuffle from lane 0) does; the
  // reduce's form would index the lane's array at run time (local memory on the GPU).
  if constexpr (has_rank1_value<Ex, V>::value) return ex.rank1_value(v);
  else return ex.reduce(R(0.0), SumOp(), [&](int s, int j) { return j == 1 ? R(v[s]) : R(0.0); });
}

// The group mean as x_0 + mean(x - x_0) around a group element x_0: a constant group's mean is
// exactly its value, so its residues x - mean are exactly 0 (not rounding noise). When the sum of
// residues overflows (values near the largest double), everything is first scaled by 2^-64 (an
// exact rescaling); residue(v) = (v - mean) * shrink then stays finite, whatever the spread.
template <class R>
struct Centre {
  R shrink;  // 1, or 2^-64 for extreme values
  R mean;    // the group mean times shrink
  BK_HD R residue(R v) const { return v * shrink - mean; }  // (v - mean) * shrink
  BK_HD R unshrink(R r) const {  // r / shrink, exact
    return choose(shrink == 1.0, [&] { return r; }, [&] { return r * 0x1p64; });
  }
};

template <class Ex, class V>
BK_HD Centre<real_t<Ex>> group_centre(Ex& ex, V& v) {
  using R = real_t<Ex>;
  // Values held as floats (the float-array executors) differ by less than 2^129, so no sum of
  // their residues in double overflows (it would take 2^894 samples): no rescaling arm to compile.
  constexpr bool kFloatValues = std::is_same<std::remove_cv_t<std::remove_reference_t<decltype(v[0])>>, float>::value;
  const R pivot = first_value(ex, v);
  R shrink = R(1.0);
  R offset = ex.reduce(R(0.0), SumOp(), [&](int s, int) { return v[s] - pivot; });
  const auto overflowed = !(bk_abs(offset) < BK_INF) && bk_abs(pivot) < BK_INF;
  if (!kFloatValues && any_lane(overflowed)) {  // (a group with shrink 1 sums its residues again, to the same bits)
    shrink = select(overflowed, R(0x1p-64), shrink);
    offset = ex.reduce(R(0.0), SumOp(), [&](int s, int) { return v[s] * shrink - pivot * shrink; });
  }
  return {shrink, pivot * shrink + bk_div_moderate(offset, double(ex.n))};
}

// Whether the executor applies the clip itself when it stores (Ex::kClipsOnStore = true: the CUDA
// small-group kernel clips float outputs after rounding, which gives the same result); by default
// compute_group clips before emit.
template <class Ex, class = void>
struct clips_on_store : std::false_type {};
template <class Ex>
struct clips_on_store<Ex, std::void_t<decltype(Ex::kClipsOnStore)>> : std::bool_constant<Ex::kClipsOnStore> {};

// ----------------------------------------------------------------------------- weight tables

// The estimators whose value is linear in their weight tables (spec 12) and that these kernels
// implement: a mixture over k is the same formula with mixed tables, so these read the call's bank
// when it has one. Both facts come from the registry (estimator_facts.h).
BK_HD bool reads_weight_tables(int code) { return linear_in_tables(code) && native_supports(code); }

// The tables of one linear estimator for the current group, at rank j (slot s), in the notation
// of the bank (spec 12; D, O, Q of spec 0.1):
//   maxk, passk:       A_j = D_j x_j + sum_{t>j} O_t x_t
//   maxk_loo(_c):      A_j = D_j x_j + sum_{t>j} O_t x_t - c (sum_{t<j} B_t x_t + sum_{t>j} Bp_t x_t)
//   maxk_loo1:         A_j = D_j y_j - c sum_{t<j} B_t y_t + W1 (x_j - mean of the others) / n
//   maxk_offpolicy:    spec 3.2's O(n) form in D, O, Q
// Two kinds, each formula instantiated for both (no per-sample branch between them):
//   SingleKTables: one k, from d^(n,k) (D = d, O and Q position-local from it) and d^(n-1,.) (B and
//                  Bp, with the factor c);
//   BankTables:    a mixture's block of the call's bank, one load each (c = 1), whatever the number
//                  of mixture terms.
template <class Vec>
struct SingleKTables {
  Vec d, w, w_prev;  // d^(n,k), and d^(n-1,k') at j and at j - 1
  int k;
  double c;          // factor of B and Bp
  double w1;         // maxk_loo1: weight of the k = 1 term, (x_j - mean of the others) / n
  bool has_d;        // false for maxk_loo1 at k = 1 (D = B = 0)

  // maxk_loo(_c): B and Bp, once D and O are no longer needed (fewer tables live at a time).
  template <class Ex>
  BK_HD void load_leave_one_out(Ex& ex) {
    ex.weights2(ex.n - 1, k, w, w_prev);  // d(n-1, k) at j and at j - 1
  }

  BK_HD double D(int s, int) { return has_d ? d[s] : 0.0; }
  BK_HD double O(int s, int j) { return o_from_d(d[s], j, k); }
  BK_HD double Q(int s, int j) { return q_from_o(o_from_d(d[s], j, k), j, k); }
  BK_HD double B(int s, int) { return has_d ? w[s] : 0.0; }
  BK_HD double Bp(int s, int) { return w_prev[s]; }
};

struct BankTables {
  const double* block;  // this group size's block: D, O, Q, B, Bp (n each), W1
  int n;
  double c;             // 1: the bank's B and Bp carry their factors
  double w1;

  template <class Ex>
  BK_HD void load_leave_one_out(Ex&) {}

  // Row r of the block at rank j; 0 past the group (executors may evaluate padding slots).
  BK_HD double row(int r, int j) const { return j <= n ? block[r * n + j - 1] : 0.0; }
  BK_HD double D(int, int j) const { return row(0, j); }
  BK_HD double O(int, int j) const { return row(1, j); }
  BK_HD double Q(int, int j) const { return row(2, j); }
  BK_HD double B(int, int j) const { return row(3, j); }
  BK_HD double Bp(int, int j) const { return row(4, j); }
};

// One k's tables through the executor's weights()/weights2().
template <class Ex, class Vec>
BK_HD void single_k_tables(Ex& ex, int code, int k, SingleKTables<Vec>& t) {
  const int n = ex.n;
  ex.alloc(t.d), ex.alloc(t.w), ex.alloc(t.w_prev);
  t.k = k;
  t.c = 1.0;
  t.w1 = 0.0;
  t.has_d = true;
  switch (code) {
    case MAXK_LOO:
    case MAXK_LOO_CENTERED:  // maxk_k(x without j) = sum_{t<j} w'_t x_t + sum_{t>j} w'_{t-1} x_t
      ex.weights(n, k, t.d);  // w' = d(n-1, k): load_leave_one_out
      t.c = bk_div_moderate(double(k), code == MAXK_LOO ? double(n - 1) : double(n));
      return;
    case MAXK_LOO1:  // o_{t+1} = (k/n) d^(n-1,k-1)_t; k = 1 is the RLOO term alone
      if (k == 1) {
        t.has_d = false;
        t.w1 = 1.0;
        return;
      }
      ex.weights(n, k, t.d);
      ex.weights(n - 1, k - 1, t.w);
      t.c = bk_div_moderate(double(k), double(n));
      return;
    default:
      ex.weights(n, k, t.d);
      return;
  }
}

// Whether the call reads its tables from a bank. Static-analysis builds only (bench/static_kernels.py,
// never a real build): -DBK_STATIC_BANKED makes it a compile-time yes, so the SASS holds the path
// a single-k call of a linear estimator takes when the host passes one k's bank.
BK_HD bool has_bank(const Params& p) {
#if defined(BK_STATIC_BANKED)
  return (void)p, true;
#else
  return p.bank != nullptr;
#endif
}

// The bank's block for groups of size n (5 n + 1 doubles: D, O, Q, B, Bp, W1), or null where the
// bank has none or an out-of-range one: the one lookup of with_tables, the pack executor and the
// CUDA kernel's staged copy. It leaves p.bank to its callers, which know whether there is one (a
// second test of it had made GCC compile the pack executor's maxk path 1.2x slower).
BK_HD const double* bank_block(const Params& p, int n) {
  if (int64_t(n) >= p.bank_index_len) return nullptr;
  const int64_t b = p.bank_index[n];
  if (b < 0 || b + 5 * int64_t(n) + 1 > p.bank_len) return nullptr;
  return p.bank + b;
}

// The calls an executor computes (Ex::kCalls; without one, every call). The CUDA small-group and
// segment kernels have one instantiation per set, compiled with that set's code alone: a kernel
// takes the registers of its most demanding path, so a set of lighter calls gets more warps per SM.
//   kAll:      every call (every host executor; the block kernels);
//   kOnPolicy: the calls without deltas;
//   kWide:     grpo, and maxk, passk and maxk_loo1 from the call's bank: no per-group tables, no
//              array but the rewards (at W = 32 the only calls that fit);
//   kCentred:  the registry's centred estimators (grpo, rloo, dr_grpo and maxrl): from the
//              group's centre alone, no sort, no tables, no array but the rewards;
//   kWideOffPolicy: maxk_offpolicy from the call's bank: the rewards and the clamped deltas, and
//              the deltas' prefix sum in double (sum_vec_t: the only array that is not an input).
// kWide, kCentred and kWideOffPolicy hold their arrays in float (LaneExec::Elem, SegmentExec::Elem):
// they are sent float32 rewards and deltas only, exact in float, and every sum and product stays in
// double. A call added to one of them must store in a float array nothing but its inputs (a
// computed array takes sum_vec_t). compute_group NaN-fills a call outside the executor's set
// without compiling its code there; the launcher sends none (test_group_math checks each set
// against kAll, bit for bit).
enum class LaneCalls { kAll, kOnPolicy, kWide, kCentred, kWideOffPolicy };

template <class Ex, class = void>
struct lane_calls : std::integral_constant<LaneCalls, LaneCalls::kAll> {};
template <class Ex>
struct lane_calls<Ex, std::void_t<decltype(Ex::kCalls)>> : std::integral_constant<LaneCalls, Ex::kCalls> {};

// The estimator code compute_group dispatches on for a call of the set (-1: refused). Switches of
// constants, so with the set a compile-time constant the compiler threads them into the dispatch
// and drops the refused estimators' code.
BK_HD constexpr int lane_code(LaneCalls calls, int code, bool has_bank) {
  switch (calls) {
    case LaneCalls::kOnPolicy:
      return needs_deltas(code) ? -1 : code;
    case LaneCalls::kWide:
      switch (code) {
        case MAXK: return has_bank ? MAXK : -1;
        case PASSK: return has_bank ? PASSK : -1;
        case MAXK_LOO1: return has_bank ? MAXK_LOO1 : -1;
        case GRPO: return GRPO;
        default: return -1;
      }
    case LaneCalls::kCentred:
      return centred(code) ? code : -1;
    case LaneCalls::kWideOffPolicy:
      switch (code) {
        case MAXK_OFFPOLICY: return has_bank ? MAXK_OFFPOLICY : -1;
        default: return -1;
      }
    default:
      return code;
  }
}

BK_HD bool lane_takes(LaneCalls calls, int code, bool has_bank) { return lane_code(calls, code, has_bank) >= 0; }

// From a bank, kWide takes grpo and the registry's one_pass estimators without deltas, and
// kWideOffPolicy those with deltas. lane_code lists them by hand, so that its cases return
// constants; this check stops the build where the lists and the registry part (a new one_pass
// estimator: add it to its set, after checking that set's float arrays hold only its inputs).
constexpr bool wide_sets_are_the_one_pass_estimators() {
  for (int code = 0; code < NUM_CODES; ++code) {
    const bool wide = code != GRPO && lane_code(LaneCalls::kWide, code, true) >= 0;
    const bool wide_off_policy = lane_code(LaneCalls::kWideOffPolicy, code, true) >= 0;
    if (wide != (one_pass(code) && !needs_deltas(code))) return false;
    if (wide_off_policy != (one_pass(code) && needs_deltas(code))) return false;
  }
  return true;
}
static_assert(wide_sets_are_the_one_pass_estimators(),
              "LaneCalls::kWide / kWideOffPolicy differ from the registry's one_pass estimators");

// Whether a set's arrays may be float (see LaneCalls).
BK_HD constexpr bool lane_arrays_in_float(LaneCalls calls) {
  return calls == LaneCalls::kWide || calls == LaneCalls::kCentred || calls == LaneCalls::kWideOffPolicy;
}

// Whether a set takes calls with deltas (the kernels stage and load them only for these).
BK_HD constexpr bool lane_takes_deltas(LaneCalls calls) {
  return calls == LaneCalls::kAll || calls == LaneCalls::kWideOffPolicy;
}

// An array of values computed in the group (not inputs): Ex::SumVec, double even where Ex::Vec
// holds floats, when the executor has one; else Ex::Vec.
template <class Ex, class = void>
struct sum_vec_of {
  using type = typename Ex::Vec;
};
template <class Ex>
struct sum_vec_of<Ex, std::void_t<typename Ex::SumVec>> {
  using type = typename Ex::SumVec;
};
template <class Ex>
using sum_vec_t = typename sum_vec_of<Ex>::type;

// The estimator code compute_group dispatches on: p.code, or -1 for a call outside the
// executor's set (NaN-filled).
template <class Ex>
BK_HD int dispatch_code(const Params& p) {
  return lane_code(lane_calls<Ex>::value, p.code, has_bank(p));
}

// Whether an executor may hold a copy of the bank block of its group's size (Ex::staged_bank,
// non-null when it does: the CUDA small-group kernel at W = 64 stages it in shared memory).
template <class Ex, class = void>
struct has_staged_bank : std::false_type {};
template <class Ex>
struct has_staged_bank<Ex, std::void_t<decltype(std::declval<Ex&>().staged_bank)>> : std::true_type {};

// The executors' tables(): runs body(t) with the bank's block for this group size when the call
// has a bank (BankTables; the executor's staged copy of it when it holds one), else with one k's
// tables (SingleKTables). False, without running body, when the bank has no well-formed block for
// this size.
template <class Ex, class Body>
BK_HD bool with_tables(Ex& ex, const Params& p, int code, int k, Body body) {
  if (!has_bank(p)) {
    SingleKTables<typename Ex::Vec> t;
    single_k_tables(ex, code, k, t);
    body(t);
    return true;
  }
  const int n = ex.n;
  const double* block = bank_block(p, n);
  if (block == nullptr) return false;
  if constexpr (has_staged_bank<Ex>::value)
    if (ex.staged_bank != nullptr) block = ex.staged_bank;  // the same block, in faster memory
  BankTables t{block, n, 1.0, block[5 * int64_t(n)]};
  body(t);
  return true;
}

// PKPO s_j = D_j x_j + sum_{t>j} O_t x_t (spec 2.2); calls out(s, s_j). Over real_t<Ex> (the
// host's pack executor runs it on two groups of one size from a bank).
template <class Ex, class Tables, class Vec, class Out>
BK_HD void maxk_values(Ex& ex, Tables& t, Vec& x, Out out) {
  using R = real_t<Ex>;
  ex.scan(true, R(0.0), SumOp(), [&](int s, int j) { return t.O(s, j) * x[s]; },
          [&](int s, int j, R suffix) { out(s, t.D(s, j) * x[s] + suffix); });
}

// maxk_loo1 (spec 2.4): D_j y_j - c sum_{t<j} B_t y_t with y = x - x_(1), plus the k = 1 term;
// x sorted ascending, lo = x_(1) (first_value; the caller's, before the tables: registers on the
// device). Calls emit(s, natural value). Over real_t<Ex>, as maxk_values.
template <class Ex, class Tables, class Vec, class Emit>
BK_HD void maxk_loo1_values(Ex& ex, Tables& t, Vec& x, real_t<Ex> lo, Emit emit) {
  using R = real_t<Ex>;
  const int n = ex.n;
  const double nd = double(n);
  // The k = 1 term w1 (x_j - mean of the others) / n = w1 (n x_j - total) / (n (n - 1)): one
  // division per group, not two per sample (0 for a singleton).
  const bool rloo = t.w1 != 0.0 && n > 1;
  const R total = rloo ? ex.reduce(R(0.0), SumOp(), [&](int s, int) { return R(x[s]); }) : R(0.0);
  const double rloo_factor = rloo ? bk_div_moderate(t.w1, nd * double(n - 1)) : 0.0;
  ex.scan(false, R(0.0), SumOp(), [&](int s, int j) { return t.B(s, j) * (x[s] - lo); },
          [&](int s, int j, R prefix) {
            emit(s, t.D(s, j) * (x[s] - lo) - t.c * prefix + rloo_factor * (nd * x[s] - total));
          });
}

// dsum[s] = sum_{l<j} delta_l, the deltas' exclusive prefix sum in rank order (maxk_offpolicy).
template <class Ex, class Vec, class SumVec>
BK_HD void delta_prefix(Ex& ex, Vec& delta, SumVec& dsum) {
  using R = real_t<Ex>;
  ex.scan(false, R(0.0), SumOp(), [&](int s, int) { return R(delta[s]); },
          [&](int s, int, R prefix) { dsum[s] = prefix; });
}

// maxk_offpolicy (spec 3.2) in its O(n) form: x sorted ascending, delta the clamped deltas in the
// same order, dsum their prefix (delta_prefix). Four suffix sums in one reverse scan,
//   S1 = sum_{t>j} O_t x_t, S2 = sum O_t delta_t x_t, S3 = sum Q_t dsum_t x_t, S4 = sum Q_t x_t,
// then A_j = (1 + delta_j)(D_j x_j + S1) + O_j dsum_j x_j + S2 + S3 - delta_j S4. Calls
// emit(s, natural value). Over real_t<Ex>, as maxk_values.
template <class Ex, class Tables, class Vec, class DeltaVec, class SumVec, class Emit>
BK_HD void maxk_offpolicy_values(Ex& ex, Tables& t, Vec& x, DeltaVec& delta, SumVec& dsum, Emit emit) {
  using R = real_t<Ex>;
  ex.scan(
      true, dvec_zero<4, R>(), SumOp(),
      [&](int s, int j) {
        const double o = t.O(s, j), q = t.Q(s, j);
        DVec<4, R> v;
        v.v[0] = o * x[s];             // S1
        v.v[1] = o * delta[s] * x[s];  // S2
        v.v[2] = q * dsum[s] * x[s];   // S3
        v.v[3] = q * x[s];             // S4
        return v;
      },
      [&](int s, int j, const DVec<4, R>& S) {
        const R own = t.D(s, j) * x[s] + S.v[0];  // (1 + delta_j) own: one fused multiply-add on the GPU
        emit(s, own + delta[s] * own + t.O(s, j) * dsum[s] * x[s] + S.v[1] + S.v[2] - delta[s] * S.v[3]);
      });
}

// (v - mean) / (std + eps), std the sample std (n - 1); 0 for singletons and when
// std <= rtol * scale, scale = max|v| (spec 3.3, 13.1; reference.zscore, Triton BON_MEAN/GRPO).
// Here sd_r is std in the rescaled units (std * c.shrink * r.shrink).
// Residues are centred on a group element (exactly 0 on a constant group) and rescaled by a power
// of two of the largest one before squaring, so the std neither overflows nor underflows.
template <class Ex, class Emit>
BK_HD void zscore_emit(Ex& ex, typename Ex::Vec& v, double eps, double rtol, Emit emit) {
  using R = real_t<Ex>;
  const int n = ex.n;
  const Centre<R> c = group_centre(ex, v);
  const R largest = ex.reduce(R(0.0), MaxOp(), [&](int s, int) { return bk_abs(c.residue(v[s])); });
  const auto r = pow2_scale(largest);
  const R ss = ex.reduce(R(0.0), SumOp(), [&](int s, int) {
    const R t = c.residue(v[s]) * r.shrink;
    return t * t;
  });
  const R sd_r = bk_sqrt(bk_div_moderate(ss, double(n - 1 < 1 ? 1 : n - 1)));  // std * c.shrink * r.shrink
  const R scale = rtol > 0.0 ? ex.reduce(R(0.0), MaxOp(), [&](int s, int) { return bk_abs(v[s]); }) : R(0.0);
  const auto constant = n < 2 || sd_r * r.grow <= rtol * scale * c.shrink;
  // Numerator and denominator both carry c.shrink * r.shrink: the residues are at most 4 and the
  // std is at least ~1/n there, so one moderate division per sample suffices. An eps term above
  // 2^1000 (values below ~2^-998 either way) is capped to keep the estimate in range.
  const R eps_r = eps * c.shrink * r.shrink;
  // With rtol = 0 a constant group is one whose residues are all exactly 0 (any non-zero residue,
  // rescaled, squares to at least 1): divided by 1 they give its zeros with no select per sample.
  // With rtol > 0 a near-constant group's non-zero residues are zeroed explicitly.
  const auto by_denom = group_divisor(select(constant, R(1.0), sd_r + select(eps_r < 0x1p1000, eps_r, R(0x1p1000))));
  ex.for_each([&](int s, int) {
    if (rtol > 0.0)
      emit(s, choose(constant, [] { return R(0.0); }, [&] { return by_denom(c.residue(v[s]) * r.shrink); }));
    else
      emit(s, by_denom(c.residue(v[s]) * r.shrink));
  });
}

// grpo, rloo, dr_grpo and maxrl, the estimators computed from the group's centre alone (order
// free): emit(s, natural value). Written over real_t<Ex>, so the host's pack executor runs the
// same code on several groups at once.
template <class Ex, class Emit>
BK_HD void centred_values(Ex& ex, int code, double eps, typename Ex::Vec& x, Emit emit) {
  using R = real_t<Ex>;
  const int n = ex.n;
  if (code == GRPO) {
    zscore_emit(ex, x, eps, 0.0, emit);
    return;
  }
  const Centre<R> c = group_centre(ex, x);
  if (code == RLOO) {  // x - mean of the others = (x - mean) n / (n - 1) (mean scale); 0 for a singleton
    const R factor = bk_div_moderate(R(double(n)), R(double(n - 1 < 1 ? 1 : n - 1)) * c.shrink);
    ex.for_each([&](int s, int) { emit(s, n > 1 ? c.residue(x[s]) * factor : R(0.0)); });
  } else if (code == DR_GRPO) {
    ex.for_each([&](int s, int) { emit(s, c.unshrink(c.residue(x[s]))); });
  } else {  // MAXRL: (x - mean) / mean, 0 for every sample when the mean is 0 (spec 12)
    const auto m = pow2_scale(bk_abs(c.mean));  // mean * m.shrink in [1, 4): a moderate division
    const auto by_mean = group_divisor(c.mean * m.shrink);  // (both terms carry the same shrink)
    ex.for_each([&](int s, int) {
      emit(s, choose(c.mean == 0.0, [] { return R(0.0); }, [&] { return by_mean(c.residue(x[s]) * m.shrink); }));
    });
  }
}

// One group, sorted ascending in x (delta: the clamped deltas in the same order, off-policy only;
// Ex::Vec or any array of the same values, e.g. LineArray); for the order_free estimators
// (common.h) any order of x is fine. A group holding a NaN may be in any order: it only needs
// every slot present once.
// Emits every slot's final value (scale, too-small rule and clip applied). On the lane executor
// (slots walked in order) maxk_offpolicy emits slot s after its last read of delta[s] and
// dsum[s], and reads no slot after emitting it: the CUDA kernel's groups of 64 emit into the
// deltas' own line (lane_exec.h LineArray; test_group_math checks it bit for bit).
template <class Ex, class DeltaVec>
BK_HD void compute_group(Ex& ex, const Params& p, typename Ex::Vec& x, DeltaVec& delta) {
  using Vec = typename Ex::Vec;
  const int n = ex.n;
  if (n <= 0) return;
  // A NaN or +-inf reward (or delta, off-policy) makes every value of the group NaN (the contract
  // with input checks off).
  const bool with_deltas = needs_deltas(p.code);
  const bool non_finite = ex.any([&](int s, int) {
    return !(::fabs(x[s]) < BK_INF) || (with_deltas && !(::fabs(delta[s]) < BK_INF));
  });
  if (non_finite) {
    ex.for_each([&](int s, int) { ex.emit(s, BK_NAN); });
    return;
  }
  // With a bank the too-small rule is folded into its tables: k is ignored, no group is zeroed.
  const bool banked = has_bank(p) && reads_weight_tables(p.code);
  const GroupK gk = banked ? GroupK{1, false} : effective_k(p.code, n, p.k, p.small_groups);
  // An executor whose stores clip (clips_on_store) gets the value before the clip.
  auto emit = [&](int s, double natural) {
    const double v = scale_value(p, n, natural, gk.zero);
    if constexpr (clips_on_store<Ex>::value) ex.emit(s, v);
    else ex.emit(s, clip_value(p, v));
  };
  auto fill_nan = [&]() { ex.for_each([&](int s, int) { ex.emit(s, BK_NAN); }); };
  if (gk.zero || !native_supports(p.code)) {
    const double fill = native_supports(p.code) ? 0.0 : BK_NAN;
    ex.for_each([&](int s, int) { emit(s, fill); });
    return;
  }
  const int k = gk.k;
  const double nd = double(n);

  switch (dispatch_code<Ex>(p)) {
    case MAXK:
    case PASSK: {  // passk: maxk on {0, 1} rewards (spec 2.1)
      if (!ex.tables(p, p.code, k, [&](auto& t) { maxk_values(ex, t, x, emit); })) fill_nan();
      return;
    }
    case MAXK_LOO:
    case MAXK_LOO_CENTERED: {  // s_j - c * maxk_k(x without j), spec 2.3 (k <= n - 1, so n >= 2)
      Vec a;  // s_j, then minus the prefix part (one Vec: the block kernels are short of registers)
      ex.alloc(a);
      const bool ok = ex.tables(p, p.code, k, [&](auto& t) {
        maxk_values(ex, t, x, [&](int s, double v) { a[s] = v; });
        t.load_leave_one_out(ex);
        ex.scan(false, 0.0, SumOp(), [&](int s, int j) { return t.B(s, j) * x[s]; },
                [&](int s, int, double prefix) { a[s] -= t.c * prefix; });
        ex.scan(true, 0.0, SumOp(), [&](int s, int j) { return t.Bp(s, j) * x[s]; },
                [&](int s, int, double suffix) { emit(s, a[s] - t.c * suffix); });
      });
      if (!ok) fill_nan();
      return;
    }
    case MAXK_LOO1: {
      const double lo = first_value(ex, x);  // the smallest: x is sorted
      if (!ex.tables(p, p.code, k, [&](auto& t) { maxk_loo1_values(ex, t, x, lo, emit); })) fill_nan();
      return;
    }
    case MAXK_OFFPOLICY: {  // spec 3.2, O(n) form after the sort
      sum_vec_t<Ex> dsum;  // (double on the float-array executors: a sum of deltas)
      ex.alloc(dsum);
      delta_prefix(ex, delta, dsum);
      if (!ex.tables(p, p.code, k, [&](auto& t) { maxk_offpolicy_values(ex, t, x, delta, dsum, emit); })) fill_nan();
      return;
    }
    case TANG_LOO: {  // the top sorted position gets x_(n) - x_(n-1)
      const double second = ex.reduce(-BK_INF, MaxOp(), [&](int s, int j) { return j == n - 1 ? x[s] : -BK_INF; });
      const double top = ex.reduce(-BK_INF, MaxOp(), [&](int s, int) { return x[s]; });
      ex.for_each([&](int s, int j) { emit(s, (j == n && n > 1) ? top - second : 0.0); });
      return;
    }
    case BON_MAX_MEAN: {
      const auto c = group_centre(ex, x);
      const double top = ex.reduce(-BK_INF, MaxOp(), [&](int s, int) { return x[s]; });
      ex.for_each([&](int s, int) { emit(s, x[s] == top ? c.unshrink(c.residue(x[s])) : 0.0); });
      return;
    }
    case BON_MAX_SECOND: {
      const double top = ex.reduce(-BK_INF, MaxOp(), [&](int s, int) { return x[s]; });
      const double second = ex.reduce(-BK_INF, MaxOp(), [&](int s, int) { return x[s] < top ? x[s] : -BK_INF; });
      const bool has_second = second > -BK_INF;
      ex.for_each([&](int s, int) { emit(s, (x[s] == top && has_second) ? top - second : 0.0); });
      return;
    }
    case BON_MEAN: {  // z-score of s (spec 3.3), with the constant-group guard
      SingleKTables<Vec> t;
      single_k_tables(ex, MAXK, k, t);
      Vec s_val;
      ex.alloc(s_val);
      maxk_values(ex, t, x, [&](int s, double v) { s_val[s] = v; });
      zscore_emit(ex, s_val, p.eps, kZscoreConstantRtol, emit);
      return;
    }
    case CHEN_PASSK: {  // ((n/k) s_i - R) / (sigma + eps), spec 6, with the failure probabilities
      // miss_k = 1 - R = C(n-c,k)/C(n,k) and, for a wrong sample, miss_rest = 1 - (n/k) s_i =
      // C(n-1-c,k-1)/C(n-1,k-1), each a sum of table entries (no cancellation when R is near 1);
      // sigma = sqrt((1 - miss_k) miss_k), a_pos = miss_k / (sigma + eps),
      // a_neg = (miss_k - miss_rest) / (sigma + eps), as in reference.chen_passk.
      Vec d, d_rest;
      ex.alloc(d), ex.alloc(d_rest);
      ex.weights(n, k, d);
      const double miss_k = ex.reduce(0.0, SumOp(), [&](int s, int) { return x[s] == 0.0 ? d[s] : 0.0; });
      const double n_wrong = ex.reduce(0.0, SumOp(), [&](int s, int) { return x[s] == 0.0 ? 1.0 : 0.0; });
      double miss_rest = 1.0;
      if (k > 1) {
        ex.weights(n - 1, k - 1, d_rest);
        miss_rest = ex.reduce(0.0, SumOp(), [&](int s, int j) { return double(j) < n_wrong ? d_rest[s] : 0.0; });
      }
      const double var = (1.0 - miss_k) * miss_k;
      const double sigma = bk_sqrt(var > 0.0 ? var : 0.0);
      const bool degenerate = n_wrong == nd || n_wrong < double(k);  // R is exactly 0 or 1
      const double a_pos = bk_div(miss_k, sigma + p.eps), a_neg = bk_div(miss_k - miss_rest, sigma + p.eps);
      ex.for_each([&](int s, int) { emit(s, degenerate ? 0.0 : (x[s] == 1.0 ? a_pos : a_neg)); });
      return;
    }
    case BON_RLB:
    case BON_RLB_POS: {  // Chow et al., averaged over k-subsets (spec 4), times n; names as in reference.bon_rlb
      Vec d;
      ex.alloc(d);
      ex.weights(n, k, d);
      const double R = ex.reduce(0.0, SumOp(), [&](int s, int) { return d[s] * x[s]; });
      const double c = ex.reduce(0.0, SumOp(), [&](int s, int) { return x[s]; });
      const double p_fail = bk_div_moderate(nd - c, nd);  // plug-in failure probability
      const double kd = double(k);
      const double p_km1 = ipow(p_fail, k - 1);
      const double one_minus_pk = -::expm1(kd * ::log(p_fail));  // 1 - p^k, accurate near p = 1
      const double one_minus_p = (1.0 - p_fail) > 1e-300 ? (1.0 - p_fail) : 1e-300;
      double w_plus, w_minus;
      if (p.code == BON_RLB) {
        w_plus = bk_div(kd * p_km1, one_minus_pk > 1e-300 ? one_minus_pk : 1e-300);
        w_minus = p_fail < 1.0 ? bk_div(kd * p_fail, one_minus_p) : BK_INF;
      } else {
        const double geometric = p_fail < 1.0 ? bk_div(one_minus_pk, one_minus_p) : kd;  // 1 + p + ... + p^(k-1)
        w_plus = bk_div(kd * p_km1, geometric);
        w_minus = 0.0;
      }
      const double correct_weight = bk_div_moderate(w_plus * R, c > 1.0 ? c : 1.0);
      const double wrong_weight = bk_div_moderate(w_minus * (1.0 - R), (nd - c) > 1.0 ? (nd - c) : 1.0);
      ex.for_each([&](int s, int) { emit(s, (x[s] == 1.0 ? correct_weight : wrong_weight) * nd); });
      return;
    }
    case GRPO:  // (each with its code a constant, so the device folds the dispatch away)
      centred_values(ex, GRPO, p.eps, x, emit);
      return;
    case RLOO:
      centred_values(ex, RLOO, p.eps, x, emit);
      return;
    case DR_GRPO:
      centred_values(ex, DR_GRPO, p.eps, x, emit);
      return;
    case MAXRL:
      centred_values(ex, MAXRL, p.eps, x, emit);
      return;
    default:
      ex.for_each([&](int s, int) { emit(s, BK_NAN); });
      return;
  }
}

}  // namespace bk
