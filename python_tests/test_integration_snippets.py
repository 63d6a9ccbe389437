"""The "In a trainer" snippets of README.md run as written, in the context their trainer gives them."""

import re
from pathlib import Path

import pytest
import torch

import bonkernels as bk

README = Path(__file__).resolve().parents[1] / "README.md"
SECTION = "## In a trainer"


def _blocks():
    text = README.read_text()
    section = text[text.index(SECTION):]
    section = section[:section.index("\n## ", len(SECTION))]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert len(blocks) == 3, "expected the plain PyTorch, TRL and verl snippets"
    for b in blocks:
        assert len([line for line in b.splitlines() if line.strip() and not line.lstrip().startswith("#")]) <= 5
    return dict(zip(("torch", "trl", "verl"), blocks))


def test_plain_pytorch_snippet():
    if not hasattr(bk, "policy_loss"):
        pytest.skip("bonkernels/__init__.py does not export policy_loss yet")
    ns = {}
    exec(compile(_blocks()["torch"], "README:torch", "exec"), ns)
    assert torch.isfinite(ns["loss"]) and ns["logp"].grad is not None
    assert torch.isfinite(ns["logp"].grad).all() and set(ns["stats"]) >= {"clip_frac", "approx_kl", "objective"}


def test_trl_snippet(tmp_path):
    trl = pytest.importorskip("trl")
    datasets = pytest.importorskip("datasets")
    from test_integration_trl import tiny_model, tiny_tokenizer

    tokenizer = tiny_tokenizer()
    ns = {
        "tokenizer": tokenizer,
        "model": tiny_model(tokenizer),
        "reward_fn": lambda completions, **kw: [c.count("a") / max(len(c), 1) for c in completions],
        "dataset": datasets.Dataset.from_dict({"prompt": ["abc", "2+2=", "say a", "hi"]}),
        "args": trl.GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=8, num_generations=4,
                               max_completion_length=4, max_steps=1, use_cpu=True, report_to="none",
                               save_strategy="no"),
    }
    exec(compile(_blocks()["trl"], "README:trl", "exec"), ns)
    assert ns["trainer"].bk_estimator == "maxk_loo1" and ns["trainer"].state.global_step == 1


def test_verl_snippet():
    pytest.importorskip("verl.trainer.ppo.core_algos")
    import numpy as np
    from bonkernels.integrations import verl as bk_verl

    rewards = torch.zeros(8, 5)
    rewards[:, -1] = torch.rand(8)
    ns = {"token_level_rewards": rewards, "response_mask": torch.ones(8, 5),
          "index": np.array(["p0"] * 4 + ["p1"] * 4, dtype=object)}
    try:
        exec(compile(_blocks()["verl"], "README:verl", "exec"), ns)
    finally:
        bk_verl._SETTINGS["k"] = None
    expect = bk.advantages(rewards[:, -1].view(2, 4).double(), 4, "maxk_loo1").reshape(-1)
    torch.testing.assert_close(ns["advantages"][:, 0].double(), expect.to(torch.float32).double())
