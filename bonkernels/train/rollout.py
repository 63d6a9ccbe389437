"""Sampling groups of completions with ``generate`` and scoring their token log-probabilities.

Prompts are left-padded so every completion starts at the same column. The completion mask
covers the sampled tokens up to and including the first eos. ``token_logprobs`` recomputes the
log-probabilities with an explicit position_ids (left padding aware), which matches what
``generate`` sampled from (tested in test_train.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Rollout:
    input_ids: torch.Tensor       # [B*n, P+T] prompt (left-padded) + completion
    attention_mask: torch.Tensor  # [B*n, P+T] 1 on real tokens (prompt padding is 0)
    prompt_len: int               # P
    completion_mask: torch.Tensor  # [B*n, T] float 0/1
    texts: list                   # decoded completions, B*n


def encode_prompts(tokenizer, prompts, device):
    rows = [([tokenizer.bos_id] if tokenizer.bos_id is not None else []) + tokenizer.encode(p)
            for p in prompts]
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), tokenizer.pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r):] = torch.tensor(r, dtype=torch.long)
        mask[i, width - len(r):] = 1
    return ids.to(device), mask.to(device)


@torch.no_grad()
def sample(model, tokenizer, prompts, n: int, max_new_tokens: int, device) -> Rollout:
    """n completions per prompt (temperature 1, top-p 1, no top-k: the policy's own distribution)."""
    ids, mask = encode_prompts(tokenizer, prompts, device)
    was_training = model.training
    model.eval()
    out = model.generate(
        input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_p=1.0, top_k=0,
        max_new_tokens=max_new_tokens, num_return_sequences=n,
        pad_token_id=tokenizer.pad_id, eos_token_id=tokenizer.eos_id,
    )
    model.train(was_training)
    P = ids.shape[1]
    completion = out[:, P:]
    T = completion.shape[1]
    is_eos = completion == tokenizer.eos_id
    # tokens up to and including the first eos
    after_eos = (is_eos.cumsum(1) - is_eos.long()) > 0
    completion_mask = (~after_eos).float()
    if T == 0:
        completion_mask = completion_mask.reshape(len(out), 0)
    prompt_mask = mask.repeat_interleave(n, dim=0)
    attention = torch.cat([prompt_mask, torch.ones_like(completion)], dim=1)
    texts = [tokenizer.decode(row[m.bool()].tolist()) for row, m in zip(completion, completion_mask)]
    return Rollout(out, attention, P, completion_mask, texts)


def token_logprobs(model, input_ids, attention_mask, prompt_len: int) -> torch.Tensor:
    """[B, T] log-probabilities of the completion tokens (columns prompt_len..end)."""
    position_ids = (attention_mask.cumsum(1) - 1).clamp(min=0)
    logits = model(input_ids=input_ids, attention_mask=attention_mask,
                   position_ids=position_ids).logits
    logits = logits[:, prompt_len - 1:-1].float()
    targets = input_ids[:, prompt_len:]
    return torch.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
