"""How often the packed sort's exact step runs: the share of groups whose float32 rewards include
two that agree in every orderable bit above the log2(W) bits the slot replaces but differ below
them (lane_sort_packed then reports kNearEqual), and the share of warps of 32 groups (one group a
thread) holding at least one such group. numpy only; a few seconds.

    python bench/results/static_sm90_thread64_prototype/clash_rates.py
"""
import numpy as np


def near_equal_share(x: np.ndarray) -> float:
    W = x.shape[1]
    u = x.view(np.uint32)
    orderable = np.where(u >> 31, ~u, u | np.uint32(0x80000000)).astype(np.uint32)
    high = orderable >> np.uint32(W.bit_length() - 1)  # the bits the word keeps
    word = (high.astype(np.uint64) << 8) | np.arange(W, dtype=np.uint64)
    read_back = np.take_along_axis(x, np.argsort(word, axis=1), axis=1)
    return float((np.diff(read_back, axis=1) < 0).any(axis=1).mean())


def main() -> None:
    rng = np.random.default_rng(0)
    draws = {
        "U(0, 1)": lambda G, W: rng.random((G, W), dtype=np.float32),
        "N(0, 1)": lambda G, W: rng.standard_normal((G, W)).astype(np.float32),
        "U(0, 1) to 3 decimals": lambda G, W: (np.round(rng.random((G, W)) * 1000) / 1000).astype(np.float32),
    }
    print("| W | rewards | groups with near-equal rewards | warps (32 groups) with one |")
    print("|---|---|---|---|")
    for W in (32, 64):
        for name, draw in draws.items():
            share = near_equal_share(draw(200_000, W))
            print(f"| {W} | {name} | {100 * share:.2f} % | {100 * (1 - (1 - share) ** 32):.1f} % |")


if __name__ == "__main__":
    main()
