"""The fused advantages kernel: every group of a packed batch, sorted, weighted, scanned, in one launch.

One program handles GROUPS groups, each padded to a power-of-two BLOCK (padding sorts last as +inf).
All arithmetic is float64, as in the reference (docs/conventions.md); the output is cast at the end.

Specialisations (compile-time): the pointer dtypes, BLOCK (with GROUPS, the number of warps and the
layout derived from it by the launcher), DELTAS: whether the off-policy branch is compiled in, and
SERIAL: whether the column-at-a-time form below is (the kernels compiled per estimator).
The thread-per-group kernels come in two, with and without it: a thread that holds a whole group
runs out of registers on the union of every estimator's tiles. The estimator, k, the small-group
mode, clamping and clipping are runtime scalars, so neither a new estimator nor a new k nor a new
group size (within a bucket) recompiles. On a GPU the launcher compiles this kernel once more per
estimator it runs, with the estimator's facts as constants (_sources.py), which removes the other
estimators' code; k and the options stay runtime scalars.

Two layouts of the [GROUPS, BLOCK] tile, the same code: for small blocks (LANES) each thread holds
one whole group, so every sort, scan and reduction along a group runs in that thread's registers
(no shuffles, no barriers); for larger blocks a group is spread over many threads. Triton picks a
tensor's layout from how it is loaded, so in LANES mode every load and store of a tile goes through
a flat, sample-major view (`_load`, `_store`): element (g, p) sits at p * GROUPS + g, and thread g
holds all of group g. Such accesses are not coalesced per instruction (a warp touches 32 groups),
but the group's lines are reused from L1 by the next columns' loads.

Where a thread holds its group, maxk, passk, maxk_loo1 and maxk_offpolicy called from a bank go
through it one column at a time (`_serial_outputs`): their weights are rank tables times the sorted
rewards, summed in one direction, so the thread reads the tables a few columns at a time and
finishes each output as soon as it is known, and no whole table is ever alive. The tile code holds
two to four float64 tables of the group at once, which at BLOCK = 32 is more than a thread's 255
registers. The column form repeats the tile code's arithmetic operation for operation (the same
bits); the kernel with every estimator keeps the tile code on a GPU (SERIAL off), where the column
form beside every other estimator's branch would cost it registers.

Safety without input checks (check_inputs=False): offsets are clamped into the values, a group
larger than BLOCK or with a NaN/inf reward (or delta) gets NaN for every sample, and every store is
addressed and gated by the sample's own (source) index, so nothing outside the output is written
and nothing inside it is left unwritten.
"""

import triton
import triton.language as tl

from . import _facts


class _Constant(tl.constexpr):
    """A global constant of the kernel. Triton kernels may only read globals that are constexpr,
    and Triton compares each one with a deep copy of its value at every launch (a few microseconds
    for this kernel's twenty, with constexpr's own !=). Constants never change: the copy is the
    constant itself and the comparison stops at identity."""

    def __deepcopy__(self, memo):
        return self

    def __ne__(self, other):
        return False if other is self else super().__ne__(other)


# Estimator codes from the registry.
MAXK = _Constant(_facts.code("maxk"))
MAXK_LOO = _Constant(_facts.code("maxk_loo"))
MAXK_LOO_CENTERED = _Constant(_facts.code("maxk_loo_centered"))
MAXK_LOO1 = _Constant(_facts.code("maxk_loo1"))
MAXK_OFFPOLICY = _Constant(_facts.code("maxk_offpolicy"))
PASSK = _Constant(_facts.code("passk"))
TANG_LOO = _Constant(_facts.code("tang_loo"))
BON_MAX_MEAN = _Constant(_facts.code("bon_max_mean"))
BON_MAX_SECOND = _Constant(_facts.code("bon_max_second"))
BON_MEAN = _Constant(_facts.code("bon_mean"))
CHEN_PASSK = _Constant(_facts.code("chen_passk"))
BON_RLB = _Constant(_facts.code("bon_rlb"))
BON_RLB_POS = _Constant(_facts.code("bon_rlb_pos"))
GRPO = _Constant(_facts.code("grpo"))
RLOO = _Constant(_facts.code("rloo"))
DR_GRPO = _Constant(_facts.code("dr_grpo"))
MAXRL = _Constant(_facts.code("maxrl"))
ZSCORE_CONSTANT_RTOL = _Constant(_facts.estimators.ZSCORE_CONSTANT_RTOL)
DIVISOR_HIGH = _Constant(2.0 ** 1000)  # _over rescales divisors beyond 2^+-1000
DIVISOR_DOWN = _Constant(2.0 ** -600)


@triton.jit
def _flat(t):
    """A [GROUPS, BLOCK] tile as a flat, sample-major vector (element (g, p) at p * GROUPS + g)."""
    return tl.reshape(tl.trans(t), [t.numel])


@triton.jit
def _unflat(f, like):
    """The inverse of _flat, shaped like the tile `like`."""
    return tl.trans(tl.reshape(f, [like.shape[1], like.shape[0]]))


@triton.jit
def _load(ptrs, mask, other, LANES: tl.constexpr):
    """tl.load of a tile; in LANES mode through the flat view, so the result keeps a thread per
    group (a 2-D load would take the layout of its coalescing: a group across threads)."""
    if LANES:
        tile = _unflat(tl.load(_flat(ptrs), mask=_flat(mask), other=other), ptrs)
    else:
        tile = tl.load(ptrs, mask=mask, other=other)
    return tile


@triton.jit
def _store(ptrs, values, mask, LANES: tl.constexpr):
    """tl.store of a tile (through the flat view in LANES mode, as _load)."""
    if LANES:
        tl.store(_flat(ptrs), _flat(values), mask=_flat(mask))
    else:
        tl.store(ptrs, values, mask=mask)


@triton.jit
def _reverse_cumulative(v, PRODUCT: tl.constexpr, LANES: tl.constexpr):
    """Inclusive cumulative sum (or product) along the group axis from its end. In LANES mode as
    flip, forward scan, flip: all in one thread's registers, where Triton 3.6 lowers a reverse
    scan to warp shuffles even though no other thread holds any of the group."""
    if LANES:
        if PRODUCT:
            out = tl.flip(tl.cumprod(tl.flip(v, dim=1), axis=1), dim=1)
        else:
            out = tl.flip(tl.cumsum(tl.flip(v, dim=1), axis=1), dim=1)
    else:
        if PRODUCT:
            out = tl.cumprod(v, axis=1, reverse=True)
        else:
            out = tl.cumsum(v, axis=1, reverse=True)
    return out


@triton.jit
def _suffix_exclusive(v, LANES: tl.constexpr):
    """sum_{t > j} v_t along the group axis."""
    return _reverse_cumulative(v, False, LANES) - v


@triton.jit
def _prefix_exclusive(v):
    """sum_{t < j} v_t along the group axis."""
    return tl.cumsum(v, axis=1) - v


@triton.jit
def _max_table(rank, n, k, LANES: tl.constexpr):
    """d_r(n, k) = C(r-1, k-1) / C(n, k) in float64, 0 outside 1 <= r <= n.

    `rank` must grow by one along axis 1. Spec 0.1's downward recurrence d_r = d_{r+1} (r+1-k)/r
    from d_n = k/n, written as a reverse cumulative product: every factor is in [0, 1], so nothing
    overflows (there is no lgamma in the interpreter, and float64 lgamma would cost more).
    As in reference.weight_tables and group_math.h weights_by_scan:
    d_r = (k/n) suffix_product_r, suffix_product_r = prod_{t>r} f_t, f_t = (t-k)/(t-1); here the
    factor at rank r is f_{r+1}, so the product is the inclusive reverse cumulative product.
    """
    rf = rank.to(tl.float64)
    kf = k.to(tl.float64)
    links = (rank >= 1) & (rank < n)
    factor = tl.where(links, tl.maximum(rf + 1.0 - kf, 0.0) / tl.maximum(rf, 1.0), 1.0)
    suffix_product = _reverse_cumulative(factor, True, LANES)
    return tl.where((rank >= 1) & (rank <= n), kf / tl.maximum(n, 1).to(tl.float64) * suffix_product, 0.0)


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
def _compare_dtype_value(raw):
    """raw in the type the sort compares: float64 stays, narrower dtypes go to float32 (exact)."""
    if raw.dtype == tl.float64:
        v = raw
    else:
        v = raw.to(tl.float32)
    return v


@triton.jit
def _is_finite(v):
    """v - v is 0 for finite v and NaN for NaN and +-inf (no isfinite in the interpreter)."""
    return (v - v) == 0.0


@triton.jit
def _sort_key(raw, real):
    """The key each column sorts by: the reward; padding (real False) +inf, after every real key.

    NaN and +-inf rewards sort as 0 (their group's output is NaN anyway): keys then form a total
    order in which the real columns take exactly the first n positions.
    """
    v = _compare_dtype_value(raw)
    return tl.where(real, tl.where(_is_finite(v), v, 0.0), float("inf"))


@triton.jit
def _float_from_order_key32(bits):
    """The float32 of an _order_key32 (the map is its own inverse)."""
    return tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF).to(tl.float32, bitcast=True)


@triton.jit
def _partner(t, dim: tl.constexpr):
    """t at the other end of each pair along axis `dim` (of size 2): t xor (the xor of the pair),
    which the compiler folds to the partner's own register when a thread holds both."""
    if t.dtype.primitive_bitwidth == 64:
        bits = t.to(tl.int64, bitcast=True)
    else:
        bits = t.to(tl.int32, bitcast=True)
    return (bits ^ tl.xor_sum(bits, dim, keep_dims=True)).to(t.dtype, bitcast=True)


@triton.jit
def _flip_bit(t, bit: tl.constexpr):
    """t with each column c taken from column c ^ 2^bit (_partner on a reshape, which the
    compiler folds to register moves where a thread holds the row)."""
    GROUPS: tl.constexpr = t.shape[0]
    BLOCK: tl.constexpr = t.shape[1]
    INNER: tl.constexpr = 1 << bit
    return tl.reshape(_partner(tl.reshape(t, [GROUPS, BLOCK // (2 * INNER), 2, INNER]), 2),
                      [GROUPS, BLOCK])


@triton.jit
def _merge_step(keys, items, merge_log2: tl.constexpr, distance_log2: tl.constexpr):
    """One step of Batcher's odd-even merge of the sorted runs of 2^merge_log2 columns, ascending
    by key, `items` moved alike. The first step (distance_log2 == merge_log2) orders every column
    c without the distance bit and c + 2^distance_log2. Each later one orders, within each block
    of 2^(merge_log2 + 1) columns, column c with the distance bit set and c + 2^distance_log2:
    such a pair differs not in one bit but in a run of them (c + distance carries), so each
    column takes its partner from the flip of that run (_flip_bit, a bit after another), chosen
    per column by constants, which the compiler folds where a thread holds the row. Both ends of
    a pair compute the same compare (left key > right key), which the compiler merges into one;
    tl.sort has each end compare itself with its partner, two different compares."""
    BLOCK: tl.constexpr = keys.shape[1]
    DISTANCE: tl.constexpr = 1 << distance_log2
    SPAN: tl.constexpr = 2 << merge_log2
    local = tl.arange(0, BLOCK)[None, :] & (SPAN - 1)  # the column within its block
    units = local >> distance_log2
    key_partner = _flip_bit(keys, distance_log2)
    item_partner = _flip_bit(items, distance_log2)
    if distance_log2 == merge_log2:  # pairs one bit apart: every column has one
        at_right = (units & 1) == 1
        swap = tl.where(at_right, key_partner, keys) > tl.where(at_right, keys, key_partner)
    else:
        at_left = ((units & 1) == 1) & (local + DISTANCE < SPAN)
        at_right = ((units & 1) == 0) & (local >= DISTANCE)
        # a left end whose units end in t ones (a right end: t zeros, then a one) flips bits
        # distance_log2 .. distance_log2 + t of its column; every end has t >= 1
        keys_flipped = _flip_bit(key_partner, distance_log2 + 1)
        items_flipped = _flip_bit(item_partner, distance_log2 + 1)
        key_partner = keys_flipped
        item_partner = items_flipped
        for t in tl.static_range(2, merge_log2 - distance_log2 + 1):
            keys_flipped = _flip_bit(keys_flipped, distance_log2 + t)
            items_flipped = _flip_bit(items_flipped, distance_log2 + t)
            low_bits = units & ((2 << t) - 1)
            takes_t = (at_left & (low_bits == (1 << t) - 1)) | (at_right & (low_bits == 1 << t))
            key_partner = tl.where(takes_t, keys_flipped, key_partner)
            item_partner = tl.where(takes_t, items_flipped, item_partner)
        swap = tl.where(at_right, key_partner, keys) > tl.where(at_right, keys, key_partner)
        swap = swap & (at_left | at_right)
    return tl.where(swap, key_partner, keys), tl.where(swap, item_partner, items)


@triton.jit
def _lane_sort(keys, items, LOG2_BLOCK: tl.constexpr):
    """(keys sorted ascending along axis 1, items in the same order), by Batcher's odd-even merge
    network in each thread's registers: one compare and a select per word for each pair; 19, 63,
    191 and 543 pairs at 8, 16, 32 and 64 columns, where a bitonic network has 24, 80, 240 and
    672. Tied keys may come out in any order (every estimator is tie-invariant in value)."""
    for merge in tl.static_range(LOG2_BLOCK):  # merge the sorted runs of 2^merge columns
        for step in tl.static_range(merge + 1):
            keys, items = _merge_step(keys, items, merge, merge - step)
    return keys, items


@triton.jit
def _sorted_rewards(values_ptr, start, n, key, cols, valid, LOG2_BLOCK: tl.constexpr,
                    LANES: tl.constexpr):
    """(perm, sorted rewards in the compare dtype, 0 at padding) of each row. Non-finite rewards
    come back as 0 (their group's output is NaN anyway), except from the float64 spread sort.

    Where a thread holds the whole group (LANES) the keys themselves are sorted, their columns
    moved alongside. Where a group is spread over threads, tl.sort sorts packed (32-bit key,
    32-bit column) int64s, whose high words are the sorted values; a float64 key takes two such
    sorts and gathers the values."""
    if LANES:
        x, perm = _lane_sort(key, cols, LOG2_BLOCK)
        x = tl.where(valid, x, 0.0)
    elif key.dtype == tl.float64:
        # A float64 key leaves no room for the column: sort twice (least significant digit first),
        # by the low 32 key bits, then by the high 32 bits with ties kept in first-pass order
        # (the first-pass position rides in bits 16-31, the column in bits 0-15: BLOCK <= 65536).
        bits = _order_key64(key)
        low = (bits & 0xFFFFFFFF) - 0x80000000  # unsigned order -> signed order
        first = tl.sort((low << 32) | cols.to(tl.int64), dim=1)
        first_cols = first & 0xFFFF  # column at each first-pass position
        real = first_cols < n
        again = _sort_key(tl.load(values_ptr + start + first_cols, mask=real, other=0.0), real)
        high = _order_key64(again) >> 32
        second = tl.sort((high << 32) | (cols.to(tl.int64) << 16) | first_cols, dim=1)
        perm = (second & 0xFFFF).to(tl.int32)
        x = tl.load(values_ptr + start + perm, mask=valid, other=0.0)
    else:
        packed = tl.sort((_order_key32(key).to(tl.int64) << 32) | cols.to(tl.int64), dim=1)
        perm = (packed & 0xFFFFFFFF).to(tl.int32)
        x = tl.where(valid, _float_from_order_key32((packed >> 32).to(tl.int32)), 0.0)
    return perm, x


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
        # a NaN keeps a quiet-NaN pattern (rounding the GPU's 0x7FFFFFFF NaN would wrap to -0)
        top = tl.where(x32 == x32, rounded >> 16, 0x7FC0)
        return top.to(tl.int16).to(tl.bfloat16, bitcast=True)
    return x32.to(dtype)


@triton.jit
def _row_sum(v):
    return tl.sum(v, axis=1)[:, None]


@triton.jit
def _clip_keeping_nan(x, lo, hi):
    """min(max(x, lo), hi), but NaN stays NaN (compiled tl.maximum/tl.minimum return the other
    operand for a NaN, the interpreter and the reference propagate it)."""
    return tl.where(x < lo, lo, tl.where(x > hi, hi, x))


@triton.jit
def _clip_cast(x, lo, hi, dtype: tl.constexpr):
    """_clip_keeping_nan(x, lo, hi) cast to dtype, compared in float64 but selected among the cast
    values: cast(where(c, a, b)) = where(c, cast(a), cast(b)), and a select of a float32 is one
    instruction, of a float64 two."""
    out = _cast_like_torch(x, dtype)
    out = tl.where(x > hi, _cast_like_torch(hi, dtype), out)
    return tl.where(x < lo, _cast_like_torch(lo, dtype), out)


@triton.jit
def _first_column(v, cols):
    """v at column 0 of each row, [GROUPS, 1]."""
    return _row_sum(tl.where(cols == 0, v, 0.0))


@triton.jit
def _power_of_two_scale(amax):
    """The power of two at or below amax (1 for 0 and subnormals): dividing by it is exact, and
    brings the group into [-2, 2] so that differences and squares cannot overflow."""
    bits = amax.to(tl.int64, bitcast=True) & 0x7FF0000000000000
    p2 = bits.to(tl.float64, bitcast=True)
    return tl.where(p2 > 0.0, p2, 1.0)


@triton.jit
def _bank_block(bank_index_ptr, n, bank_index_len):
    """Start of the bank block for groups of size n ([GROUPS, 1]), -1 when there is none."""
    return tl.load(bank_index_ptr + n, mask=(n >= 1) & (n < bank_index_len), other=-1)


@triton.jit
def _bank_row(bank_ptr, block_at, row: tl.constexpr, n, cols, valid, LANES: tl.constexpr):
    """Row `row` (0 = D, 1 = O, 2 = Q, 3 = B, 4 = Bp) of the bank block, by sorted rank; 0 when
    the block is missing."""
    at = tl.maximum(block_at, 0) + row * n
    return _load(bank_ptr + at + cols, valid & (block_at >= 0), 0.0, LANES)


@triton.jit
def _d_table(bank_ptr, block_at, has_bank, rank, n, ksafe, cols, valid, LANES: tl.constexpr):
    """d_r, the probability that rank r is the largest of a k-subset: the bank's row 0, or the
    single-k table."""
    if has_bank != 0:
        d = _bank_row(bank_ptr, block_at, 0, n, cols, valid, LANES)
    else:
        d = _max_table(rank, n, ksafe, LANES)
    return d


@triton.jit
def _o_table(bank_ptr, block_at, has_bank, d, rank, n, kf, rf, cols, valid, LANES: tl.constexpr):
    """o_r = d_r (k-1)/(r-1) for r >= 2 (0 at r = 1): the bank's row 1, or from the single-k d."""
    if has_bank != 0:
        o = _bank_row(bank_ptr, block_at, 1, n, cols, valid, LANES)
    else:
        o = tl.where(rank >= 2, d * (kf - 1.0) / tl.maximum(rf - 1.0, 1.0), 0.0)
    return o


@triton.jit
def _pkpo_s(d, o, x, LANES: tl.constexpr):
    """PKPO s_j = Bagirov's on-policy weights (spec 2.2): d_j x_j + sum_{t > j} o_t x_t."""
    return d * x + _suffix_exclusive(o * x, LANES)


@triton.jit
def _over(a, b):
    """a / b for a divisor b shared by the group ([GROUPS, 1]): one division per group, then per
    sample a multiply and one correction (within an ulp of a / b; the CUDA kernels' GroupDivisor
    does the same). A b beyond 2^+-1000 is first scaled by an exact power of two (its reciprocal
    would lose bits as a subnormal), applied to a too: a * scale underflows or overflows only where
    a / b does. b = 0, +-inf or NaN give a * (1 / b), as a / b does."""
    m = tl.abs(b)
    scale = tl.where(m > DIVISOR_HIGH, DIVISOR_DOWN,
                     tl.where((m < 1.0 / DIVISOR_HIGH) & (m > 0.0), 1.0 / DIVISOR_DOWN, 1.0))
    a = a * scale
    b = b * scale
    r = 1.0 / b
    q0 = a * r
    q1 = tl.fma(tl.fma(-b, q0, a), r, q0)
    return tl.where(tl.abs(q1) < float("inf"), q1, q0)


@triton.jit
def _clamped_deltas(deltas_ptr, src, valid, bad, clamp_delta, has_clamp, LANES: tl.constexpr):
    """The deltas in sorted order, clamped, in the compare dtype, and `bad` with the groups whose
    deltas are not finite."""
    dl_raw = _load(deltas_ptr + src, valid, 0.0, LANES)
    # clamp with the bound rounded to the deltas' dtype (as the reference does), compared in
    # float32 or wider: exact, and the interpreter cannot compare bfloat16
    dl = _compare_dtype_value(dl_raw)
    bad = bad | (tl.max(tl.where(valid & ~_is_finite(dl), 1, 0), axis=1)[:, None] > 0)
    if dl_raw.dtype == tl.float64:
        bound = clamp_delta
    else:
        bound = _cast_like_torch(clamp_delta, dl_raw.dtype).to(tl.float32)
    if has_clamp != 0:
        dl = tl.minimum(tl.maximum(dl, -bound), bound)
    return dl, bad


@triton.jit
def _off_policy_weights(deltas_ptr, src, valid, bad, clamp_delta, has_clamp, has_bank, bank_ptr,
                        block_at, n, cols, rank, rf, kf, d, o, x, ksafe, LANES: tl.constexpr,
                        LATE_TABLES: tl.constexpr):
    """Bagirov's first-order off-policy weights, O(n) scan form (spec 3.2), and `bad` with the
    groups whose deltas are not finite."""
    dl, bad = _clamped_deltas(deltas_ptr, src, valid, bad, clamp_delta, has_clamp, LANES)
    dl = dl.to(tl.float64)
    below = _prefix_exclusive(dl)
    if LATE_TABLES:  # (see OFF_POLICY_LATE_TABLES)
        d = _d_table(bank_ptr, block_at, has_bank, rank, n, ksafe, cols, valid, LANES)
        o = _o_table(bank_ptr, block_at, has_bank, d, rank, n, kf, rf, cols, valid, LANES)
    if has_bank != 0:
        q = _bank_row(bank_ptr, block_at, 2, n, cols, valid, LANES)
    else:
        q = tl.where(rank >= 3, o * (kf - 2.0) / tl.maximum(rf - 2.0, 1.0), 0.0)
    # spec 3.2's (1 + dl_j) (d_j x_j + S[o x]_j) + o_j below_j x_j + S[o dl x]_j + S[q below x]_j
    # - dl_j S[q x]_j, S[v]_j = sum_{t > j} v_t, in two scans instead of four:
    # (1 + dl_j) S[o x] - dl_j S[q x] = S[o x] + dl_j S[(o - q) x], and S is linear
    if LANES:
        spread = _suffix_exclusive((o * (1.0 + dl) + q * below) * x, LANES)
        own = _suffix_exclusive((o - q) * x, LANES)
        direct = ((1.0 + dl) * d + o * below) * x
    else:
        # the same terms, all formed before the scans: across the scans' barriers only the terms,
        # dl and x are alive, not d, o, q and below (from a bank at BLOCK = 4096, 64 registers a
        # thread: 48/52 bytes of spill, against 208/364). Where a thread holds the group, this
        # order takes more registers.
        spread_terms = (o * (1.0 + dl) + q * below) * x
        own_terms = (o - q) * x
        direct = ((1.0 + dl) * d + o * below) * x
        spread = _suffix_exclusive(spread_terms, LANES)
        own = _suffix_exclusive(own_terms, LANES)
    return direct + spread + dl * own, bad


@triton.jit
def _column(t, cols, j: tl.constexpr):
    """Column j of a tile, [GROUPS, 1]. Where a thread holds the whole group (LANES) every column
    is a register known at compile time, so this folds to that register (an xor with zeros)."""
    if t.dtype.primitive_bitwidth == 64:
        bits = t.to(tl.int64, bitcast=True)
    else:
        bits = t.to(tl.int32, bitcast=True)
    return tl.xor_sum(tl.where(cols == j, bits, 0), axis=1, keep_dims=True).to(t.dtype, bitcast=True)


@triton.jit
def _bank_chunk(bank_ptr, block_at, row: tl.constexpr, n, at):
    """Columns `at` ([GROUPS, CHUNK]) of row `row` of the bank block, a thread per group; 0
    outside the group and when the block is missing."""
    return _bank_row(bank_ptr, block_at, row, n, at, at < n, True)


@triton.jit
def _sorted_reward(x_compared, values_ptr, start, perm, cols, j: tl.constexpr, n,
                   READ_AGAIN: tl.constexpr):
    """Sorted column j of a group's rewards, [GROUPS, 1], in the compare dtype: from the sorted
    tile, or, with READ_AGAIN, from memory through the sort's columns (the tile's value for every
    finite reward: a group with another is NaN anyway; 0 past the group), so that the tile need
    not stay alive."""
    if READ_AGAIN:
        raw = tl.load(values_ptr + start + _column(perm, cols, j), mask=n > j, other=0.0)
        x = _compare_dtype_value(raw)
    else:
        x = _column(x_compared, cols, j)
    return x


@triton.jit
def _serial_from_bank(code, has_bank):
    """Whether a call where a thread holds its group (LANES) runs `_serial_outputs`: the
    registry's `one_pass` estimators, from a bank (test_triton.py checks that it names them)."""
    return (has_bank != 0) & ((code == MAXK) | (code == PASSK) | (code == MAXK_LOO1)
                              | (code == MAXK_OFFPOLICY))


@triton.jit
def _finish(result, nf, mean_scale, natural_mean, zero_group, bad, clip_lo, clip_hi,
            out_dtype: tl.constexpr):
    """A result in the estimator's natural scale -> the output: the requested scale, small-group
    zeroing, clip and NaN in the reference's order, as selects among values cast to the output
    dtype (_clip_cast): a zeroed group takes the clipped, cast 0."""
    if natural_mean == 0:
        # times n where the mean scale is asked, else times 1 (the same bits): a multiply per
        # sample, where a select between the two takes two (a float64 is two registers)
        result = result * tl.where(mean_scale != 0, nf, 1.0)
    elif mean_scale == 0:
        result = _over(result, tl.maximum(nf, 1.0))
    zero = tl.zeros_like(clip_lo)
    out = _clip_cast(result, clip_lo, clip_hi, out_dtype)
    out = tl.where(zero_group, _clip_cast(zero, clip_lo, clip_hi, out_dtype), out)
    return tl.where(bad, _cast_like_torch(zero + float("nan"), out_dtype), out)


@triton.jit
def _store_chunk(out_ptr, start, perm, cols, in_chunk, first, outs, n):
    """Store the outputs of sorted columns first.. first + CHUNK - 1 ([GROUPS, CHUNK]) at their
    samples, gated by the source column."""
    src = tl.zeros_like(in_chunk)
    for i in tl.static_range(in_chunk.shape[1]):
        src = tl.where(in_chunk == i, _column(perm, cols, first + i), src)
    _store(out_ptr + start + src, outs, src < n, True)


@triton.jit
def _serial_outputs(values_ptr, code, x_compared, dl, bank_ptr, block_at, n, nf, cols, valid,
                    mean_scale, natural_mean, out_ptr, start, perm, zero_group, bad, clip_lo, clip_hi,
                    out_dtype: tl.constexpr, BLOCK: tl.constexpr, DELTAS: tl.constexpr):
    """Compute and store the outputs of a call of _serial_from_bank where a thread holds its
    group, one sorted column at a time.

    The tile code (the kernel's branches) holds two to four float64 tables of the whole group at
    once, beside the sorted rewards and their columns: at BLOCK = 32 more than a thread's 255
    registers. These estimators sum rank tables times the sorted rewards in one direction (maxk
    and passk from the top, maxk_loo1 from the bottom, maxk_offpolicy from the top, with the
    deltas' prefix sum), so a thread can go through its group one column at a time, reading the
    tables CHUNK columns at a time: alive are the rewards (above a block, not even those: they
    are read again, _sorted_reward), the deltas and the columns, and one chunk of the tables and
    of the outputs. The sums are the tile code's, in the same order (its
    in-thread scans run in column order: first the column's own term, then one add per column),
    and each output is finished (_finish) as soon as it is known, then stored a chunk at a time."""
    GROUPS: tl.constexpr = x_compared.shape[0]
    # (the off-policy weights read three tables and keep the deltas: 4 columns a chunk fit
    # BLOCK = 32 without a spill, where 8 spill)
    WIDTH: tl.constexpr = 4 if DELTAS else 8
    CHUNK: tl.constexpr = WIDTH if BLOCK > WIDTH else BLOCK
    NCHUNKS: tl.constexpr = BLOCK // CHUNK
    in_chunk = tl.zeros([GROUPS, CHUNK], dtype=tl.int32) + tl.arange(0, CHUNK)[None, :]
    # above 32 columns maxk_loo1 reads each sorted reward again through perm (from L1: the sort
    # loaded the same lines) instead of taking it from the sorted tile: its mean's pass and its
    # column loop convert the same rewards to float64, and the compiler would convert each once
    # and keep all 64 alive across the loop beside perm: a spill (24 bytes; 208 registers without)
    RELOAD: tl.constexpr = BLOCK > 32
    # maxk_offpolicy at 32 likewise: its rewards, its deltas and perm take every register (255,
    # where the smallest change spills), against 184 and 2 % more instructions with the rewards
    # read again
    RELOAD_OFF_POLICY: tl.constexpr = BLOCK > 16
    if (code == MAXK) | (code == PASSK):
        # s_j = d_j x_j + sum_{t > j} o_t x_t (_pkpo_s), from the top
        total = tl.zeros([GROUPS, 1], dtype=tl.float64)
        for c in tl.static_range(NCHUNKS):
            first = BLOCK - CHUNK * (c + 1)
            outs = tl.zeros([GROUPS, CHUNK], dtype=out_dtype)
            d_chunk = _bank_chunk(bank_ptr, block_at, 0, n, in_chunk + first)
            o_chunk = _bank_chunk(bank_ptr, block_at, 1, n, in_chunk + first)
            for i in tl.static_range(CHUNK):
                j = first + CHUNK - 1 - i
                x = _column(x_compared, cols, j).to(tl.float64)
                v = _column(o_chunk, in_chunk, j - first) * x
                if j == BLOCK - 1:
                    total = v
                else:
                    total = total + v
                result = _column(d_chunk, in_chunk, j - first) * x + (total - v)
                out = _finish(result, nf, mean_scale, natural_mean, zero_group, bad, clip_lo,
                              clip_hi, out_dtype)
                outs = tl.where(in_chunk == j - first, out, outs)
            _store_chunk(out_ptr, start, perm, cols, in_chunk, first, outs, n)
    elif code == MAXK_LOO1:
        # D_j y_j - sum_{t < j} B_t y_t + W1/(n-1) (y_j - mean of y) (the tile code's), from the
        # bottom
        xmin = tl.min(tl.where(valid, x_compared, float("inf")), axis=1)[:, None].to(tl.float64)
        ysum = _row_sum(tl.where(valid, x_compared.to(tl.float64) - xmin, 0.0))
        ymean = ysum / tl.maximum(nf, 1.0)
        w1 = tl.load(bank_ptr + tl.maximum(block_at, 0) + 5 * n, mask=block_at >= 0, other=0.0)
        w1_per_gap = tl.where(n >= 2, w1 / tl.maximum(nf - 1.0, 1.0), 0.0)
        total = tl.zeros([GROUPS, 1], dtype=tl.float64)
        for c in tl.static_range(NCHUNKS):
            first = CHUNK * c
            outs = tl.zeros([GROUPS, CHUNK], dtype=out_dtype)
            d_chunk = _bank_chunk(bank_ptr, block_at, 0, n, in_chunk + first)
            b_chunk = _bank_chunk(bank_ptr, block_at, 3, n, in_chunk + first)
            for i in tl.static_range(CHUNK):
                j = first + i
                x_j = _sorted_reward(x_compared, values_ptr, start, perm, cols, j, n, RELOAD)
                y = tl.where(n > j, x_j.to(tl.float64) - xmin, 0.0)
                v = _column(b_chunk, in_chunk, i) * y
                if j == 0:
                    total = v
                else:
                    total = total + v
                result = _column(d_chunk, in_chunk, i) * y + -(total - v) + w1_per_gap * (y - ymean)
                out = _finish(result, nf, mean_scale, natural_mean, zero_group, bad, clip_lo,
                              clip_hi, out_dtype)
                outs = tl.where(in_chunk == j - first, out, outs)
            _store_chunk(out_ptr, start, perm, cols, in_chunk, first, outs, n)
    elif DELTAS:  # maxk_offpolicy (only compiled into the kernels that off-policy launches use)
        # _off_policy_weights from the top; below_j = sum_{t < j} dl_t is a prefix sum, so a
        # first pass from the bottom keeps its value at the end of each chunk
        prefix = tl.zeros([GROUPS, 1], dtype=tl.float64)
        chunk_ends = tl.zeros([GROUPS, NCHUNKS], dtype=tl.float64)
        chunk_index = tl.zeros([GROUPS, NCHUNKS], dtype=tl.int32) + tl.arange(0, NCHUNKS)[None, :]
        for j in tl.static_range(BLOCK):
            dl_j = _column(dl, cols, j).to(tl.float64)
            if j == 0:
                prefix = dl_j
            else:
                prefix = prefix + dl_j
            if (j + 1) % CHUNK == 0:
                chunk_ends = tl.where(chunk_index == j // CHUNK, prefix, chunk_ends)
        spread = tl.zeros([GROUPS, 1], dtype=tl.float64)
        own = tl.zeros([GROUPS, 1], dtype=tl.float64)
        for c in tl.static_range(NCHUNKS):
            chunk = NCHUNKS - 1 - c
            first = CHUNK * chunk
            outs = tl.zeros([GROUPS, CHUNK], dtype=out_dtype)
            d_chunk = _bank_chunk(bank_ptr, block_at, 0, n, in_chunk + first)
            o_chunk = _bank_chunk(bank_ptr, block_at, 1, n, in_chunk + first)
            q_chunk = _bank_chunk(bank_ptr, block_at, 2, n, in_chunk + first)
            # the chunk's below, from the bottom, on the sum at the end of the chunk before
            below_chunk = tl.zeros([GROUPS, CHUNK], dtype=tl.float64)
            if chunk > 0:
                prefix = _column(chunk_ends, chunk_index, chunk - 1)
            for i in tl.static_range(CHUNK):
                dl_j = _column(dl, cols, first + i).to(tl.float64)
                if first + i == 0:
                    prefix = dl_j
                else:
                    prefix = prefix + dl_j
                below_chunk = tl.where(in_chunk == i, prefix - dl_j, below_chunk)
            for i in tl.static_range(CHUNK):
                jj = CHUNK - 1 - i
                j = first + jj
                x = _sorted_reward(x_compared, values_ptr, start, perm, cols, j, n,
                                   RELOAD_OFF_POLICY).to(tl.float64)
                dl_j = _column(dl, cols, j).to(tl.float64)
                d = _column(d_chunk, in_chunk, jj)
                o = _column(o_chunk, in_chunk, jj)
                q = _column(q_chunk, in_chunk, jj)
                below = _column(below_chunk, in_chunk, jj)
                v_spread = (o * (1.0 + dl_j) + q * below) * x
                v_own = (o - q) * x
                if j == BLOCK - 1:
                    spread = v_spread
                    own = v_own
                else:
                    spread = spread + v_spread
                    own = own + v_own
                result = (((1.0 + dl_j) * d + o * below) * x + (spread - v_spread)
                          + dl_j * (own - v_own))
                out = _finish(result, nf, mean_scale, natural_mean, zero_group, bad, clip_lo,
                              clip_hi, out_dtype)
                outs = tl.where(in_chunk == j - first, out, outs)
            _store_chunk(out_ptr, start, perm, cols, in_chunk, first, outs, n)


# No runtime specialisation beyond the argument types: ints equal to 1 or divisible by 16 would
# otherwise each get their own compilation, and so would pointers that are or are not 16-byte
# aligned (ragged group starts make vector loads impossible anyway). So the op launches exactly the
# (dtype, BLOCK, DELTAS) specialisations that aot.py compiles (with SERIAL off; on, with the
# estimator's arguments constant: _sources.py).
@triton.jit(do_not_specialize=["num_groups", "num_values", "offsets_stride", "bank_index_len", "k",
                                "code", "k_margin", "uses_k", "natural_mean", "has_bank", "sorts",
                                "small_groups", "has_clamp", "mean_scale", "clamp_delta_bits",
                                "clip_lo_bits", "clip_hi_bits", "eps_bits"],
            do_not_specialize_on_alignment=["values_ptr", "deltas_ptr", "offsets_ptr", "out_ptr",
                                            "bank_ptr", "bank_index_ptr"])
def advantages_kernel(values_ptr, deltas_ptr, offsets_ptr, out_ptr, bank_ptr, bank_index_ptr,
                      num_groups, num_values: tl.int64, offsets_stride: tl.int64,
                      bank_index_len: tl.int64, k, code, k_margin, uses_k, natural_mean, has_bank,
                      sorts, small_groups, has_clamp,
                      clamp_delta_bits: tl.int64, clip_lo_bits: tl.int64, clip_hi_bits: tl.int64,
                      mean_scale, eps_bits: tl.int64,
                      BLOCK: tl.constexpr, LOG2_BLOCK: tl.constexpr, GROUPS: tl.constexpr,
                      LANES: tl.constexpr, DELTAS: tl.constexpr, SERIAL: tl.constexpr):
    clamp_delta = _float64_from_bits(clamp_delta_bits)
    clip_lo = _float64_from_bits(clip_lo_bits)
    clip_hi = _float64_from_bits(clip_hi_bits)
    eps = _float64_from_bits(eps_bits)
    pid = tl.program_id(0)
    group = pid.to(tl.int64) * GROUPS + tl.arange(0, GROUPS)
    group_ok = group < num_groups
    # ---- the group's samples [start, start + n_all), clamped into the values (unchecked offsets
    # may be out of range or decreasing: such a group reads and writes only inside the tensors)
    first = tl.load(offsets_ptr + group * offsets_stride, mask=group_ok, other=0)
    last = tl.load(offsets_ptr + (group + 1) * offsets_stride, mask=group_ok, other=0)
    start_g = tl.minimum(tl.maximum(first, 0), num_values)
    n_all_g = tl.minimum(tl.maximum(last, start_g), num_values) - start_g
    start = start_g[:, None]
    n_all = n_all_g[:, None]
    oversize_g = n_all_g > BLOCK  # max_group_size was too small: NaN for the whole group
    oversize = oversize_g[:, None]
    n = tl.minimum(n_all, BLOCK).to(tl.int32)  # [GROUPS, 1]
    cols = tl.zeros([GROUPS, BLOCK], dtype=tl.int32) + tl.arange(0, BLOCK)[None, :]
    valid = cols < n  # column p < n, used for both unsorted and sorted positions

    # ---- sort: perm[g, p] is the column of the p-th smallest reward (padding is +inf: last)
    raw = _load(values_ptr + start + cols, valid, 0.0, LANES)
    finite = _is_finite(_compare_dtype_value(raw))
    bad = (tl.max(tl.where(finite, 0, 1), axis=1)[:, None] > 0) | oversize  # (padding loads 0)
    key = _sort_key(raw, valid)
    # the sorted keys put the group's samples exactly at the positions p < n; the order-free
    # estimators (sorts == 0) take the rewards as they come
    if sorts == 0:
        perm = cols
        x_compared = tl.where(valid, _compare_dtype_value(raw), 0.0)
    else:
        perm, x_compared = _sorted_rewards(values_ptr, start, n, key, cols, valid, LOG2_BLOCK, LANES)
    x = x_compared.to(tl.float64)
    # the group's extremes in the compare dtype (exact, and cheaper than float64 minima)
    xmin = tl.min(tl.where(valid, x_compared, float("inf")), axis=1)[:, None].to(tl.float64)
    src = start + perm  # x: the rewards, sorted ascending unless order-free; 0 at padding

    # ---- per-group k after the small-group rule (docs/conventions.md); a bank ignores k
    kmax = n - k_margin
    too_small = (uses_k != 0) & (has_bank == 0) & (k > kmax)
    zero_group = too_small & ((small_groups != 2) | (kmax < 1))  # 'error' mode: as the reference
    kg = tl.where(too_small, kmax, k)
    ksafe = tl.maximum(tl.minimum(kg, n), 1)  # a harmless k for groups whose output is zeroed
    kf = ksafe.to(tl.float64)
    nf = n.to(tl.float64)
    rank = cols + 1  # 1-based sorted rank j
    rf = rank.to(tl.float64)

    # the weight tables: single-k (spec 0.1), or read from a bank (one k's, or a mixture's: spec
    # 12); only for the estimators that weight by rank (the others leave them 0 and dead, which
    # keeps registers free where a thread holds a whole group). The leave-one-out estimators
    # build their tables one at a time in their own branches, so that fewer tiles are alive at once.
    # So does maxk_offpolicy where a group is spread over threads, in its own kernel (SERIAL: also
    # under the interpreter): after its deltas' prefix sum, which leaves fewer tiles alive across
    # that scan (BLOCK = 2048, 16 warps: 20/20 bytes of spill without a bank, against 36/52, and 8 %
    # fewer instructions from a bank). The same arithmetic, so the same bits, either way.
    OFF_POLICY_LATE_TABLES: tl.constexpr = SERIAL and not LANES
    block_at = tl.full([GROUPS, 1], -1, tl.int64)
    if has_bank != 0:
        block_at = _bank_block(bank_index_ptr, n, bank_index_len)
        bad = bad | ((block_at < 0) & (n >= 1))  # a group size without a bank block
    out_dtype: tl.constexpr = out_ptr.dtype.element_ty
    # where a thread holds its group, the estimators that sum rank tables in one direction go
    # through it a column at a time (_serial_outputs), with the same arithmetic: in the kernels
    # compiled per estimator (SERIAL), not in the kernel with every estimator, where that branch
    # beside all the others would cost registers. (Elsewhere `serial` must stay a constexpr: an
    # assigned False would become a runtime flag, and the branch would be generated, a column at
    # a time, for every block.)
    if LANES & SERIAL:
        serial = _serial_from_bank(code, has_bank)  # folded where the estimator is a constant
    else:
        serial: tl.constexpr = False
    if serial:
        dl = x_compared
        if DELTAS:
            if code == MAXK_OFFPOLICY:
                dl, bad = _clamped_deltas(deltas_ptr, src, valid, bad, clamp_delta, has_clamp, LANES)
        _serial_outputs(values_ptr, code, x_compared, dl, bank_ptr, block_at, n, nf, cols, valid,
                        mean_scale, natural_mean, out_ptr, start, perm, zero_group, bad, clip_lo,
                        clip_hi, out_dtype, BLOCK, DELTAS)
    else:
        d = tl.zeros([GROUPS, BLOCK], dtype=tl.float64)
        o = tl.zeros([GROUPS, BLOCK], dtype=tl.float64)
        if ((sorts != 0) & (code != TANG_LOO) & (code != BON_MAX_MEAN) & (code != BON_MAX_SECOND)
                & (code != MAXK_LOO) & (code != MAXK_LOO_CENTERED) & (code != MAXK_LOO1)
                & ((code != MAXK_OFFPOLICY) | (not OFF_POLICY_LATE_TABLES))):
            d = _d_table(bank_ptr, block_at, has_bank, rank, n, ksafe, cols, valid, LANES)
            o = _o_table(bank_ptr, block_at, has_bank, d, rank, n, kf, rf, cols, valid, LANES)

        # shifted rewards: every estimator below that is shift-invariant uses y for accuracy (xmin
        # is taken right after the sort, xtop here: the placements that spill least)
        xtop = tl.max(tl.where(valid, x_compared, float("-inf")), axis=1)[:, None].to(tl.float64)
        y = tl.where(valid, x - xmin, 0.0)
        ysum = _row_sum(y)
        nm1 = tl.maximum(nf - 1.0, 1.0)
        ymean = ysum / tl.maximum(nf, 1.0)

        result = tl.zeros([GROUPS, BLOCK], dtype=tl.float64)
        if (code == MAXK) | (code == PASSK):
            result = _pkpo_s(d, o, x, LANES)
        elif (code == MAXK_LOO) | (code == MAXK_LOO_CENTERED):
            # s_j - c max@k(x without j) = s_j - sum_{t<j} B_t x_t - sum_{t>j} Bp_t x_t with
            # B = c d(n-1, k) and Bp its shift by one rank, c = k/(n-1) or k/n (spec 2.3)
            # (one table at a time: each is dead once its scan is done)
            d = _d_table(bank_ptr, block_at, has_bank, rank, n, ksafe, cols, valid, LANES)
            o = _o_table(bank_ptr, block_at, has_bank, d, rank, n, kf, rf, cols, valid, LANES)
            result = _pkpo_s(d, o, x, LANES)
            c = kf  # (a bank's rows carry c already)
            if has_bank == 0:
                c = kf / tl.where(code == MAXK_LOO, nm1, nf)  # one division, not one per choice
            if has_bank != 0:
                below = _bank_row(bank_ptr, block_at, 3, n, cols, valid, LANES)
            else:
                below = c * _max_table(rank, n - 1, ksafe, LANES)
            result = result - _prefix_exclusive(below * x)
            if has_bank != 0:
                above = _bank_row(bank_ptr, block_at, 4, n, cols, valid, LANES)
            else:
                above = c * _max_table(rank - 1, n - 1, ksafe, LANES)  # the rest-set weight of rank j-1
            result = result - _suffix_exclusive(above * x, LANES)
        elif code == MAXK_LOO1:
            # D_j y_j - sum_{t<j} B_t y_t + W1 (y_j - mean of others)/n (spec 2.4): a single k >= 2
            # has B_t = o_{t+1}, W1 = 0; k = 1 has D = B = 0, W1 = 1
            if has_bank != 0:
                below = _bank_row(bank_ptr, block_at, 3, n, cols, valid, LANES)
                w1 = tl.load(bank_ptr + tl.maximum(block_at, 0) + 5 * n, mask=block_at >= 0, other=0.0)
            else:
                below = tl.where(ksafe >= 2, _max_table(rank + 1, n, ksafe, LANES) * (kf - 1.0) / rf,
                                 0.0)
                w1 = tl.where(ksafe == 1, 1.0, 0.0).to(tl.float64)
            result = -_prefix_exclusive(below * y)  # before d: the two are not alive together
            if has_bank != 0:
                d_eff = _d_table(bank_ptr, block_at, has_bank, rank, n, ksafe, cols, valid, LANES)
            else:
                d_eff = tl.where(ksafe >= 2, _max_table(rank, n, ksafe, LANES), 0.0)
            # W1 (x_j - mean of the others)/n = W1/(n-1) (y_j - mean of y): one division per group
            # (0 for a singleton, where the term is 0)
            w1_per_gap = tl.where(n >= 2, w1 / nm1, 0.0)
            result = d_eff * y + result + w1_per_gap * (y - ymean)
        elif code == MAXK_OFFPOLICY:
            if DELTAS:  # compile-time: only in the kernels that off-policy launches use
                result, bad = _off_policy_weights(deltas_ptr, src, valid, bad, clamp_delta, has_clamp,
                                                  has_bank, bank_ptr, block_at, n, cols, rank, rf, kf,
                                                  d, o, x, ksafe, LANES, OFF_POLICY_LATE_TABLES)
        elif code == TANG_LOO:
            second = _row_sum(tl.where(cols == n - 2, x, 0.0))
            result = tl.where((cols == n - 1) & (n >= 2), xtop - second, 0.0)
        elif code == BON_MAX_MEAN:
            result = tl.where(valid & (x == xtop), y - ymean, 0.0)
        elif code == BON_MAX_SECOND:
            second = tl.max(tl.where(valid & (x < xtop), x, float("-inf")), axis=1)[:, None]
            has_second = second > float("-inf")
            gap = tl.where(has_second, xtop - second, 0.0)
            result = tl.where(valid & (x == xtop), gap, 0.0)
        elif code == BON_MEAN:
            # z-score of s (spec 3.3; reference.zscore, group_math.h zscore_emit), computed from the
            # shifted rewards (s shifts by a constant, the z-score does not): a constant group has s
            # exactly 0, hence exactly 0 output at any eps
            s_y = tl.where(valid, d * y + _suffix_exclusive(o * y, LANES), 0.0)
            s_first = _first_column(s_y, cols)
            dev = tl.where(valid, s_y - (s_first + _row_sum(tl.where(valid, s_y - s_first, 0.0)) /
                                         tl.maximum(nf, 1.0)), 0.0)
            std = tl.sqrt(_row_sum(dev * dev) / nm1)
            scale = tl.max(tl.where(valid, tl.abs(_pkpo_s(d, o, x, LANES)), 0.0), axis=1)[:, None]
            constant = (std <= ZSCORE_CONSTANT_RTOL * scale) | (n < 2)
            result = tl.where(constant, 0.0, _over(dev, std + eps))
        elif code == CHEN_PASSK:
            # ((n/k) s_i - R) / (sigma + eps) with the failure probabilities (spec 6; the names of
            # reference.chen_passk and group_math.h): miss_k = 1 - R = C(n-c,k)/C(n,k), and for a
            # wrong sample miss_rest = 1 - (n/k) s_i = C(n-1-c,k-1)/C(n-1,k-1), each a sum of table
            # entries; a_pos = miss_k / (sigma + eps), a_neg = (miss_k - miss_rest) / (sigma + eps)
            wrong = valid & (x == 0.0)
            miss_k = _row_sum(tl.where(wrong, d, 0.0))
            n_wrong = tl.sum(wrong.to(tl.int32), axis=1)[:, None]
            d_rest = _max_table(rank, n - 1, tl.maximum(ksafe - 1, 1), LANES)
            miss_rest = tl.where(ksafe == 1, 1.0, _row_sum(tl.where(rank < n_wrong, d_rest, 0.0)))
            sigma = tl.sqrt((1.0 - miss_k) * miss_k)
            a_pos = miss_k / (sigma + eps)
            a_neg = (miss_k - miss_rest) / (sigma + eps)
            value = tl.where(x == 1.0, a_pos, a_neg)
            degenerate = (n_wrong == n) | (n_wrong < ksafe)  # R is exactly 0 or 1
            result = tl.where(degenerate, 0.0, value)
        elif (code == BON_RLB) | (code == BON_RLB_POS):
            # Chow BoN-RLB with plug-in p_fail = (n - c)/n, averaged over k-subsets (spec 4); the
            # names of reference.bon_rlb and group_math.h. Binary rewards; R = pass@k estimate and
            # 1 - R, both as sums of positive table entries. Sum-scale values: correct_weight =
            # w_plus R / c, wrong_weight = w_minus (1 - R)/(n - c).
            c = _row_sum(x)
            n_minus_c = nf - c
            R = _row_sum(d * x)
            one_minus_R = _row_sum(tl.where(valid, d * (1.0 - x), 0.0))
            p_fail = n_minus_c / tl.maximum(nf, 1.0)
            log_p = tl.log(tl.where(p_fail > 0.0, p_fail, 1.0))
            p_km1 = tl.where(ksafe == 1, 1.0, tl.where(p_fail > 0.0, tl.exp((kf - 1.0) * log_p), 0.0))
            p_k = tl.where(p_fail > 0.0, tl.exp(kf * log_p), 0.0)
            # 1 - p^k (the reference and group_math.h use -expm1(k log p); the two differ by rounding)
            one_minus_pk = tl.where(c > 0.0, 1.0 - p_k, 1.0)
            if code == BON_RLB:
                w_plus = kf * p_km1 / one_minus_pk
                w_minus = tl.where(c > 0.0, kf * p_fail / tl.where(c > 0.0, 1.0 - p_fail, 1.0),
                                   float("inf"))
                wrong_weight = w_minus * one_minus_R / tl.maximum(n_minus_c, 1.0)
            else:
                # w_plus = k p^(k-1) / geometric with geometric = (1 - p^k)/(1 - p)
                w_plus = kf * p_km1 * (1.0 - p_fail) / one_minus_pk
                wrong_weight = tl.zeros_like(one_minus_R)
            correct_weight = w_plus * R / tl.maximum(c, 1.0)
            result = nf * tl.where(x == 1.0, correct_weight, wrong_weight)
        elif (code == GRPO) | (code == RLOO) | (code == DR_GRPO):
            # centred on the group's smallest sample (a constant group gives exactly 0) and divided
            # by a power of two first (exact), so that |x| near the float64 limit neither overflows
            # the differences nor the squares
            amax = tl.max(tl.where(valid, tl.abs(x_compared), 0.0), axis=1)[:, None].to(tl.float64)
            unit = _power_of_two_scale(amax)
            inv = 1.0 / unit
            yu = tl.where(valid, x * inv - xmin * inv, 0.0)
            ysum_u = _row_sum(yu)
            dev = tl.where(valid, yu - ysum_u / tl.maximum(nf, 1.0), 0.0)
            if code == GRPO:
                std = tl.sqrt(_row_sum(dev * dev) / nm1)
                result = tl.where((n >= 2) & (std > 0.0), _over(dev, std + eps * inv), 0.0)
            elif code == RLOO:
                # x - mean of the others = (x - mean) n/(n - 1): one division per group
                result = tl.where(n >= 2, dev * (nf / nm1 * unit), 0.0)
            else:
                result = dev * unit
        elif code == MAXRL:
            # (x_j - mean) / mean, mean = x_min + mean(y); 0 when the mean is 0 and for a singleton
            mean = xmin + ymean
            result = tl.where((n >= 2) & (mean != 0.0), _over(y - ymean, mean), 0.0)

        # ---- natural scale -> requested scale, small-group zeroing, clip, NaN, cast (_finish)
        out = _finish(result, nf, mean_scale, natural_mean, zero_group, bad, clip_lo, clip_hi, out_dtype)
        # addressed and gated by the source column: each sample of the group is written exactly once
        # (the gate reads perm, not src - start: the same, in fewer registers where a thread holds a group)
        _store(out_ptr + src, out, perm < n, LANES)

    # ---- the rest of a group larger than BLOCK (only with an undersized max_group_size)
    rest_end = tl.max(tl.where(oversize_g, n_all_g, 0), axis=0)
    chunk = BLOCK + tl.zeros([1], dtype=tl.int64)  # a while loop: the interpreter cannot take
    while tl.sum(chunk, axis=0) < rest_end:  # a reduced scalar as a range() bound
        at = chunk + cols
        nan_out = _cast_like_torch(tl.full([GROUPS, BLOCK], float("nan"), tl.float64),
                                   out_ptr.dtype.element_ty)
        _store(out_ptr + start + at, nan_out, oversize & (at < n_all), LANES)
        chunk += BLOCK
