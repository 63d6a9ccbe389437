// Pack executor (host only): the CPU kernel's small groups of one size, L groups at a time, one
// group per lane of a vector register (L = 2 in SSE2 registers, 4 in AVX registers where the CPU
// has AVX2, 8 in AVX-512 registers where it has AVX-512: advantages_cpu.cpp). The per-group code is group_math.h's, written over
// real_t<Ex>: here a Pack of L doubles, so every sum, product, division and square root of one
// group runs on all L at once, and a long per-group chain (the centre, the largest residue, the
// sum of squares, a square root, then a division per sample) overlaps across the L groups. Each
// lane sees exactly the operations, in the same order, that the lane executor applies to one
// group, so the results are the same to the bit (test_group_math compares the centred estimators'
// packs with the lane executor; test_native every group of batches with the same group alone).
//
// It takes the registry's centred estimators, computed from the group's centre (centred_values:
// grpo, rloo, dr_grpo, maxrl) and, on groups the CPU kernel has sorted, maxk, passk, maxk_loo1 and
// maxk_offpolicy from the call's bank (maxk_values, maxk_loo1_values, maxk_offpolicy_values), all
// on finite rewards (and deltas); the CPU kernel sends every other group to the lane executor.
#pragma once

#include <stdint.h>

#include <cmath>

#include "bonkernels/common.h"
#include "bonkernels/group_math.h"
#include "bonkernels/lane_exec.h"

namespace bk {

// The vector types of L lanes (GCC's vector extension; its size cannot depend on a template
// argument, hence one specialisation per L).
template <int L>
struct PackTypes;
template <>
struct PackTypes<2> {  // one SSE2 register
  typedef double Values __attribute__((vector_size(16)));
  typedef int64_t Bits __attribute__((vector_size(16)));
  typedef uint64_t Words __attribute__((vector_size(16)));
  typedef float Floats __attribute__((vector_size(8)));
};
template <>
struct PackTypes<4> {  // one AVX register (code for it is compiled for AVX2: advantages_cpu.cpp)
  typedef double Values __attribute__((vector_size(32)));
  typedef int64_t Bits __attribute__((vector_size(32)));
  typedef uint64_t Words __attribute__((vector_size(32)));
  typedef float Floats __attribute__((vector_size(16)));
};
template <>
struct PackTypes<8> {  // one AVX-512 register (code for it is compiled for AVX-512: advantages_cpu.cpp)
  typedef double Values __attribute__((vector_size(64)));
  typedef int64_t Bits __attribute__((vector_size(64)));
  typedef uint64_t Words __attribute__((vector_size(64)));
  typedef float Floats __attribute__((vector_size(32)));
};

// A vector of L lanes from L scalars, built in registers (writing a vector's lanes one by one,
// GCC assembles four-lane vectors through memory: a store-forwarding stall each).
template <class V, class T>
BK_HD V vector_of(const T (&a)[2]) {
  return V{a[0], a[1]};
}
template <class V, class T>
BK_HD V vector_of(const T (&a)[4]) {
  return V{a[0], a[1], a[2], a[3]};
}
template <class V, class T>
BK_HD V vector_of(const T (&a)[8]) {
  return V{a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7]};
}

// L doubles, one per group, and a per-lane condition (all bits set where it holds).
template <int L>
struct Mask {
  typedef typename PackTypes<L>::Bits Raw;
  Raw m;
};

template <int L>
struct Pack {
  typedef typename PackTypes<L>::Values Raw;
  Raw v;
  Pack() = default;
  BK_HD Pack(double x) {  // every lane x (by lane, so -0.0 and NaN keep their bits)
    for (int l = 0; l < L; ++l) v[l] = x;
  }
  // Copies as one vector move: GCC copies a 32-byte struct in 16-byte halves, and reading the
  // whole vector back from such a copy stalls (store forwarding).
  BK_HD Pack(const Pack& o) : v(o.v) {}
  BK_HD Pack& operator=(const Pack& o) {
    v = o.v;
    return *this;
  }
  BK_HD static Pack of(Raw raw) {
    Pack p;
    p.v = raw;
    return p;
  }
};

#define BK_PACK_ARITHMETIC(op)                                                                   \
  template <int L>                                                                               \
  BK_HD Pack<L> operator op(Pack<L> a, Pack<L> b) { return Pack<L>::of(a.v op b.v); }           \
  template <int L>                                                                               \
  BK_HD Pack<L> operator op(Pack<L> a, double b) { return Pack<L>::of(a.v op b); }              \
  template <int L>                                                                               \
  BK_HD Pack<L> operator op(double a, Pack<L> b) { return Pack<L>::of(a op b.v); }
BK_PACK_ARITHMETIC(+)
BK_PACK_ARITHMETIC(-)
BK_PACK_ARITHMETIC(*)
BK_PACK_ARITHMETIC(/)
#undef BK_PACK_ARITHMETIC

#define BK_PACK_COMPARISON(op)                                                                   \
  template <int L>                                                                               \
  BK_HD Mask<L> operator op(Pack<L> a, Pack<L> b) { return {a.v op b.v}; }                      \
  template <int L>                                                                               \
  BK_HD Mask<L> operator op(Pack<L> a, double b) { return {a.v op b}; }
BK_PACK_COMPARISON(<)
BK_PACK_COMPARISON(<=)
BK_PACK_COMPARISON(>)
BK_PACK_COMPARISON(==)
#undef BK_PACK_COMPARISON

template <int L>
BK_HD Mask<L> operator!(Mask<L> a) { return {~a.m}; }
template <int L>
BK_HD Mask<L> operator&&(Mask<L> a, Mask<L> b) { return {a.m & b.m}; }  // lane by lane (both evaluated)
template <int L>
BK_HD Mask<L> operator||(bool a, Mask<L> b) {  // a condition of every lane, or one by lane
  return a ? Mask<L>{~typename Mask<L>::Raw{}} : b;
}

// The overloads of common.h's helpers for packs, lane by lane.
template <int L>
BK_HD bool any_lane(Mask<L> c) {
  int64_t any = 0;
  for (int l = 0; l < L; ++l) any |= c.m[l];
  return any != 0;
}
template <int L>
BK_HD Pack<L> select(Mask<L> c, Pack<L> a, Pack<L> b) {  // lane by lane (select(a > b, a, b): maxpd)
  return Pack<L>::of(c.m ? a.v : b.v);
}
template <int L, class A, class B>
BK_HD Pack<L> choose(Mask<L> c, A a, B b) {  // both branches, selected lane by lane
  return select(c, Pack<L>(a()), Pack<L>(b()));
}
template <int L>
BK_HD Pack<L> bk_abs(Pack<L> x) {
  typedef typename Mask<L>::Raw Bits;
  return Pack<L>::of((typename Pack<L>::Raw)((Bits)x.v & INT64_MAX));
}
template <int L>
BK_HD Pack<L> bk_sqrt(Pack<L> x) {
  Pack<L> r;
  for (int l = 0; l < L; ++l) r.v[l] = bk_sqrt(x.v[l]);
  return r;
}
template <int L>
BK_HD Pack<L> bk_div_moderate(Pack<L> a, Pack<L> b) { return a / b; }  // host: an IEEE division
template <int L>
BK_HD Pack<L> bk_div_moderate(Pack<L> a, double b) { return a / b; }

template <int L>
struct PackScale {
  Pack<L> shrink, grow;
};
template <int L>
BK_HD PackScale<L> pow2_scale(Pack<L> a) {
  PackScale<L> r;
  for (int l = 0; l < L; ++l) {
    const Pow2Scale s = pow2_scale(a.v[l]);
    r.shrink.v[l] = s.shrink;
    r.grow.v[l] = s.grow;
  }
  return r;
}

template <int L>
struct PackDivisor {  // GroupDivisor of a pack: on the host an IEEE division per sample
  Pack<L> b;
  BK_HD Pack<L> operator()(Pack<L> a) const { return a / b; }
};
template <int L>
BK_HD PackDivisor<L> group_divisor(Pack<L> b) { return {b}; }

// L groups of n <= W samples each, slot s of every group in one Pack; emit(s, value) hands the
// caller slot s of all L groups. The walks over the slots (for_each, reduce's tree, scan) are the
// lane executor's own, so each lane adds in the order the lane executor adds one group.
template <int W, int L, class Sink, bool kFull = false>
struct PackExec : LaneExec<W, Sink, kFull> {  // (kFull: groups of exactly W, the masks fold away)
  using Real = Pack<L>;
  using Vec = SlotArray<Pack<L>, W>;
  using SumVec = Vec;  // packs of doubles already (the base LaneExec's SumVec holds one group)

  using LaneExec<W, Sink, kFull>::n;  // group size, 1 <= n <= W (set_size)

  BK_HD void alloc(Vec&) {}

  // The call's bank block for this size (BankTables: one table entry per rank, the same for every
  // group of the pack); false when the bank has none. The CPU kernel sends packs only calls with a
  // bank (pack_takes). (A table, not a callback as in the other executors' tables(): GCC would not
  // inline the callback into the AVX2 code of packs of four.)
  BK_HD bool bank_tables(const Params& p, BankTables& t) {
    const double* block = bank_block(p, n);  // (pack_takes has seen p.bank)
    if (block == nullptr) return false;
    t = BankTables{block, n, 1.0, block[5 * int64_t(n)]};
    return true;
  }

  BK_HD void emit(int s, Pack<L> v) { this->sink(s, v); }
};

// The estimators the pack executor computes from the call's bank, on groups sorted beforehand
// (maxk_values, maxk_loo1_values, maxk_offpolicy_values): the registry's one_pass estimators. A
// list by hand, as each needs its own case where the packs are computed (advantages_cpu.cpp); the
// check below stops the build where it and the registry part.
BK_HD constexpr bool sorted_pack_code(int code) {
  return code == MAXK || code == PASSK || code == MAXK_LOO1 || code == MAXK_OFFPOLICY;
}

constexpr bool sorted_packs_are_the_one_pass_estimators() {
  for (int code = 0; code < NUM_CODES; ++code)
    if (sorted_pack_code(code) != one_pass(code)) return false;
  return true;
}
static_assert(sorted_packs_are_the_one_pass_estimators(),
              "sorted_pack_code differs from the registry's one_pass estimators");

// Whether the pack executor computes this call as a linear estimator from the call's bank.
BK_HD bool sorted_pack_takes(const Params& p) { return sorted_pack_code(p.code) && p.bank != nullptr; }

// Whether the pack executor computes this call (see the top of the file).
BK_HD bool pack_takes(const Params& p) {
  return centred(p.code) || sorted_pack_takes(p);
}

}  // namespace bk
