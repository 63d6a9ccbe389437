"""The fused advantages kernel: every group of a packed batch, sorted, weighted, scanned, in one launch.

One program handles GROUPS groups, each padded to a power-of-two BLOCK (padding sorts last as +inf).
All arithmetic is float64, as in the reference (docs/conventions.md); the output is cast at the end.

Specialisations (compile-time): the pointer dtypes, BLOCK (with GROUPS and the sort method derived
from it by the launcher). The estimator, k, the small-group mode, clamping and clipping are runtime
scalars, so neither a new estimator nor a new k nor a new group size (within a bucket) recompiles.
"""

import triton
import triton.language as tl

# Estimator codes of bonkernels/estimators.py (the tests check they agree). Triton kernels may only
# read globals that are constexpr.
CODES = {"maxk": 0, "maxk_loo": 1, "maxk_loo_centered": 2, "maxk_loo1": 3, "maxk_offpolicy": 4,
         "passk": 6, "tang_loo": 7, "bon_max_mean": 8, "bon_max_second": 9, "bon_mean": 10,
         "chen_passk": 11, "bon_rlb": 12, "bon_rlb_pos": 13, "grpo": 14, "rloo": 15, "dr_grpo": 16}
FIRST_MEAN_SCALE_CODE_INT = 8  # codes >= 8 have the "mean" natural scale
ZSCORE_CONSTANT_RTOL_FLOAT = 1e-10  # estimators.ZSCORE_CONSTANT_RTOL (checked by the tests)

MAXK = tl.constexpr(CODES["maxk"])
MAXK_LOO = tl.constexpr(CODES["maxk_loo"])
MAXK_LOO_CENTERED = tl.constexpr(CODES["maxk_loo_centered"])
MAXK_LOO1 = tl.constexpr(CODES["maxk_loo1"])
MAXK_OFFPOLICY = tl.constexpr(CODES["maxk_offpolicy"])
PASSK = tl.constexpr(CODES["passk"])
TANG_LOO = tl.constexpr(CODES["tang_loo"])
BON_MAX_MEAN = tl.constexpr(CODES["bon_max_mean"])
BON_MAX_SECOND = tl.constexpr(CODES["bon_max_second"])
BON_MEAN = tl.constexpr(CODES["bon_mean"])
CHEN_PASSK = tl.constexpr(CODES["chen_passk"])
BON_RLB = tl.constexpr(CODES["bon_rlb"])
BON_RLB_POS = tl.constexpr(CODES["bon_rlb_pos"])
GRPO = tl.constexpr(CODES["grpo"])
RLOO = tl.constexpr(CODES["rloo"])
DR_GRPO = tl.constexpr(CODES["dr_grpo"])
FIRST_MEAN_SCALE_CODE = tl.constexpr(FIRST_MEAN_SCALE_CODE_INT)
ZSCORE_CONSTANT_RTOL = tl.constexpr(ZSCORE_CONSTANT_RTOL_FLOAT)


@triton.jit
def _suffix_exclusive(v):
    """sum_{t > j} v_t along the group axis."""
    return tl.cumsum(v, axis=1, reverse=True) - v


@triton.jit
def _prefix_exclusive(v):
    """sum_{t < j} v_t along the group axis."""
    return tl.cumsum(v, axis=1) - v


@triton.jit
def _max_table(rank, n, k):
    """d_r(n, k) = C(r-1, k-1) / C(n, k) in float64, 0 outside 1 <= r <= n.

    `rank` must grow by one along axis 1. Spec 0.1's downward recurrence d_r = d_{r+1} (r+1-k)/r
    from d_n = k/n, written as a reverse cumulative product: every factor is in [0, 1], so nothing
    overflows (there is no lgamma in the interpreter, and float64 lgamma would cost more).
    """
    rf = rank.to(tl.float64)
    kf = k.to(tl.float64)
    links = (rank >= 1) & (rank < n)
    factor = tl.where(links, tl.maximum(rf + 1.0 - kf, 0.0) / tl.maximum(rf, 1.0), 1.0)
    tail = tl.cumprod(factor, axis=1, reverse=True)
    return tl.where((rank >= 1) & (rank <= n), kf / tl.maximum(n, 1).to(tl.float64) * tail, 0.0)


@triton.jit
def _order_key32(x):
    """int32 whose signed order is the float32 order of x (finite values and +inf)."""
    bits = x.to(tl.int32, bitcast=True)
    return tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)


@triton.jit
def _order_key64(x):
    """int64 whose signed order is the float64 order of x (finite values and +inf)."""
    bits = x.to(tl.int64, bitcast=True)
    return tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFFFFFFFFFF)


@triton.jit
def _sort_perm_by_rank(keys, cols):
    """Sorting permutation of each row by rank-by-comparison: O(BLOCK^2), for small blocks.

    Returns perm[g, p] = column of the element at ascending position p (ties by column).
    """
    ki = keys[:, :, None]
    kj = keys[:, None, :]
    ci = cols[:, :, None]
    cj = cols[:, None, :]
    before = (kj < ki) | ((kj == ki) & (cj < ci))
    rank = tl.sum(before.to(tl.int32), axis=2)
    # Invert: position p holds the column whose rank is p.
    hit = rank[:, None, :] == cols[:, :, None]
    return tl.sum(tl.where(hit, cols[:, None, :], 0), axis=2)


@triton.jit
def _sort_perm_by_packed_sort(values_ptr, start, n, raw, cols):
    """Sorting permutation of each row with tl.sort on packed (32-bit key, 32-bit column) int64s."""
    if raw.dtype == tl.float64:
        # A float64 key leaves no room for the column: sort twice (least significant digit first),
        # by the low 32 key bits, then by the high 32 bits with ties kept in first-pass order
        # (the first-pass position rides in bits 16-31, the column in bits 0-15: BLOCK <= 65536).
        key = _order_key64(raw)
        low = (key & 0xFFFFFFFF) - 0x80000000  # unsigned order -> signed order
        first = tl.sort((low << 32) | cols.to(tl.int64), dim=1)
        first_cols = first & 0xFFFF  # column at each first-pass position
        again = tl.load(values_ptr + start + first_cols, mask=first_cols < n, other=float("inf"))
        high = _order_key64(again) >> 32
        second = tl.sort((high << 32) | (cols.to(tl.int64) << 16) | first_cols, dim=1)
        perm = (second & 0xFFFF).to(tl.int32)
    else:
        key = _order_key32(raw.to(tl.float32))
        packed = tl.sort((key.to(tl.int64) << 32) | cols.to(tl.int64), dim=1)
        perm = (packed & 0xFFFFFFFF).to(tl.int32)
    return perm


@triton.jit
def _float64_from_bits(bits):
    """Float scalars travel as their float64 bit patterns: the interpreter would round a Python
    float argument to float32 (0.2 -> 0.20000000298), and exact clamps and clips need float64."""
    return bits.to(tl.int64).to(tl.float64, bitcast=True)


@triton.jit
def _cast_like_torch(x, dtype: tl.constexpr):
    """float64 -> dtype as torch does it: float16/bfloat16 through float32, round to nearest even.

    bfloat16 rounding is done on the bits: the interpreter's float32 -> bfloat16 cast truncates.
    """
    if dtype == tl.float64:
        return x
    x32 = x.to(tl.float32)
    if dtype == tl.bfloat16:
        bits = x32.to(tl.int32, bitcast=True)
        rounded = bits + 0x7FFF + ((bits >> 16) & 1)
        return (rounded >> 16).to(tl.int16).to(tl.bfloat16, bitcast=True)
    return x32.to(dtype)


@triton.jit
def _row_sum(v):
    return tl.sum(v, axis=1)[:, None]


# No runtime specialisation beyond the argument types: ints equal to 1 or divisible by 16 would
# otherwise each get their own compilation, and so would pointers that are or are not 16-byte
# aligned (ragged group starts make vector loads impossible anyway). So the op launches exactly the
# (dtype, BLOCK) specialisations that aot.py compiles.
@triton.jit(do_not_specialize=["num_groups", "k", "code", "k_margin", "uses_k", "small_groups",
                                "has_clamp", "mean_scale", "clamp_delta_bits", "clip_lo_bits",
                                "clip_hi_bits", "eps_bits"],
            do_not_specialize_on_alignment=["values_ptr", "deltas_ptr", "offsets_ptr", "out_ptr"])
def advantages_kernel(values_ptr, deltas_ptr, offsets_ptr, out_ptr, num_groups,
                      k, code, k_margin, uses_k, small_groups, has_clamp,
                      clamp_delta_bits: tl.int64, clip_lo_bits: tl.int64, clip_hi_bits: tl.int64,
                      mean_scale, eps_bits: tl.int64,
                      BLOCK: tl.constexpr, LOG2_BLOCK: tl.constexpr, GROUPS: tl.constexpr,
                      RANK_SORT: tl.constexpr):
    clamp_delta = _float64_from_bits(clamp_delta_bits)
    clip_lo = _float64_from_bits(clip_lo_bits)
    clip_hi = _float64_from_bits(clip_hi_bits)
    eps = _float64_from_bits(eps_bits)
    pid = tl.program_id(0)
    group = pid.to(tl.int64) * GROUPS + tl.arange(0, GROUPS)
    group_ok = group < num_groups
    start = tl.load(offsets_ptr + group, mask=group_ok, other=0)[:, None]
    n = tl.load(offsets_ptr + group + 1, mask=group_ok, other=0)[:, None] - start  # [GROUPS, 1]
    cols = tl.zeros([GROUPS, BLOCK], dtype=tl.int32) + tl.arange(0, BLOCK)[None, :]
    valid = cols < n  # column p < n, used for both unsorted and sorted positions

    # ---- sort: perm[g, p] is the column of the p-th smallest reward (padding is +inf: last)
    raw = tl.load(values_ptr + start + cols, mask=valid, other=float("inf"))
    if RANK_SORT:
        if raw.dtype == tl.float64:
            perm = _sort_perm_by_rank(raw, cols)
        else:
            perm = _sort_perm_by_rank(raw.to(tl.float32), cols)
    else:
        perm = _sort_perm_by_packed_sort(values_ptr, start, n, raw, cols)
    src = start + perm
    x = tl.load(values_ptr + src, mask=valid, other=0.0).to(tl.float64)  # sorted ascending

    # ---- per-group k after the small-group rule (docs/conventions.md)
    kmax = n - k_margin
    too_small = (uses_k != 0) & (k > kmax)
    zero_group = too_small & ((small_groups != 2) | (kmax < 1))  # 'error' mode: as the reference
    kg = tl.where(too_small, kmax, k)
    ksafe = tl.maximum(tl.minimum(kg, n), 1)  # a harmless k for groups whose output is zeroed
    kf = ksafe.to(tl.float64)
    nf = n.to(tl.float64)
    rank = cols + 1  # 1-based sorted rank j
    rf = rank.to(tl.float64)

    d = _max_table(rank, n, ksafe)
    o = tl.where(rank >= 2, d * (kf - 1.0) / tl.maximum(rf - 1.0, 1.0), 0.0)
    s = d * x + _suffix_exclusive(o * x)  # PKPO s_j = Bagirov's on-policy weights (spec 2.2)

    # shifted rewards: every estimator below that is shift-invariant uses y for accuracy
    xmin = tl.min(tl.where(valid, x, float("inf")), axis=1)[:, None]
    y = tl.where(valid, x - xmin, 0.0)
    xtop = tl.max(tl.where(valid, x, float("-inf")), axis=1)[:, None]
    ysum = _row_sum(y)
    nm1 = tl.maximum(nf - 1.0, 1.0)

    result = tl.zeros([GROUPS, BLOCK], dtype=tl.float64)
    if (code == MAXK) | (code == PASSK):
        result = s
    elif (code == MAXK_LOO) | (code == MAXK_LOO_CENTERED):
        # s_j - c * max@k(x without j), rest-set weights w = d(n-1, k) (spec 2.3)
        nrest = n - 1
        w = _max_table(rank, nrest, ksafe)
        w_prev = _max_table(rank - 1, nrest, ksafe)  # w_{j-1} at position j
        rest = _prefix_exclusive(w * x) + _suffix_exclusive(w_prev * x)
        if code == MAXK_LOO:
            result = s - kf / nm1 * rest
        else:
            result = s - kf / nf * rest
    elif code == MAXK_LOO1:
        # k >= 2: d_j y_j - sum_{t<j} o_{t+1} y_t (spec 2.4); k = 1: (y_j - mean of others)/n
        d_next = _max_table(rank + 1, n, ksafe)
        o_next = d_next * (kf - 1.0) / rf
        loo1 = d * y - _prefix_exclusive(o_next * y)
        rloo_n = (y - (ysum - y) / nm1) / nf
        result = tl.where(ksafe >= 2, loo1, tl.where(n >= 2, rloo_n, 0.0))
    elif code == MAXK_OFFPOLICY:
        # Bagirov first-order off-policy weights, O(n) scan form (spec 3.2)
        dl_raw = tl.load(deltas_ptr + src, mask=valid, other=0.0)
        # clamp with the bound rounded to the deltas' dtype (as the reference does), compared in
        # float32 or wider: exact, and the interpreter cannot compare bfloat16
        if dl_raw.dtype == tl.float64:
            dl = dl_raw
            bound = clamp_delta
        else:
            dl = dl_raw.to(tl.float32)
            bound = _cast_like_torch(clamp_delta, dl_raw.dtype).to(tl.float32)
        if has_clamp != 0:
            dl = tl.minimum(tl.maximum(dl, -bound), bound)
        dl = dl.to(tl.float64)
        below = _prefix_exclusive(dl)
        q = tl.where(rank >= 3, o * (kf - 2.0) / tl.maximum(rf - 2.0, 1.0), 0.0)
        s1 = _suffix_exclusive(o * x)
        s2 = _suffix_exclusive(o * dl * x)
        s3 = _suffix_exclusive(q * below * x)
        s4 = _suffix_exclusive(q * x)
        result = (1.0 + dl) * (d * x + s1) + o * below * x + s2 + s3 - dl * s4
    elif code == TANG_LOO:
        second = _row_sum(tl.where(cols == n - 2, x, 0.0))
        result = tl.where((cols == n - 1) & (n >= 2), xtop - second, 0.0)
    elif code == BON_MAX_MEAN:
        result = tl.where(valid & (x == xtop), y - ysum / tl.maximum(nf, 1.0), 0.0)
    elif code == BON_MAX_SECOND:
        second = tl.max(tl.where(valid & (x < xtop), x, float("-inf")), axis=1)[:, None]
        has_second = second > float("-inf")
        gap = tl.where(has_second, xtop - second, 0.0)
        result = tl.where(valid & (x == xtop), gap, 0.0)
    elif code == BON_MEAN:
        s_mean = _row_sum(tl.where(valid, s, 0.0)) / tl.maximum(nf, 1.0)
        dev = tl.where(valid, s - s_mean, 0.0)
        std = tl.sqrt(_row_sum(dev * dev) / nm1)
        s_abs = tl.max(tl.where(valid, tl.abs(s), 0.0), axis=1)[:, None]
        constant = (std <= ZSCORE_CONSTANT_RTOL * s_abs) | (n < 2)
        result = tl.where(constant, 0.0, dev / (std + eps))
    elif (code == CHEN_PASSK) | (code == BON_RLB) | (code == BON_RLB_POS):
        # binary rewards; R = pass@k estimate and 1 - R, both as sums of positive weights
        correct = _row_sum(x)
        wrong = nf - correct
        pass_k = _row_sum(d * x)
        fail_k = _row_sum(tl.where(valid, d * (1.0 - x), 0.0))
        is_correct = x == 1.0
        if code == CHEN_PASSK:
            # ((n/k) s_j - R) / (sigma + eps): correct -> 1 - R; wrong -> -(1 - R) c / (n - c)
            denom = tl.sqrt(pass_k * fail_k) + eps
            neg = -fail_k * correct / tl.maximum(wrong, 1.0)
            chen = tl.where(is_correct, fail_k, neg) / denom
            degenerate = (correct == 0.0) | (wrong < kf)
            result = tl.where(degenerate, 0.0, chen)
        else:
            # Chow BoN-RLB with plug-in p = (n - c)/n, averaged over k-subsets (conventions.md);
            # the sum-scale values are w_plus R / c (correct) and w_minus (1 - R)/(n - c) (wrong)
            p = wrong / tl.maximum(nf, 1.0)
            log_p = tl.log(tl.where(p > 0.0, p, 1.0))
            p_km1 = tl.where(ksafe == 1, 1.0, tl.where(p > 0.0, tl.exp((kf - 1.0) * log_p), 0.0))
            p_k = tl.where(p > 0.0, tl.exp(kf * log_p), 0.0)
            one_minus_pk = tl.where(correct > 0.0, 1.0 - p_k, 1.0)
            if code == BON_RLB:
                w_plus = kf * p_km1 / one_minus_pk
                w_minus = tl.where(correct > 0.0, kf * p / tl.where(correct > 0.0, 1.0 - p, 1.0),
                                   float("inf"))
                neg = w_minus * fail_k / tl.maximum(wrong, 1.0)
            else:
                w_plus = kf * p_km1 * (1.0 - p) / one_minus_pk
                neg = tl.zeros_like(fail_k)
            pos = w_plus * pass_k / tl.maximum(correct, 1.0)
            result = nf * tl.where(is_correct, pos, neg)
    elif code == GRPO:
        dev = tl.where(valid, y - ysum / tl.maximum(nf, 1.0), 0.0)
        std = tl.sqrt(_row_sum(dev * dev) / nm1)
        result = tl.where(n >= 2, dev / (std + eps), 0.0)
    elif code == RLOO:
        result = tl.where(n >= 2, y - (ysum - y) / nm1, 0.0)
    elif code == DR_GRPO:
        result = y - ysum / tl.maximum(nf, 1.0)

    # ---- natural scale -> requested scale, small-group zeroing, clip, cast, scatter back
    if (mean_scale != 0) & (code < FIRST_MEAN_SCALE_CODE):
        result = result * nf
    elif (mean_scale == 0) & (code >= FIRST_MEAN_SCALE_CODE):
        result = result / tl.maximum(nf, 1.0)
    result = tl.where(zero_group, 0.0, result)
    result = tl.minimum(tl.maximum(result, clip_lo), clip_hi)
    tl.store(out_ptr + src, _cast_like_torch(result, out_ptr.dtype.element_ty), mask=valid)
