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
    names = ("torch", "trl", "verl", "openrlhf", "skyrl", "validation")
    assert len(blocks) == len(names), f"expected the {', '.join(names)} snippets, in this order"
    for b in blocks:
        assert len([line for line in b.splitlines() if line.strip() and not line.lstrip().startswith("#")]) <= 5
    return dict(zip(names, blocks))


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


def test_openrlhf_snippet():
    pytest.importorskip("openrlhf")
    import test_integration_openrlhf as t   # skips here too when OpenRLHF's modules cannot be imported

    n = 4
    exps, rewards = t._experiences(3, n, seed=21)
    args = t._args("rloo", n)
    ns = {"args": args, "strategy": t.SimpleNamespace(args=args), "kl_ctl": t.FixedKLController(0.0),
          "model_groups": [None] * 4, "tokenizer": None, "experiences": exps}
    exec(compile(_blocks()["openrlhf"], "README:openrlhf", "exec"), ns)
    expect = bk.advantages(rewards.view(-1, n).double(), 4, "maxk_loo1").reshape(-1).float()
    for exp in ns["experiences"]:
        for row, i in enumerate(exp.index):
            m = exp.action_mask[row]
            torch.testing.assert_close(exp.advantages[row][m], expect[i].expand(int(m.sum())))


def test_skyrl_snippet():
    pytest.importorskip("skyrl")
    import numpy as np
    import test_integration_skyrl as t   # imports SkyRL's PPO utilities (see there for Python < 3.12)

    rewards, mask, uids = t._batch([4, 4], seed=2)
    ns = {"token_level_rewards": rewards, "response_mask": mask, "index": uids}
    exec(compile(_blocks()["skyrl"], "README:skyrl", "exec"), ns)
    _, inverse = np.unique(uids, return_inverse=True)
    expect = bk.advantages(rewards.sum(-1), 4, "maxk_loo1", group_ids=torch.as_tensor(inverse))
    torch.testing.assert_close(ns["advantages"], expect[:, None] * mask)


def test_validation_snippet(tmp_path, monkeypatch):
    trl = pytest.importorskip("trl")
    datasets = pytest.importorskip("datasets")
    metric_utils = pytest.importorskip("verl.trainer.ppo.metric_utils")
    from test_integration_trl import tiny_model, tiny_tokenizer
    from bonkernels.integrations import verl_validation

    monkeypatch.setattr(metric_utils, "process_validation_metrics", metric_utils.process_validation_metrics)
    monkeypatch.setattr(verl_validation, "_SETTINGS", dict(verl_validation._SETTINGS))
    tokenizer = tiny_tokenizer()
    prompts = datasets.Dataset.from_dict({"prompt": ["abc", "2+2="]})
    args = trl.GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=8, per_device_eval_batch_size=8,
                          num_generations=4, max_completion_length=4, max_steps=1, use_cpu=True,
                          report_to="none", save_strategy="no")
    trainer = trl.GRPOTrainer(model=tiny_model(tokenizer), args=args, processing_class=tokenizer,
                              reward_funcs=lambda completions, **kw: [float("a" in c) for c in completions],
                              train_dataset=prompts, eval_dataset=prompts)
    ns = {"rewards": [1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0], "uids": ["p0"] * 4 + ["p1"] * 4, "trainer": trainer}
    exec(compile(_blocks()["validation"], "README:validation", "exec"), ns)
    assert ns["metrics"]["pass@4"] == 1.0 and ns["metrics"]["pass@1"] == 0.375
    assert ns["metrics"]["max_mix@4"] == pytest.approx(0.375 + 0.5)
    assert metric_utils.process_validation_metrics is verl_validation.process_validation_metrics
    assert "eval_pass@4" in trainer.evaluate()
