"""bonkernels.integrations.trl with the real trl package: a few GRPO steps of a tiny random model on CPU."""

import pytest
import torch

import bonkernels as bk

trl = pytest.importorskip("trl")
transformers = pytest.importorskip("transformers")
datasets = pytest.importorskip("datasets")

from bonkernels.integrations.trl import BonkernelsGRPOTrainer  # noqa: E402

NUM_GENERATIONS = 4


def tiny_tokenizer():
    """A character-level tokenizer built offline (no hub download)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    vocab = {"<pad>": 0, "<eos>": 1}
    for c in "abcdefghijklmnopqrstuvwxyz0123456789 +=?.":
        vocab[c] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>")


def tiny_model(tokenizer):
    torch.manual_seed(0)
    cfg = transformers.Qwen2Config(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
                                   num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                   max_position_embeddings=64, pad_token_id=0, eos_token_id=1, bos_token_id=1)
    return transformers.Qwen2ForCausalLM(cfg)


class RecordingTrainer(BonkernelsGRPOTrainer):
    """Keeps what each generation batch handed to the loss, for the checks below."""

    def __init__(self, *args, **kwargs):
        self.seen = []
        super().__init__(*args, **kwargs)

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        self.seen.append((output["advantages"].clone(), self.bk_trl_advantages.clone()))
        return output


def _train(tmp_path, estimator, k, steps=2):
    tokenizer = tiny_tokenizer()
    model = tiny_model(tokenizer)
    rewards_seen = []

    def reward_a(completions, **kwargs):
        # share of the letter 'a', plus a little length signal: continuous rewards with few ties
        out = [c.count("a") / max(len(c), 1) + 0.01 * len(c) for c in completions]
        rewards_seen.append(torch.tensor(out, dtype=torch.float64))
        return out

    dataset = datasets.Dataset.from_dict({"prompt": ["what is 1+1?", "say aaa.", "abc", "2+2="] * 2})
    args = trl.GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=8, num_generations=NUM_GENERATIONS,
                          max_completion_length=6, max_steps=steps, learning_rate=1e-2, use_cpu=True,
                          report_to="none", logging_steps=1, save_strategy="no", seed=0, beta=0.0,
                          dataloader_num_workers=0)
    before = [p.detach().clone() for p in model.parameters()]
    trainer = RecordingTrainer(model=model, reward_funcs=reward_a, args=args, train_dataset=dataset,
                               processing_class=tokenizer, estimator=estimator, k=k)
    result = trainer.train()
    changed = any(not torch.equal(a, b.detach()) for a, b in zip(before, model.parameters()))
    return trainer, rewards_seen, result, changed


def test_grpo_gives_trls_own_advantages(tmp_path):
    trainer, rewards_seen, result, changed = _train(tmp_path, "grpo", None)
    assert len(trainer.seen) == 2 and changed
    for ours, theirs in trainer.seen:
        assert (theirs != 0).any()
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)


def test_maxk_loo1_trains_and_uses_bonkernels_advantages(tmp_path):
    trainer, rewards_seen, result, changed = _train(tmp_path, "maxk_loo1", 2, steps=3)
    assert changed and torch.isfinite(torch.tensor(result.training_loss))
    assert len(trainer.seen) == len(rewards_seen) == 3
    for (ours, _), rewards in zip(trainer.seen, rewards_seen):
        expect = bk.advantages(rewards.view(-1, NUM_GENERATIONS), 2, "maxk_loo1").reshape(-1)
        torch.testing.assert_close(ours.double(), expect, rtol=1e-5, atol=1e-6)
    # the advantages TRL logs for the batch are ours
    logged = torch.tensor(list(trainer._logs["advantages"]), dtype=torch.float64)
    torch.testing.assert_close(logged[-ours.numel():], ours.double(), rtol=1e-5, atol=1e-6)


def test_bad_configuration_errors(tmp_path):
    tokenizer = tiny_tokenizer()
    model = tiny_model(tokenizer)
    dataset = datasets.Dataset.from_dict({"prompt": ["abc"] * 4})
    args = trl.GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=4,
                          max_completion_length=4, max_steps=1, use_cpu=True, report_to="none")
    common = dict(model=model, reward_funcs=lambda completions, **kw: [0.0] * len(completions), args=args,
                  train_dataset=dataset, processing_class=tokenizer)
    with pytest.raises(ValueError, match="needs k"):
        BonkernelsGRPOTrainer(estimator="maxk", **common)
    with pytest.raises(ValueError, match="policy_loss"):
        BonkernelsGRPOTrainer(estimator="maxk_offpolicy", k=2, **common)
    with pytest.raises(ValueError, match="unknown estimator"):
        BonkernelsGRPOTrainer(estimator="pkpo", k=2, **common)
