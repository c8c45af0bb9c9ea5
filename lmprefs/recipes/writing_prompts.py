"""`lmprefs experiment writing-prompts`: the later writing-prompts recipe built on the original's (RLHF for Reddit's
r/WritingPrompts: a supervised baseline, a reward model learned from people's scores of the stories, then PPO from
the supervised model with a separate value model), end to end on a JSONL of `{prompt, response, score}`.

Without `--data` it runs an offline demo in which everything stands in for Reddit (docs/tasks.md):
passages of Jane Austen's novels are the prompts, continuations sampled from the initial model (SmolLM2-135M) at
temperature 1 are the stories people wrote for them, and VADER's compound sentiment of each continuation is its
score. The same VADER is the true reward of the final evaluation.

Stages, each recorded in results.json when it is done, so an interrupted run picks up where it stopped (the SFT and
PPO stages also resume from their own checkpoints):
 1. data      the scores imported into the run's label store as scalar_rating labels (a bad row: one line naming the
              file, the line and the field; nothing stored); prompts.jsonl (each prompt once: PPO's queries) and
              sft.jsonl (the top-scored response of each prompt)
 2. sft       train-sft on sft.jsonl -> sft/sft_model
 3. reward    a reward model from the scores (labels.scores_as: regress them or compare them within a prompt),
              on the SFT model -> reward_model/
 4. ppo       train-policy from the SFT model, which is also its reference, against that reward model; the value
              model as ppo.value_model says (the preset: separate, with its own optimizer) -> ppo/policy
 5. evaluate  the SFT and the PPO policy on the same held-out prompts (the true reward when there is one) -> report.md
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from pathlib import Path

from lmprefs.config import Config
from lmprefs.data.tasks import decode, response_texts, show
from lmprefs.errors import UserError
from lmprefs.io.atomic import atomic_write_text, crash_point
from lmprefs.labels.formats import LabelFileError, import_file
from lmprefs.labels.labelers import SCORE_FNS
from lmprefs.models.artifacts import load_policy
from lmprefs.models.sampling import sampler_options
from lmprefs.pipeline.evaluation import evaluate_policy
from lmprefs.pipeline.labeling import open_store
from lmprefs.pipeline.policy import run_train_policy
from lmprefs.pipeline.reward_model import reward_logger
from lmprefs.pipeline.reward_training import train_reward_model
from lmprefs.pipeline.rewards import reward_function
from lmprefs.pipeline.task import Task, setup_task
from lmprefs.runtime.runlog import RunLogger, progress
from lmprefs.training.reward import sample_comparisons
from lmprefs.training.sft import checkpoint_step, resume_log_step, train_sft

R = dataclasses.replace
STAGES = ("data", "sft", "reward", "ppo", "evaluate")


def demo_data(cfg: Config, out: Path, n_prompts: int, per_prompt: int, true_fn) -> dict:
    """The offline demo's {prompt, response, score} JSONL: `n_prompts` Austen passages (cut at sentence ends, at most
    task.query_length tokens), `per_prompt` continuations of each sampled from task.initial_model at temperature 1,
    each scored by `true_fn` (VADER)."""
    import torch

    task = R(cfg.task, query_dataset="austen", start_text=".", end_text=".", temperature=1.0)
    t = setup_task(R(cfg, task=task), n_heldout=0)
    if len(t.train_queries) < n_prompts:
        raise UserError(f"--demo-prompts {n_prompts}: the Austen asset gives only {len(t.train_queries)} prompts")
    pick = torch.randperm(len(t.train_queries), generator=torch.Generator().manual_seed(cfg.run.seed + 23))
    queries = t.train_queries[pick[:n_prompts]]
    gen = torch.Generator(device=t.device).manual_seed(cfg.run.seed + 29)
    bar = progress(n_prompts, "demo data: sampling stories")
    samples, _ = sample_comparisons(t.model, t.tok, queries, task, t.ctx, per_prompt,
                                    batch_size=cfg.train_reward.rollout_batch_size, gen=gen, on_batch=bar.update,
                                    sampler=sampler_options(cfg.run))  # fmt: skip
    bar.close()
    prompts = decode(t.tok, queries)
    responses = response_texts(t.tok, samples.flatten(0, 1), task)
    scores = [float(x) for x in true_fn(responses)]
    rows = [{"prompt": prompts[i // per_prompt], "response": r, "score": round(s, 4)}
            for i, (r, s) in enumerate(zip(responses, scores, strict=True))]  # fmt: skip
    atomic_write_text(out, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    return {"prompts": n_prompts, "responses": len(rows)}


def prepare_data(store, data: Path, run_dir: Path) -> dict:
    """Import the scores (atomically: a bad row refuses the whole file) and write prompts.jsonl and sft.jsonl."""

    try:
        import_file(store, data, format="scores")
    except LabelFileError as err:
        raise UserError(str(err)) from None
    examples = store.labeled_examples("scalar_rating")
    best: dict[str, tuple[float, str]] = {}  # prompt -> (score, response) of its top-scored response, first on ties
    for e in examples:
        if e.query not in best or e.score > best[e.query][0]:
            best[e.query] = (e.score, e.samples[0])
    atomic_write_text(run_dir / "prompts.jsonl", "".join(json.dumps({"text": p}) + "\n" for p in best))
    atomic_write_text(run_dir / "sft.jsonl", "".join(json.dumps({"prompt": p, "response": r}) + "\n"
                                                     for p, (_, r) in best.items()))  # fmt: skip
    scores = [e.score for e in examples]
    mean = sum(scores) / len(scores)
    return {"file": str(data), "prompts": len(best), "responses": len(examples), "score_mean": mean,
            "score_std": math.sqrt(sum((s - mean) ** 2 for s in scores) / len(scores))}  # fmt: skip


class _Stages:
    """results.json of a run: each stage's figures, written atomically when the stage ends, so a rerun skips the
    stages that are done."""

    def __init__(self, run_dir: Path):
        self.path = run_dir / "results.json"
        self.results = json.loads(self.path.read_text()) if self.path.exists() else {}

    def todo(self, stage: str) -> bool:
        return stage not in self.results

    def done(self, stage: str, value: dict, start: float) -> None:
        self.results[stage] = {**value, "seconds": round(time.time() - start, 1)}
        atomic_write_text(self.path, json.dumps(self.results, indent=1))
        crash_point(f"writing:{stage}")


def run_writing_prompts(cfg: Config, run_dir: Path, *, data: str | None = None, true_reward: str | None = None,
                        n_eval: int = 64, eval_samples: int = 2, demo_prompts: int = 256,
                        demo_per_prompt: int = 4) -> dict:  # fmt: skip
    """The whole pipeline in `run_dir` (module docstring); an existing run_dir resumes. `data`: the scores JSONL
    (None: the offline demo, whose true reward is VADER); `true_reward`: a reward on response texts to evaluate
    with (vader, descriptiveness, module:function), if any. -> {"results", "report"}."""
    run_dir.mkdir(parents=True, exist_ok=True)
    stages = _Stages(run_dir)
    if data is None and true_reward is None:
        true_reward = "vader"  # the demo's scores are VADER's: it is also the true reward
    true_name, true_fn = reward_function(true_reward) if true_reward else (None, None)
    store = open_store(run_dir / "labels.sqlite")
    _data_stage(stages, cfg, store, run_dir, data, demo_prompts, demo_per_prompt)
    sft_model = _sft_stage(stages, cfg, run_dir)
    # from here on the SFT model is the initial model: of the reward model, of the policy and its reference
    base = cfg.task.initial_model
    cfg = R(cfg, task=R(cfg.task, query_dataset=str(run_dir / "prompts.jsonl"), initial_model=str(sft_model)))
    rm_dir = _reward_stage(stages, cfg, store, run_dir, n_eval)
    ppo_cfg = R(cfg, rewards=R(cfg.rewards, trained_model=str(rm_dir)))
    ppo_dir = run_dir / "ppo"
    t = _ppo_stage(stages, ppo_cfg, ppo_dir, n_eval, true_name)
    if stages.todo("evaluate"):
        s = time.time()
        ev = evaluate_both(ppo_cfg, ppo_dir, t, n_eval, eval_samples, true_fn)
        atomic_write_text(run_dir / "samples.json", json.dumps(ev.pop("samples"), indent=1, ensure_ascii=False))
        stages.done("evaluate", ev, s)
    report = write_report(run_dir, ppo_cfg, stages.results, true_name, base)
    return {"results": stages.results, "report": report}


def _data_stage(stages: _Stages, cfg: Config, store, run_dir: Path, data: str | None, demo_prompts: int,
                demo_per_prompt: int) -> None:  # fmt: skip
    if stages.todo("data"):
        s = time.time()
        if data is None:
            print(f"[1/5] demo data: {demo_prompts} Austen passages x {demo_per_prompt} sampled continuations, "
                  "scored by VADER (stand-ins for Reddit's prompts, stories and scores)", flush=True)  # fmt: skip
            demo_data(cfg, run_dir / "data.jsonl", demo_prompts, demo_per_prompt, SCORE_FNS["vader"])
            data = str(run_dir / "data.jsonl")
        else:
            print(f"[1/5] importing the scores of {data}", flush=True)
        stages.done("data", prepare_data(store, Path(data), run_dir), s)
    d = stages.results["data"]
    print(f"      {d['responses']} scored responses to {d['prompts']} prompts (score {d['score_mean']:+.3f} +/- "
          f"{d['score_std']:.3f})", flush=True)  # fmt: skip


def _sft_stage(stages: _Stages, cfg: Config, run_dir: Path) -> Path:
    """The supervised baseline, trained (or resumed) into RUN/sft/sft_model."""
    sft_run = run_dir / "sft"
    sft_model = sft_run / "sft_model"
    if stages.todo("sft"):
        s = time.time()
        sft_cfg = R(cfg, sft=R(cfg.sft, data=str(run_dir / "sft.jsonl")))
        resume = checkpoint_step(sft_run) is not None
        print(f"[2/5] supervised baseline: {'resuming ' if resume else ''}train-sft on the top-scored response of "
              f"each prompt", flush=True)  # fmt: skip
        sft_run.mkdir(parents=True, exist_ok=True)
        log = RunLogger(sft_run, sft_cfg, resume_step=resume_log_step(sft_run) if resume else None,
                        resume_phase="sft")  # fmt: skip
        try:
            summary = train_sft(sft_cfg, sft_model, log, run_dir=sft_run, resume=resume)
        finally:
            log.close()
        stages.done("sft", {k.removeprefix("sft/"): v for k, v in summary.items()}, s)
    sft = stages.results["sft"]
    print(f"      SFT response loss {sft['initial_loss']:.3f} -> {sft['final_loss']:.3f} nats/token", flush=True)
    return sft_model


def _reward_stage(stages: _Stages, cfg: Config, store, run_dir: Path, n_eval: int) -> Path:
    """The reward model from the scores, into RUN/reward_model."""
    rm_dir = run_dir / "reward_model"
    if stages.todo("reward"):
        s = time.time()
        print(f"[3/5] reward model from the scores (labels.scores_as={cfg.labels.scores_as})", flush=True)
        log = reward_logger(run_dir, cfg)
        try:
            _, summary = train_reward_model(setup_task(cfg, n_eval), store, rm_dir, log)
        finally:
            log.close()
        keep = ("labels_train", "labels_heldout", "heldout/accuracy", "heldout/pairs", "heldout/loss", "heldout/corr",
                "initial_heldout/accuracy", "initial_heldout/loss")  # fmt: skip
        stages.done("reward", {k: summary[k] for k in keep if k in summary}, s)
    r = stages.results["reward"]
    print(f"      held-out pair accuracy {r.get('heldout/accuracy', float('nan')):.3f} (before training "
          f"{r.get('initial_heldout/accuracy', float('nan')):.3f}; {r.get('heldout/pairs', r['labels_heldout'])} "
          "held-out pairs)", flush=True)  # fmt: skip
    return rm_dir


def _ppo_stage(stages: _Stages, ppo_cfg: Config, ppo_dir: Path, n_eval: int, true_name: str | None):
    """PPO from the SFT model against the reward model; the task it set up (None when the stage was done before)."""
    t = None
    if stages.todo("ppo"):
        s = time.time()
        resume = (ppo_dir / "run.json").is_file()
        print(f"[4/5] PPO from the SFT model ({'resuming, ' if resume else ''}{ppo_cfg.ppo.num_updates} updates of "
              f"{ppo_cfg.ppo.batch_size}; value model: {ppo_cfg.ppo.value_model})", flush=True)  # fmt: skip
        t = setup_task(ppo_cfg, n_eval)
        out = run_train_policy(ppo_cfg, ppo_dir, resume=resume, t=t, true_reward=true_name
                               if true_name in SCORE_FNS else None)  # fmt: skip
        st = out["stats"]
        keep = ("objective/score", "objective/kl", "objective/kl_coef", "ppo/val/var_explained")
        stages.done("ppo", {k: st[k] for k in keep if k in st}, s)
    p = stages.results["ppo"]
    print(f"      last batch: score {p['objective/score']:+.3f}, KL {p['objective/kl']:.2f} nats, beta "
          f"{p['objective/kl_coef']:.3f}", flush=True)  # fmt: skip
    return t


def evaluate_both(cfg: Config, ppo_dir: Path, t, n_eval: int, samples: int, true_fn) -> dict:
    """The true reward (if any) and the KL from the SFT model of the SFT and the PPO policy, on the same held-out
    prompts with the same seed; the first sample of each prompt for the report."""

    t = t or setup_task(cfg, n_eval)
    heldout = t.heldout_queries[:n_eval]  # the task may set aside fewer than n_eval
    print(f"[5/5] evaluating the SFT and the PPO policy on {len(heldout)} held-out prompts", flush=True)
    fn = true_fn or (lambda texts: [0.0] * len(texts))
    sft = evaluate_policy(t, heldout, fn, None, samples, cfg.run.seed + 5, desc="SFT policy")
    policy = load_policy(ppo_dir / "policy", t.device)
    final = Task(**{**t.__dict__, "model": policy.lm})
    ppo = evaluate_policy(final, heldout, fn, None, samples, cfg.run.seed + 5, desc="PPO policy", ref_model=t.model)
    out = {"n_queries": ppo["n_queries"], "samples_per_query": samples, "kl_ppo": ppo["kl"],
           "kl_ppo_stderr": ppo["kl_stderr"]}  # fmt: skip
    if true_fn is not None:
        diff = [a - b for a, b in zip(ppo["per_query"], sft["per_query"], strict=True)]
        m = sum(diff) / len(diff)
        se = math.sqrt(sum((x - m) ** 2 for x in diff) / (len(diff) - 1) / len(diff)) if len(diff) > 1 else math.nan
        out |= {"true_sft": sft["mean"], "true_sft_stderr": sft["stderr"], "true_ppo": ppo["mean"],
                "true_ppo_stderr": ppo["stderr"], "gain": m, "gain_stderr": se}  # fmt: skip
    prompts = decode(t.tok, heldout)
    first = [[row[0] for row in e["scores"]] for e in (sft, ppo)]  # each shown sample's own score
    out["samples"] = [{"prompt": q, "sft": a, "ppo": b, "sft_true": x, "ppo_true": y} for q, a, b, x, y in
                      zip(prompts, sft["texts"], ppo["texts"], *first, strict=True)]
    return out


def write_report(run_dir: Path, cfg: Config, results: dict, true_name: str | None, base: str) -> Path:
    d, sft, rm, ppo, ev = (results[k] for k in STAGES)
    corr = f", score correlation {rm['heldout/corr']:.3f}" if "heldout/corr" in rm else ""
    lines = ["# lmprefs writing-prompts", "",
             f"Data `{d['file']}`: {d['responses']} scored responses to {d['prompts']} prompts (score mean "
             f"{d['score_mean']:+.3f}, std {d['score_std']:.3f}). Initial model `{base}`"
             f"; reward model from scores as `{cfg.labels.scores_as}`; value model `{cfg.ppo.value_model}`.", "",
             "| stage | figure | seconds |", "|---|---|---|", f"| data | | {d['seconds']:.0f} |",
             f"| SFT on the top-scored response of each prompt | response loss {sft['initial_loss']:.3f} -> "
             f"{sft['final_loss']:.3f} nats/token ({sft['pairs']} pairs, {sft['steps']} steps) | "
             f"{sft['seconds']:.0f} |",
             f"| reward model | held-out pair accuracy {rm.get('heldout/accuracy', math.nan):.3f} (before training "
             f"{rm.get('initial_heldout/accuracy', math.nan):.3f}; {rm.get('heldout/pairs', rm['labels_heldout'])} "
             f"pairs){corr} | "
             f"{rm['seconds']:.0f} |",
             f"| PPO ({cfg.ppo.num_updates} updates of {cfg.ppo.batch_size}) | last batch: score "
             f"{ppo['objective/score']:+.3f}, KL {ppo['objective/kl']:.2f}, beta {ppo['objective/kl_coef']:.3f} | "
             f"{ppo['seconds']:.0f} |",
             f"| evaluation ({ev['n_queries']} held-out prompts x {ev['samples_per_query']}) | KL of the PPO policy "
             f"from the SFT model {ev['kl_ppo']:.2f} +/- {ev['kl_ppo_stderr']:.2f} nats | {ev['seconds']:.0f} |",
             f"| total | | {sum(results[k]['seconds'] for k in STAGES):.0f} |", ""]  # fmt: skip
    if "true_ppo" in ev:
        se = ev["gain_stderr"]
        lines += [f"True reward ({true_name}) on the held-out prompts: SFT {ev['true_sft']:+.4f} +/- "
                  f"{ev['true_sft_stderr']:.4f}, PPO {ev['true_ppo']:+.4f} +/- {ev['true_ppo_stderr']:.4f}; "
                  f"gain {ev['gain']:+.4f} +/- {se:.4f} ({ev['gain'] / se if se > 0 else math.nan:+.1f} standard "
                  "errors, paired by prompt).", ""]  # fmt: skip
    lines += ["## Samples on the same held-out prompts", ""]
    for row in json.loads((run_dir / "samples.json").read_text())[:8]:
        a, b = (f" ({row[k]:+.3f})" if true_name else "" for k in ("sft_true", "ppo_true"))
        lines += [f"**Prompt:** {show(row['prompt'])}", "", f"- SFT{a}: {show(row['sft'])}",
                  f"- PPO{b}: {show(row['ppo'])}", ""]  # fmt: skip
    path = run_dir / "report.md"
    atomic_write_text(path, "\n".join(lines))
    return path
