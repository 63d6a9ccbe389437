"""Supervised warm start: teacher-forced cross-entropy on the task's reference solutions.

A model built from scratch knows nothing, so RL from it would never see a reward. A short
supervised stage on generated solutions gives a base policy that solves some problems sometimes
(pass@1 well below pass@k), the regime where pass@k-aware estimators matter.
"""

from __future__ import annotations

import hashlib
import json
import time

import torch

from .rollout import encode_prompts


def sft_batch(tokenizer, problems, device):
    """(input_ids, attention_mask, position_ids, labels) with the loss on solution + eos only."""
    prompts_ids, prompt_mask = encode_prompts(tokenizer, [p.prompt for p in problems], device)
    sols = [tokenizer.encode(p.solution) + [tokenizer.eos_id] for p in problems]
    T = max(len(s) for s in sols)
    comp = torch.full((len(sols), T), tokenizer.pad_id, dtype=torch.long)
    comp_mask = torch.zeros((len(sols), T), dtype=torch.long)
    for i, s in enumerate(sols):
        comp[i, :len(s)] = torch.tensor(s)
        comp_mask[i, :len(s)] = 1
    comp, comp_mask = comp.to(device), comp_mask.to(device)
    ids = torch.cat([prompts_ids, comp], 1)
    mask = torch.cat([prompt_mask, comp_mask], 1)
    labels = torch.where(torch.cat([torch.zeros_like(prompt_mask), comp_mask], 1).bool(), ids, -100)
    positions = (mask.cumsum(1) - 1).clamp(min=0)
    return ids, mask, positions, labels


def warm_start_key(fields: dict) -> str:
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]


def supervised_warm_start(model, tokenizer, task, *, steps: int, batch_size: int, lr: float,
                          device, log=print) -> dict:
    """Train in place; returns {"loss": final running loss, "seconds": ...}."""
    n_sft = task.num_problems("sft")
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.99), weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / max(1, steps // 10)) * max(0.1, 1 - s / max(1, steps)))
    model.train()
    start, running = time.time(), None
    for step in range(steps):
        idx = range(step * batch_size, (step + 1) * batch_size)
        problems = [task.problem("sft", i if n_sft is None else i % n_sft) for i in idx]
        ids, mask, positions, labels = sft_batch(tokenizer, problems, device)
        loss = model(input_ids=ids, attention_mask=mask, position_ids=positions,
                     labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        value = loss.item()
        running = value if running is None else 0.95 * running + 0.05 * value
        if log and (step + 1) % max(1, steps // 10) == 0:
            log(f"warm start {step + 1}/{steps}: loss {running:.3f} ({time.time() - start:.0f} s)")
    return {"loss": running, "seconds": time.time() - start}
