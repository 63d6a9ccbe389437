"""A short demo: advantages of every estimator for a small batch of grouped rewards."""

import torch

import bonkernels as bk
from bonkernels import estimators


def main() -> None:
    torch.manual_seed(0)
    rewards = torch.tensor([[0.0, 0.2, 0.2, 0.9, 0.4, 0.0, 1.0, 0.3],    # prompt 0: continuous rewards
                            [0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0]])   # prompt 1: one success in 8
    binary = (rewards > 0.5).float()
    deltas = 0.1 * torch.randn_like(rewards)                            # pi_theta/pi_old - 1, off-policy
    k = 4
    print(f"rewards (G=2 groups of n=8), k={k}, scale='mean'\n{rewards}\n")
    print(f"pass@{k} per group: {bk.pass_at_k(binary, k).tolist()}")
    print(f"max@{k} per group:  {bk.max_at_k(rewards, k).tolist()}\n")
    for name in bk.ESTIMATORS:
        est = estimators.get(name)                                     # the registry's facts
        r = binary if est.binary else rewards
        kw = {"deltas": deltas} if est.needs_deltas else {}
        a = bk.advantages(r, k, name, **kw)
        print(f"{name:>21}: " + "  ".join(" ".join(f"{v:+.3f}" for v in row) + " |" for row in a.tolist()))


if __name__ == "__main__":
    main()
