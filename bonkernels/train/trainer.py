"""The RL loop: sample groups, score them, bonkernels' policy loss, optimiser step; evaluate,
log, checkpoint. ``run(config)`` is what ``python -m bonkernels.train`` calls."""

from __future__ import annotations

import copy
import json
import os
import random
import signal
import sys
import time

import numpy as np
import torch

from .. import estimators
from . import checkpoint as ckpt
from .distributed import Dist
from .evaluate import evaluate, write_eval_rewards
from .models import count_parameters, export_model, load_model
from .rollout import sample, token_logprobs
from .scoring import safe_rewards
from .tasks import make_task
from .warmstart import supervised_warm_start, warm_start_key

METRICS_FILE = "metrics.jsonl"
EVAL_RECORDS_DIR = "eval_rewards"  # OUT/eval_rewards/step-000020.json with --eval-records
CONFIG_FILE = "config.json"
SUMMARY_FILE = "summary.json"


def _policy_loss():
    import bonkernels as bk

    fn = getattr(bk, "policy_loss", None)
    if fn is None:
        from ..loss import policy_loss as fn
    return fn


def k_at(step: int, cfg) -> int:
    """k for a training step (1-based): constant, linear anneal, or a step switch to k_final.
    (With --k-schedule mixture: the largest k with a non-zero weight, see k_weights_at.)"""
    if getattr(cfg, "k_weights", None) is not None:
        return len(k_weights_at(step, cfg))
    if cfg.k_final is None or cfg.k_final == cfg.k:
        return cfg.k
    frac = 0.0 if cfg.steps <= 1 else (step - 1) / (cfg.steps - 1)
    if cfg.k_schedule == "step":
        return cfg.k if frac < cfg.k_switch else cfg.k_final
    if cfg.k_schedule == "mixture":
        return len(k_weights_at(step, cfg))
    return int(round(cfg.k + (cfg.k_final - cfg.k) * frac))


def k_weights_at(step: int, cfg):
    """The mixture over k of a training step, or None for a single k: --k-weights as given, or
    --k-schedule mixture's interpolation from --k to --k-final (bonkernels.anneal_k_weights)."""
    from ..tables import anneal_k_weights, normalize_k_weights, parse_k_weights

    if getattr(cfg, "k_weights", None) is not None:
        return parse_k_weights(cfg.k_weights)
    if cfg.k_schedule != "mixture" or cfg.k_final is None:
        return None
    frac = 0.0 if cfg.steps <= 1 else (step - 1) / (cfg.steps - 1)
    return normalize_k_weights(anneal_k_weights(cfg.k, cfg.k_final, frac))   # trailing zeros cut


def samples_after(step: int, cfg) -> int:
    """Completions sampled for training up to and including ``step`` (all ranks together): the
    x-axis on which arms with different numbers of optimiser passes per batch compare."""
    return step * cfg.batch_size * cfg.n


def weighting_for(cfg) -> str:
    if cfg.weighting != "auto":
        return cfg.weighting
    return "direct" if estimators.REGISTRY[cfg.estimator].needs_deltas else "ppo"


def validate(cfg) -> None:
    if cfg.estimator not in estimators.REGISTRY:
        raise ValueError(f"unknown --estimator {cfg.estimator!r}; choose from {estimators.ESTIMATORS}")
    est = estimators.REGISTRY[cfg.estimator]
    for name in ("n", "steps", "batch_size", "ppo_epochs", "eval_n", "k"):
        if getattr(cfg, name) < (0 if name == "steps" else 1):
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(cfg, name)}")
    mixture = getattr(cfg, "k_weights", None) is not None or cfg.k_schedule == "mixture" and cfg.k_final
    if mixture:
        from ..tables import MIXABLE_ESTIMATORS, parse_k_weights

        if cfg.estimator not in MIXABLE_ESTIMATORS:
            raise ValueError(f"--estimator {cfg.estimator} cannot mix k (--k-weights / --k-schedule mixture); "
                             f"choose from {', '.join(MIXABLE_ESTIMATORS)}")
        if getattr(cfg, "k_weights", None) is not None:
            if cfg.k_final is not None:
                raise ValueError("--k-weights replaces --k/--k-final; give one or the other")
            T = len(parse_k_weights(cfg.k_weights))
            if T > cfg.n - est.k_margin:
                raise ValueError(f"--k-weights has weight at k = {T}, more than {cfg.estimator} allows "
                                 f"with --n {cfg.n} (at most {cfg.n - est.k_margin})")
    if est.uses_k:
        k_max = cfg.n - est.k_margin
        for k in {cfg.k, cfg.k_final or cfg.k}:
            if k > k_max:
                raise ValueError(f"--k {k} is larger than {cfg.estimator} allows with --n {cfg.n} "
                                 f"(at most {k_max})")
    if est.binary and cfg.reward != "binary":
        raise ValueError(f"{cfg.estimator} needs 0/1 rewards: pass --reward binary")


class MetricsLog:
    """metrics.jsonl: one JSON object per line, appended and flushed as the run goes."""

    def __init__(self, path: str, enabled: bool):
        self.path, self.enabled = path, enabled

    def truncate_after(self, step: int) -> None:
        """Drop lines logged after the checkpoint we resume from (they will be redone)."""
        if not self.enabled or not os.path.exists(self.path):
            return
        keep = [json.dumps(r, sort_keys=True) + "\n" for r in self.read() if r["step"] <= step]
        ckpt.atomic_write_bytes(self.path, "".join(keep).encode())

    def write(self, record: dict) -> None:
        if self.enabled:
            with open(self.path, "a") as f:
                f.write(json.dumps(record, sort_keys=True) + "\n")
                f.flush()

    def read(self) -> list[dict]:
        """The records; a torn last line (a kill during its write) is dropped with a warning."""
        if not os.path.exists(self.path):
            return []
        with open(self.path) as f:
            lines = f.read().split("\n")
        records = []
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                if not isinstance(record, dict) or "step" not in record:
                    raise ValueError("not a metrics record")
            except ValueError as e:
                if all(not rest.strip() for rest in lines[number:]):
                    print(f"warning: {self.path}: dropped its torn last line {number} "
                          f"({line[:60]!r}...)", file=sys.stderr, flush=True)
                    break
                raise ValueError(f"{self.path}, line {number}: {e}; the file is damaged before its "
                                 f"last line: repair or delete that line") from e
            records.append(record)
        return records


def _train_problems(task, cfg, step: int, dist: Dist):
    """The step's prompts (deterministic in seed and step), this rank's share, whole groups."""
    total = task.num_problems("train")
    if total is None:
        keys = [f"{cfg.seed}-{step}-{j}" for j in range(cfg.batch_size)]
    else:
        rng = random.Random(f"train:{cfg.seed}:{step}")
        keys = [rng.randrange(total) for _ in range(cfg.batch_size)]
    return [task.problem("train", key) for key in dist.shard(keys)]


def _prepare_model(cfg, task, dist: Dist, log):
    model, tokenizer = load_model(cfg.model, seed=cfg.init_seed)
    model.to(dist.device)
    if cfg.init_from:
        state = ckpt.load(cfg.init_from)
        model.load_state_dict(state["model"] if "model" in state else state)
        log(f"initialised from {cfg.init_from}")
    elif cfg.warmstart_steps > 0:
        key = warm_start_key({"model": cfg.model, "task": cfg.task, "task_seed": cfg.task_seed,
                              "depths": cfg.synth_depth_weights,
                              "steps": cfg.warmstart_steps, "batch": cfg.warmstart_batch_size,
                              "lr": cfg.warmstart_lr, "init_seed": cfg.init_seed})
        cache = os.path.join(cfg.warmstart_cache, f"warmstart-{key}.pt") if cfg.warmstart_cache else None
        if cache and os.path.exists(cache):
            model.load_state_dict(ckpt.load(cache)["model"])
            log(f"warm start loaded from cache {cache}")
        elif dist.is_main:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(cfg.init_seed)
                info = supervised_warm_start(model, tokenizer, task, steps=cfg.warmstart_steps,
                                             batch_size=cfg.warmstart_batch_size,
                                             lr=cfg.warmstart_lr, device=dist.device, log=log)
            if cache:
                os.makedirs(cfg.warmstart_cache, exist_ok=True)
                ckpt.atomic_save({"model": model.state_dict(), "info": info}, cache)
                log(f"warm start cached at {cache}")
    dist.broadcast_module(model)  # every rank starts from rank 0's weights
    return model, tokenizer


def _progress(cfg, dist: Dist, start: int):
    if not dist.is_main:
        return None
    show = cfg.progress == "on" or (cfg.progress == "auto" and sys.stderr.isatty())
    if not show:
        return None
    from tqdm import tqdm

    return tqdm(total=cfg.steps, initial=start, desc=f"{cfg.estimator} k", dynamic_ncols=True,
                mininterval=0.5)


def train_step(step, cfg, model, tokenizer, task, opt, sched, dist, ref_model, loss_fn) -> dict:
    t0 = time.time()
    k = k_at(step, cfg)
    k_weights = k_weights_at(step, cfg)
    problems = _train_problems(task, cfg, step, dist)
    roll = sample(model, tokenizer, [p.prompt for p in problems], cfg.n, task.max_new_tokens,
                  dist.device)
    fractions, unscored = safe_rewards(task, [p for p in problems for _ in range(cfg.n)],
                                       roll.texts)
    rewards = torch.tensor(fractions, dtype=torch.float64, device=dist.device)
    if cfg.reward == "binary":
        rewards = (rewards >= 1.0).to(torch.float64)
    t_sample = time.time() - t0
    model.train()
    with torch.no_grad():
        old_logp = token_logprobs(model, roll.input_ids, roll.attention_mask, roll.prompt_len)
        ref_logp = None
        if ref_model is not None:
            ref_logp = token_logprobs(ref_model, roll.input_ids, roll.attention_mask, roll.prompt_len)
    weighting = weighting_for(cfg)
    params = [p for p in model.parameters() if p.requires_grad]
    losses, stats = [], {}
    for _ in range(cfg.ppo_epochs):
        opt.zero_grad(set_to_none=True)
        logp = token_logprobs(model, roll.input_ids, roll.attention_mask, roll.prompt_len)
        mix = {} if k_weights is None else {"k_weights": k_weights}
        loss, stats = loss_fn(logp, old_logp, rewards, None if k_weights is not None else k, cfg.estimator,
                              mask=roll.completion_mask, **mix,
                              group_size=cfg.n, ref_logp=ref_logp, kl_coef=cfg.kl_coef,
                              clip_eps=cfg.clip_eps, clamp_delta=cfg.clamp_delta,
                              weighting=weighting, loss_agg=cfg.loss_agg)
        loss.backward()
        dist.average_gradients(params)
        grad_norm = float(torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm))
        opt.step()
        losses.append(float(loss.detach()))
    sched.step()
    _fault("mid-step", step)
    fr = torch.tensor(fractions, dtype=torch.float64)
    record = {
        "kind": "train", "step": step, "k": k, "lr": sched.get_last_lr()[0],
        "samples": samples_after(step, cfg),
        **({} if k_weights is None else {"k_weights": list(k_weights)}),
        "reward_mean": dist.mean(float(fr.mean())),
        "solved_frac": dist.mean(float((fr >= 1.0).double().mean())),
        "loss": dist.mean(float(np.mean(losses))),
        "grad_norm": grad_norm,
        "completion_len": dist.mean(float(roll.completion_mask.sum(1).mean())),
        "sample_seconds": t_sample, "step_seconds": time.time() - t0,
    }
    for name in ("clip_frac", "approx_kl", "adv_abs_mean", "objective"):
        if name in stats:
            record[name] = dist.mean(float(stats[name]))
    if unscored:  # completions scored 0 (or clamped) because their reward was unusable
        record["unscored"] = dict(sorted(unscored.items()))
    return record


def _fault(point: str, step: int) -> None:
    """Fault injection for the resume tests: BONKERNELS_TRAIN_FAULT="mid-step:3,checkpoint-write:4"
    SIGKILLs the run at those points (after-log: after logging a step, before checkpointing it;
    mid-step: after the optimiser step, before logging; checkpoint-write: halfway through writing
    the checkpoint of that step)."""
    spec = os.environ.get("BONKERNELS_TRAIN_FAULT", "")
    if os.environ.get("BONKERNELS_TRAIN_KILL_AT_STEP"):
        spec += ",after-log:" + os.environ["BONKERNELS_TRAIN_KILL_AT_STEP"]
    if f"{point}:{step}" in spec.split(","):
        os.kill(os.getpid(), signal.SIGKILL)


def _check_sandbox(cfg, log) -> None:
    """Say which isolation layers the sandbox has; refuse reduced isolation unless opted in."""
    from . import sandbox

    layers = sandbox.isolation_layers()
    missing = sandbox.missing_layers()
    log(f"sandbox isolation layers: {', '.join(layers) or 'none'}")
    if not missing:
        return
    message = (f"the sandbox that runs model-written code lacks these isolation layers: "
               f"{', '.join(missing)} (they need root and Linux namespaces). Without them a "
               f"completion runs as this user: it can reach the network and local sockets through "
               f"ctypes or a subprocess, outlive the wall-clock kill with setsid, and write "
               f"anywhere this user can.")
    if not getattr(cfg, "sandbox_allow_unisolated", False):
        raise RuntimeError(message + " Run as root, or pass --sandbox-allow-unisolated to "
                           "accept that risk.")
    bar = "!" * 78
    log(f"{bar}\nWARNING: {message} Continuing because of --sandbox-allow-unisolated.\n{bar}")


def run(cfg) -> dict:
    """Train according to cfg (an argparse.Namespace from cli.py); returns the summary dict."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    dist = Dist(cfg.device)
    log = (lambda msg: print(msg, flush=True)) if dist.is_main else (lambda msg: None)
    validate(cfg)
    os.makedirs(cfg.out, exist_ok=True)
    if dist.is_main:  # temporary files of an atomic write that a kill interrupted
        stale = ckpt.remove_stale_temp_files(cfg.out, (ckpt.CHECKPOINT_NAME, METRICS_FILE,
                                                       CONFIG_FILE, SUMMARY_FILE))
        if stale:
            log(f"removed {len(stale)} temporary file(s) left by an interrupted write: {stale}")
    dist.barrier()
    metrics = MetricsLog(os.path.join(cfg.out, METRICS_FILE), dist.is_main)
    ckpt_path = os.path.join(cfg.out, ckpt.CHECKPOINT_NAME)
    resume_state = None
    if cfg.resume and os.path.exists(ckpt_path):
        resume_state = ckpt.load_checkpoint(ckpt_path)
    elif cfg.resume:
        log(f"no checkpoint in {cfg.out}: the run was stopped before its first one; restarting it "
            f"from the beginning with its saved configuration")
    if resume_state is None and dist.is_main:
        if os.path.exists(ckpt_path):  # a new run here: --resume must never pick up the old one
            os.unlink(ckpt_path)
            log(f"removed {ckpt_path} of an earlier run in {cfg.out}")
        # saved before the (long) warm start, so that a run killed at any point can be resumed
        ckpt.atomic_write_json(vars(cfg), os.path.join(cfg.out, CONFIG_FILE))
    if cfg.task == "humaneval":
        _check_sandbox(cfg, log)

    task = make_task(cfg.task, seed=cfg.task_seed, sandbox_timeout=cfg.sandbox_timeout,
                     workers=cfg.sandbox_workers, synth_depth_weights=cfg.synth_depth_weights)
    if cfg.max_new_tokens:
        task.max_new_tokens = cfg.max_new_tokens
    if resume_state is None:
        model, tokenizer = _prepare_model(cfg, task, dist, log)
    else:
        model, tokenizer = load_model(cfg.model, seed=cfg.init_seed)
        model.to(dist.device)
    ref_model = None
    if cfg.kl_coef > 0:
        ref_model = copy.deepcopy(model).eval()
        for p in ref_model.parameters():
            p.requires_grad_(False)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.99),
                            weight_decay=cfg.weight_decay)
    warmup = max(0, cfg.warmup_steps)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / (warmup + 1)))

    eval_problems = [task.problem("eval", i) for i in range(
        min(cfg.eval_problems, task.num_problems("eval") or cfg.eval_problems))]
    eval_seed = lambda step: (cfg.seed * 1_000_003 + step) % (2**31)  # noqa: E731

    def run_eval(step):
        t0 = time.time()
        res, table = evaluate(model, tokenizer, task, eval_problems, eval_n=cfg.eval_n,
                              device=dist.device, dist=dist, seed=eval_seed(step),
                              prompts_per_batch=cfg.eval_batch_prompts, return_rewards=True)
        res.update(kind="eval", step=step, samples=samples_after(step, cfg),
                   seconds=time.time() - t0)
        if getattr(cfg, "eval_records", False) and dist.is_main:
            os.makedirs(os.path.join(cfg.out, EVAL_RECORDS_DIR), exist_ok=True)
            write_eval_rewards(os.path.join(cfg.out, EVAL_RECORDS_DIR, f"step-{step:06d}.json"),
                               step=step, samples=samples_after(step, cfg),
                               problems=eval_problems, rewards=table)
        return res

    if resume_state is not None:
        if resume_state.get("world_size", 1) != dist.world:
            raise ValueError(f"the checkpoint was written by {resume_state.get('world_size', 1)} "
                             f"processes; resume with the same number (got {dist.world})")
        model.load_state_dict(resume_state["model"])
        opt.load_state_dict(resume_state["optimizer"])
        sched.load_state_dict(resume_state["scheduler"])
        if ref_model is not None:
            ref_model.load_state_dict(resume_state["ref_model"])
        ckpt.set_rng_state(resume_state["rng"][dist.rank])
        start = resume_state["step"]
        metrics.truncate_after(start)
        log(f"resumed from {ckpt_path} at step {start}")
    else:
        random.seed(cfg.seed * 7919 + dist.rank)
        np.random.seed((cfg.seed * 7919 + dist.rank) % (2**32))
        torch.manual_seed(cfg.seed * 7919 + dist.rank)
        start = 0
        if dist.is_main:
            if os.path.exists(metrics.path):
                os.unlink(metrics.path)
        log(f"model {cfg.model}: {count_parameters(model):,} parameters; task {cfg.task}; "
            f"estimator {cfg.estimator} ({weighting_for(cfg)} weighting), n={cfg.n}, "
            f"ppo epochs {cfg.ppo_epochs}, {dist.world} process(es) on {dist.device}")
        if cfg.eval_every > 0 and getattr(cfg, "initial_eval", True):
            metrics.write(run_eval(0))

    loss_fn = _policy_loss()
    bar = _progress(cfg, dist, start)
    last_eval = None
    for step in range(start + 1, cfg.steps + 1):
        record = train_step(step, cfg, model, tokenizer, task, opt, sched, dist, ref_model, loss_fn)
        metrics.write(record)
        if record.get("unscored"):
            log(f"step {step}: completions scored 0 without a usable reward: {record['unscored']}")
        _fault("after-log", step)
        if cfg.eval_every > 0 and (step % cfg.eval_every == 0 or step == cfg.steps):
            last_eval = run_eval(step)
            metrics.write(last_eval)
        if step % cfg.save_every == 0 or step == cfg.steps:
            _save(ckpt_path, step, model, opt, sched, ref_model, dist)
        if bar is not None:
            post = {"k": record["k"], "reward": f"{record['reward_mean']:.3f}",
                    "solved": f"{record['solved_frac']:.3f}", "loss": f"{record['loss']:.3g}"}
            if last_eval:
                post["pass@1"] = f"{last_eval['pass@1']:.3f}"
            bar.set_postfix(post)
            bar.update(1)
        elif step % cfg.log_every == 0 or step == cfg.steps:
            log(f"step {step}/{cfg.steps} k={record['k']} reward {record['reward_mean']:.3f} "
                f"solved {record['solved_frac']:.3f} loss {record['loss']:.4g} "
                f"({record['step_seconds']:.2f} s/step)"
                + (f" | eval pass@1 {last_eval['pass@1']:.3f}" if last_eval else ""))
    if bar is not None:
        bar.close()
    if dist.enabled:  # gradient averaging must have kept every rank's weights identical
        sums = dist.all_gather_objects(sum(float(p.detach().double().sum()) for p in model.parameters()))
        if len(set(sums)) != 1:
            raise RuntimeError(f"ranks diverged: parameter sums {sums}")
    summary = {}
    if dist.is_main:
        from . import report

        if cfg.export:
            export_model(model, tokenizer, os.path.join(cfg.out, "final_model"))
        summary = report.finish(cfg.out, metrics.read(), vars(cfg), plots=cfg.plots)
        print(report.summary_table(summary), flush=True)
    task.close()
    dist.close()  # its last barrier waits for every rank
    return summary


def _save(path, step, model, opt, sched, ref_model, dist: Dist):
    rngs = dist.all_gather_objects(ckpt.rng_state())
    if dist.is_main:
        state = {"step": step, "model": model.state_dict(), "optimizer": opt.state_dict(),
                 "scheduler": sched.state_dict(), "rng": rngs, "world_size": dist.world}
        if ref_model is not None:
            state["ref_model"] = ref_model.state_dict()
        ckpt.atomic_save(state, path, halfway=lambda: _fault("checkpoint-write", step))
    dist.barrier()

