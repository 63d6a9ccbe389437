// Segment executor for compute_group (group_math.h): a group of up to P * ITEMS samples held by a
// segment of P cooperating lanes, ITEMS consecutive ranks per lane in registers (lane l holds ranks
// l * ITEMS + 1 .. l * ITEMS + ITEMS). Each lane runs the serial code of the lane executor over its
// own slots; what crosses lanes goes through a Team, whose only primitives are "the value lane
// `src` passed to this same call" and "does any lane hold true": on the GPU the shuffles of one
// warp (the CUDA kernel for groups of 17..512 samples), on the host a thread per lane meeting at a
// barrier (csrc/tests/test_group_math.cpp, check_segments), so the host tests run this file's device
// logic.
//
//   sort:   each lane sorts its ITEMS with the lane executor's odd-even network, then lanes merge
//           in pairs, fours, ...: a mirror compare between the two halves of the merged span
//           (rank r against the span's rank S-1-r), then half-cleaners, across lanes for strides
//           of ITEMS or more and inside the lane below;
//   scan:   a lane folds its own terms, the lanes' totals are scanned across the segment (log2 P
//           exchanges), then each lane walks its slots from that carry;
//   reduce: a lane folds its own terms, then a butterfly over the lanes (op(a, b) and op(b, a) are
//           equal bit for bit for sum, product and max, so every lane ends with the same value).
//
// Team interface:
//   int lane;                                   this lane, 0 <= lane < P
//   T take(const T& v, int src)                 every lane of the segment calls it; returns the v
//                                               of lane src (0 <= src < P)
//   bool any(bool b)                            every lane of the segment calls it
// Every lane of a segment makes the same sequence of Team calls: compute_group branches only on
// values that are equal on every lane (sizes, codes, reductions).
#pragma once

#include <stdint.h>

#include <type_traits>

#include "bonkernels/common.h"
#include "bonkernels/group_math.h"
#include "bonkernels/lane_exec.h"

namespace bk {

// Ranks per lane: the register arrays of the lane executor at its default width.
constexpr int kSegmentItems = 16;

// Sort entries: finite keys (the caller NaN-fills a group with a NaN or inf first) with their
// source index. Equal keys never exchange indices, so every exchange keeps key and index paired
// and the network is a permutation of the entries.
template <class K>
BK_HD void sort_exchange(K& key_i, int& idx_i, K& key_j, int& idx_j) {
  const K a = key_i, b = key_j;
  const int ia = idx_i, ib = idx_j;
  const bool swap = b < a;
  key_i = swap ? b : a;
  key_j = swap ? a : b;
  idx_i = swap ? ib : ia;
  idx_j = swap ? ia : ib;
}

// Ascending sort of the segment's P * ITEMS entries into the blocked layout (lane l, slot s holds
// rank l * ITEMS + s). Pad with +inf keys past the group: they stay last.
template <int P, int ITEMS, class Team, class K>
BK_HD void segment_sort(Team& team, K* key, int* idx) {
  static_assert((P & (P - 1)) == 0 && P <= 32 && (ITEMS & (ITEMS - 1)) == 0, "powers of two");
  static_assert(std::is_floating_point<K>::value, "dir * key (below) is exact for floating point");
  auto exchange = [&](int i, int j) { sort_exchange(key[i], idx[i], key[j], idx[j]); };
  odd_even_passes<ITEMS, 1, 1>(exchange);
  const int lane = team.lane;
  BK_UNROLL
  for (int span = 2; span <= P; span <<= 1) {  // lanes per merged run
    // Mirror: rank r of the lower half against rank S-1-r of the upper half, the lower lane keeps
    // the smaller. That is slot c of lane l against slot ITEMS-1-c of lane l ^ (span - 1). Both
    // lanes take slots c and ITEMS-1-c together, send both before either changes, and update both.
    // Every compare-exchange here and below takes the other entry when dir * other < dir * own,
    // dir = +1 on the lane that keeps the smaller and -1 on the other (exact for floating-point
    // keys, strict both ways, so equal keys stay put): the same code on every lane. With the side
    // chosen by a select instead, nvcc branched on it in each slot and checked convergence
    // before every shuffle after the branch (sm_90, kWide: a sixth to a quarter of the path).
    const K dir = (lane & (span >> 1)) == 0 ? K(1) : K(-1);
    const int mirror = lane ^ (span - 1);
    BK_UNROLL
    for (int c = 0; c < ITEMS / 2; ++c) {
      const int u = ITEMS - 1 - c;
      const K from_u = team.take(key[u], mirror);  // for slot c
      const int from_u_idx = team.take(idx[u], mirror);
      const K from_c = team.take(key[c], mirror);  // for slot u
      const int from_c_idx = team.take(idx[c], mirror);
      const bool take_c = dir * from_u < dir * key[c];
      const bool take_u = dir * from_c < dir * key[u];
      key[c] = take_c ? from_u : key[c];
      idx[c] = take_c ? from_u_idx : idx[c];
      key[u] = take_u ? from_c : key[u];
      idx[u] = take_u ? from_c_idx : idx[u];
    }
    // Half-cleaners across lanes (strides of span/4 .. 1 lanes): the same slot of both lanes.
    BK_UNROLL
    for (int d = span >> 2; d >= 1; d >>= 1) {
      const K dir = (lane & d) == 0 ? K(1) : K(-1);
      BK_UNROLL
      for (int c = 0; c < ITEMS; ++c) {
        const K other = team.take(key[c], lane ^ d);
        const int other_idx = team.take(idx[c], lane ^ d);
        const bool take = dir * other < dir * key[c];
        key[c] = take ? other : key[c];
        idx[c] = take ? other_idx : idx[c];
      }
    }
    // Half-cleaners inside the lane (strides ITEMS/2 .. 1).
    BK_UNROLL
    for (int stride = ITEMS / 2; stride >= 1; stride >>= 1) {
      BK_UNROLL
      for (int i = 0; i < ITEMS; ++i)
        if ((i & stride) == 0) exchange(i, i + stride);
    }
  }
}

// The Sink receives emit(s, value) for the lane's valid slots and holds idx, the source index of
// each slot (written by the sort); its kCalls, if any, is the set of calls the executor computes
// (group_math.h's LaneCalls; without one, every call). kFull: the group fills the P * ITEMS slots
// (n a compile-time constant, as LaneExec's kFull), so no slot is masked.
template <int P, int ITEMS, class Team, class Sink, bool kFull = false>
struct SegmentExec : LaneSize<P * ITEMS, kFull> {
  static constexpr LaneCalls kCalls = lane_calls<Sink>::value;  // the calls it computes (group_math.h)
  static constexpr bool kClipsOnStore = clips_on_store<Sink>::value;  // the sink clips (group_math.h)
  // As LaneExec: the float sets hold their inputs in float (float32 rewards and deltas only).
  using Elem = std::conditional_t<lane_arrays_in_float(kCalls), float, double>;
  using Vec = SlotArray<Elem, ITEMS>;
  using SumVec = SlotArray<double, ITEMS>;  // values computed in the group (sum_vec_t, group_math.h)
  using LaneSize<P * ITEMS, kFull>::n;  // group size, 1 <= n <= P * ITEMS (set_size)
  int first;                            // 0-based rank of this lane's slot 0
  Team team;
  Sink sink;

  template <class Array>
  BK_HD void alloc(Array&) {}  // Vec or SumVec: fixed arrays, nothing to allocate
  BK_HD bool valid(int s) const { return kFull || first + s < n; }  // slot s holds a sample

  template <class F>
  BK_HD void for_each(F f) {
    BK_UNROLL
    for (int s = 0; s < ITEMS; ++s)
      if (valid(s)) f(s, first + s + 1);
  }

  // Exclusive scan in rank order (reverse: from the top rank down). Two passes over the lane's
  // slots (lane_exec.h's fold_slots, then walk_slots from the carry), term evaluated in each, so no
  // per-slot partial values stay live in registers.
  template <class T, class Op, class Term, class Consume>
  BK_HD void scan(bool reverse, T id, Op op, Term term, Consume consume) {
    const T total = fold_slots<ITEMS, kFull>(first, n, id, op, term);
    walk_slots<ITEMS, kFull>(first, n, reverse, lanes_exclusive(reverse, total, id, op), op, term, consume);
  }

  template <class T, class Op, class Term>
  BK_HD T reduce(T id, Op op, Term term) {
    T r = fold_slots<ITEMS, kFull>(first, n, id, op, term);
    BK_UNROLL
    for (int d = P / 2; d >= 1; d >>= 1) r = op(r, team.take(r, team.lane ^ d));
    return r;
  }

  // The value at rank 1 (lane 0's slot 0) on every lane, as first_value's reduce gives it
  // (0.0 + x: a -0 comes out +0): one shuffle, where the reduce's term picked slot -first of the
  // lane's array, a run-time index that put the array in local memory on the GPU.
  template <class V>
  BK_HD double rank1_value(V& v) {
    return 0.0 + double(team.take(v[0], 0));
  }

  template <class Pred>
  BK_HD bool any(Pred pred) {
    bool found = false;
    BK_UNROLL
    for (int s = 0; s < ITEMS; ++s) found = found | (valid(s) && pred(s, first + s + 1));
    return team.any(found);
  }

  BK_HD void weights(int N, int K, Vec& at) { weights_by_scan<SegmentExec, false>(*this, N, K, at, at); }
  BK_HD void weights2(int N, int K, Vec& at, Vec& prev) { weights_by_scan<SegmentExec, true>(*this, N, K, at, prev); }

  template <class Body>
  BK_HD bool tables(const Params& p, int code, int k, Body body) {
    return with_tables(*this, p, code, k, body);
  }

  BK_HD void emit(int s, double v) { sink(s, v); }

 private:
  // op-fold of the totals of the lanes before this one (after it when reverse): an inclusive
  // Hillis-Steele scan over the P lanes, then a shift by one lane.
  template <class T, class Op>
  BK_HD T lanes_exclusive(bool reverse, T v, T id, Op op) {
    const int lane = team.lane;
    BK_UNROLL
    for (int d = 1; d < P; d <<= 1) {
      const bool has = reverse ? lane + d < P : lane >= d;
      const T o = team.take(v, has ? (reverse ? lane + d : lane - d) : lane);
      if (has) v = reverse ? op(v, o) : op(o, v);
    }
    const bool has = reverse ? lane + 1 < P : lane >= 1;
    const T shifted = team.take(v, has ? (reverse ? lane + 1 : lane - 1) : lane);
    return select(has, shifted, id);
  }
};

}  // namespace bk
