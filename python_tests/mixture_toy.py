"""Exact enumeration on a softmax toy for mixtures over k and MaxRL (spec 12).

A policy over a few outcomes, pi = softmax(theta), each outcome with a fixed reward. A group is n
i.i.d. draws; every multiset of n outcomes is enumerated with its multinomial probability, so the
expectation of an estimator's gradient sum_i A_i grad log pi(x_i) is exact (no sampling).
grad log pi(x) = e_x - pi for the softmax.
"""

from __future__ import annotations

import itertools
import math
from typing import Sequence

import torch


class Toy:
    def __init__(self, logits: Sequence[float], rewards: Sequence[float]):
        self.theta = torch.tensor(logits, dtype=torch.float64)
        self.g = torch.tensor(rewards, dtype=torch.float64)
        self.p = torch.softmax(self.theta, 0)
        self.K = len(logits)

    def multisets(self, n: int):
        """All multisets of n outcomes: (outcome index tensor [M, n], probabilities [M])."""
        rows, probs = [], []
        for combo in itertools.combinations_with_replacement(range(self.K), n):
            counts = [combo.count(o) for o in range(self.K)]
            coef = math.factorial(n)
            for c in counts:
                coef //= math.factorial(c)
            probs.append(coef * math.prod(float(self.p[o]) ** c for o, c in enumerate(counts)))
            rows.append(combo)
        return torch.tensor(rows, dtype=torch.int64), torch.tensor(probs, dtype=torch.float64)

    def score_sum(self, outcomes: torch.Tensor, A: torch.Tensor) -> torch.Tensor:
        """sum_i A_i grad log pi(x_i) per row: [M, K]."""
        onehot = torch.nn.functional.one_hot(outcomes, self.K).to(torch.float64)   # [M, n, K]
        return (A[..., None] * (onehot - self.p)).sum(-2)

    def expectation(self, outcomes, probs, A):
        return (probs[:, None] * self.score_sum(outcomes, A)).sum(0)

    def total_variance(self, outcomes, probs, A) -> float:
        """Trace of the covariance of the gradient estimate."""
        s = self.score_sum(outcomes, A)
        mean = (probs[:, None] * s).sum(0)
        return float((probs * ((s - mean) ** 2).sum(1)).sum())

    # ---- true gradients of the objectives

    def max_at_k(self, theta: torch.Tensor, k: int) -> torch.Tensor:
        """E[max of k draws] = sum over distinct values v of v (F(v)^k - F(v-)^k)."""
        p = torch.softmax(theta, 0)
        values = torch.unique(self.g)
        F = torch.stack([p[self.g <= v].sum() for v in values])
        F_prev = torch.cat([torch.zeros(1, dtype=torch.float64), F[:-1]])
        return (values * (F ** k - F_prev ** k)).sum()

    def grad_mixture(self, weights: Sequence[float]) -> torch.Tensor:
        theta = self.theta.clone().requires_grad_(True)
        J = sum(w * self.max_at_k(theta, k) for k, w in enumerate(weights, start=1) if w)
        (grad,) = torch.autograd.grad(J, theta)
        return grad

    def grad_harmonic(self, T: int) -> torch.Tensor:
        """H_T = sum_{k<=T} (1/k) grad pass@k (MaxRL's order-T truncation)."""
        return self.grad_mixture([1.0 / k for k in range(1, T + 1)])
