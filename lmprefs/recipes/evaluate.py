"""`lmprefs evaluate`: a trained policy on held-out prompts beside its reference (the initial model it started from):
the reward of each, a reward function's (the true reward) or a reward model's score (the proxy), as mean +/- s.e.
over queries, and the policy's KL from the reference with its s.e.; report.md, results.json, samples.jsonl and
evaluation.png in the output directory.

The policy is a run directory (train-policy, quickstart, train-dpo: RUN/policy; train-sft: RUN/sft_model), evaluated
with the run's own config, or a saved model directory (an lmprefs policy or a Hugging Face causal LM) with a
preset's. Everything is checked before the output directory is made."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import types
from dataclasses import dataclass
from pathlib import Path

from lmprefs.config import Config
from lmprefs.data.hf_datasets import split_spec
from lmprefs.data.queries import build_queries, load_texts
from lmprefs.data.tasks import decode, show
from lmprefs.errors import UserError
from lmprefs.io.atomic import atomic_write_text
from lmprefs.io.inputs import input_dir, lm_dir
from lmprefs.models.artifacts import adapter_base, load_policy, load_reward_model
from lmprefs.models.ensemble import is_ensemble_dir, is_reward_dir, load_reward_ensemble, read_manifest
from lmprefs.models.loading import load_lm
from lmprefs.pipeline.evaluation import evaluate_model
from lmprefs.pipeline.rewards import check_same_tokenizer, normalize_foreign, reward_function
from lmprefs.pipeline.task import HELDOUT_QUERIES, Task, setup_task
from lmprefs.runtime.resolve import resolve_config

POLICY_DIRS = ("policy", "sft_model")  # where a run keeps its trained policy: train-policy/quickstart/dpo, train-sft
DEFAULT_EVAL_QUERIES = 256
BUILTIN_QUERIES = ("austen", "lee-news", "bundled")  # query datasets named, not files (data.queries.load_texts)


@dataclass
class Target:
    """What `lmprefs evaluate` was pointed at: the config it runs with, the policy's directory and the reference."""

    cfg: Config
    policy_dir: Path
    run_dir: Path | None
    reference: str


def _is_run_dir(path: Path) -> bool:
    try:
        d = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(d, dict) and "task" in d and "ppo" in d


MODEL_PRESET = "austen-sentiment"  # the config of a saved model directory evaluated without --preset


def resolve_target(given: str, preset: str | None, pairs, reference: str | None) -> Target:
    """The run or model directory `given` as a Target: a run directory (or a policy inside one) with the run's
    config, its policy and its initial model as the reference; a saved model directory with the preset's config
    (None: MODEL_PRESET) and its base (an adapter's base model, else the preset's task.initial_model) as the
    reference. A preset given for a run is refused: the run's own config would silently replace it."""
    path = input_dir(given, "RUN_OR_MODEL", "run or model directory")
    run = path if _is_run_dir(path) else path.parent if path.name in POLICY_DIRS and _is_run_dir(path.parent) else None
    if run is not None and preset is not None:
        raise UserError(f"--preset {preset}: {run} is a run directory with its own config ({run / 'config.json'}); "
                        "drop --preset")  # fmt: skip
    if run is not None:
        cfg = resolve_config("", pairs, config_file=run / "config.json")
        policy_dir = path if run != path else next((run / d for d in POLICY_DIRS if (run / d).is_dir()), None)
        if policy_dir is None:
            raise UserError(f"RUN_OR_MODEL {given}: the run holds no trained policy yet (no "
                            f"{' or '.join(POLICY_DIRS)}/)")  # fmt: skip
        return Target(cfg, policy_dir, run, reference or cfg.task.initial_model)
    if not ((path / "lmprefs.json").is_file() or (path / "config.json").is_file() or (path / "adapter").is_dir()):
        raise UserError(f"RUN_OR_MODEL {given}: neither a run directory (no config.json of a run) nor a saved model "
                        "(no lmprefs.json or config.json)")  # fmt: skip
    cfg = resolve_config(preset or MODEL_PRESET, pairs)
    base = cfg.task.initial_model
    if (path / "adapter" / "adapter_config.json").is_file():
        base = adapter_base(path / "adapter", path) or base
    return Target(cfg, path, None, reference or base)


def load_evaluated(target: Target, device):
    """The policy to evaluate as evaluate_model takes it (.lm, .adapter) and its tokenizer."""
    meta = target.policy_dir / "lmprefs.json"
    if meta.is_file() and json.loads(meta.read_text()).get("kind") == "policy":  # else a plain LM, e.g. train-sft's
        p = load_policy(target.policy_dir, device)
        return types.SimpleNamespace(lm=p.lm, adapter=None), p.tokenizer
    lm, tok = load_lm(str(target.policy_dir), device)
    return types.SimpleNamespace(lm=lm, adapter=None), tok


def setup_reference(target: Target, given: bool) -> Task:
    """The task with the reference as its model (the initial policy of evaluate_model), or one line naming the
    reference and where it came from (`given`: --reference, else the run's or the preset's task.initial_model)."""
    from lmprefs.assets.cache import AssetError

    cfg = dataclasses.replace(target.cfg, task=dataclasses.replace(target.cfg.task, initial_model=target.reference))
    try:
        return setup_task(cfg, HELDOUT_QUERIES)
    except AssetError as e:
        where = "--reference" if given else "the reference (task.initial_model)"
        raise UserError(f"{where} {target.reference}: {e}") from None


def text_reward(name: str):
    """(name, fn) of --reward NAME: a reward on texts (vader, descriptiveness, module:function)."""
    if name == "model":
        raise UserError("--reward model: evaluate takes a reward model as --reward-model DIR")
    try:
        return reward_function(name)
    except UserError as e:
        raise UserError(str(e).replace("choose model, ", "choose ", 1)) from None


def check_reward_model_dir(given: str) -> Path:
    path = input_dir(given, "--reward-model", "reward-model directory")
    if not is_reward_dir(path):
        raise UserError(f"--reward-model {given}: not a reward-model directory (no sequence classifier with "
                        "num_labels=1) nor a reward-model ensemble (no ensemble.json)")  # fmt: skip
    return path


def scoring_model(t: Task, path: Path):
    """The reward model in `path` on t's device, normalized as train-policy would use it (rewards.normalize) when
    lmprefs did not train it; says which. An ensemble scores by its members' mean (each normalized in training)."""
    if is_ensemble_dir(path):
        check_same_tokenizer(path / read_manifest(path)["members"][0], t.tok, f"--reward-model {path}")
        ens = load_reward_ensemble(path, t.device).eval().requires_grad_(False)
        print(f"--reward-model {path}: an ensemble of {len(ens)} reward models trained by lmprefs, each normalized "
              "when it was trained; scored by their mean", flush=True)  # fmt: skip
        return ens
    check_same_tokenizer(path, t.tok, f"--reward-model {path}")
    rm = load_reward_model(path, t.device).eval().requires_grad_(False)
    if (path / "lmprefs.json").is_file():
        print(f"--reward-model {path}: trained by lmprefs, normalized when it was trained (mean 0, std 1 on its "
              "initial policy's samples)", flush=True)  # fmt: skip
    else:
        normalize_foreign(t, rm, path, what=f"--reward-model {path}")
    return rm


def eval_queries(t: Task, queries_file: str | None, n: int | None):
    """(the first n evaluation queries, where they come from): the task's held-out queries, or --queries FILE's
    prompts read as task.query_dataset reads them."""
    if queries_file is None:
        pool, where = t.heldout_queries, f"held-out queries of task.query_dataset={t.cfg.task.query_dataset!r}"
    else:
        try:
            pool = build_queries(load_texts(queries_file), t.tok,
                                 dataclasses.replace(t.cfg.task, query_dataset=queries_file))  # it decides cropping
        except UserError as e:
            raise UserError(str(e).replace(f"task.query_dataset={queries_file!r}", f"--queries {queries_file}")
                            .replace("task.query_dataset", "--queries")) from None  # fmt: skip
        where = f"--queries {queries_file}"
    n = min(DEFAULT_EVAL_QUERIES, len(pool)) if n is None else n
    if n > len(pool) or n < 2:
        has = (f"task.query_dataset={t.cfg.task.query_dataset!r} sets aside only {len(pool)} held-out queries"
               if queries_file is None else f"--queries {queries_file} gives only {len(pool)} queries")
        raise UserError(f"--eval-queries {n}: {has}" if n >= 2 else f"{has}; an s.e. over queries needs 2")
    return pool[:n], where


def check_inputs(target_dir: str, reward: str | None, reward_model: str | None, queries: str | None,
                 eval_queries: int | None, eval_samples: int, reference: str | None = None) -> None:  # fmt: skip
    """What can be checked before any model loads."""
    if (reward is None) == (reward_model is None):
        raise UserError("give one of --reward NAME (vader, descriptiveness, module:function: the true reward) or "
                        "--reward-model DIR (a reward model's score: the proxy)" +
                        (f", not both (--reward {reward}, --reward-model {reward_model})" if reward else ""))
    if eval_queries is not None and eval_queries < 2:
        raise UserError(f"--eval-queries {eval_queries}: must be at least 2 (an s.e. over queries)")
    if eval_samples < 1:
        raise UserError(f"--eval-samples {eval_samples}: must be at least 1")
    if reward is not None:
        text_reward(reward)
    if reward_model is not None:
        check_reward_model_dir(reward_model)
    if queries is not None and not (queries in BUILTIN_QUERIES or queries.startswith("hf:")):
        if not split_spec(queries)[0].exists():
            raise UserError(f"--queries {queries} does not exist")
    path = input_dir(target_dir, "RUN_OR_MODEL", "run or model directory")
    if not _is_run_dir(path):
        lm_dir(target_dir, "RUN_OR_MODEL ")
    if reference is not None and reference.startswith(("/", ".", "~")):  # a path, not an asset or hub name
        input_dir(os.path.expanduser(reference), "--reference", "model directory")
    if reference is not None:
        lm_dir(reference, "--reference ")



def evaluate(target: Target, reward: str | None, reward_model: str | None, queries_file: str | None,
             n_eval: int | None, samples: int, out: Path, *, reference_given: bool = False,
             before_write=None) -> dict:  # fmt: skip
    """Evaluate target's policy and its reference on the same queries with the same seed; write the report into
    `out`. Every input is checked before `out` is made, and `before_write()` is called once the evaluation is done,
    before its first file: an evaluation that fails (a reward function that raises, say) leaves nothing behind."""
    t = setup_reference(target, given=reference_given)
    qs, where = eval_queries(t, queries_file, n_eval)
    policy, tok = load_evaluated(target, t.device)
    if tok.get_vocab() != t.tok.get_vocab():
        raise UserError(f"--reference {target.reference}: its tokenizer ({len(t.tok)} tokens) differs from the "
                        f"policy's in {target.policy_dir} ({len(tok)} tokens)")  # fmt: skip
    if reward_model is not None:
        name, fn = f"reward model {reward_model}", scoring_model(t, Path(reward_model))
    else:
        name, fn = text_reward(reward or "")
    seed = target.cfg.run.seed + 5  # the quickstart's and the experiments' evaluation seed
    ref = evaluate_model(t, None, qs, fn, samples, seed, "reference")
    pol = evaluate_model(t, policy, qs, fn, samples, seed, "policy")
    diff = [a - b for a, b in zip(pol["per_query"], ref["per_query"], strict=True)]
    gain = sum(diff) / len(diff)
    gain_se = math.sqrt(sum((d - gain) ** 2 for d in diff) / (len(diff) - 1) / len(diff))
    summary = {"policy": str(target.policy_dir), "run": str(target.run_dir) if target.run_dir else None,
               "reference": target.reference, "reward": name, "kind": "proxy" if reward_model else "true",
               "queries": where, "n_queries": len(qs), "samples_per_query": samples, "seed": seed,
               "reference_eval": _figures(ref), "policy_eval": _figures(pol),
               "difference": {"mean": gain, "stderr": gain_se}}  # fmt: skip
    if before_write is not None:
        before_write()
    out.mkdir(parents=True, exist_ok=True)
    write_outputs(out, summary, ref, pol, decode(t.tok, qs))
    return summary


def _figures(e: dict) -> dict:
    return {k: e[k] for k in ("mean", "stderr", "kl", "kl_stderr")}


def write_outputs(out: Path, summary: dict, ref: dict, pol: dict, query_texts: list[str]) -> None:
    """results.json, samples.jsonl (per query: the first sample of each and every sample's reward), evaluation.png
    and report.md."""
    atomic_write_text(out / "results.json", json.dumps(summary, indent=1))
    rows = [{"query": q, "reference": ref["texts"][i], "policy": pol["texts"][i],
             "reference_rewards": ref["scores"][i], "policy_rewards": pol["scores"][i]}
            for i, q in enumerate(query_texts)]  # fmt: skip
    atomic_write_text(out / "samples.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    plot_evaluation(out / "evaluation.png", summary)
    atomic_write_text(out / "report.md", report_text(summary, rows))


def report_text(s: dict, rows: list[dict], n_shown: int = 8) -> str:
    r, p, d = s["reference_eval"], s["policy_eval"], s["difference"]
    z = d["mean"] / d["stderr"] if d["stderr"] > 0 else float("nan")
    what = "true reward" if s["kind"] == "true" else "proxy: the reward model's score"
    lines = [
        f"# lmprefs evaluate: {s['policy']}", "",
        f"Policy `{s['policy']}` against its reference `{s['reference']}` on {s['n_queries']} {s['queries']}, "
        f"{s['samples_per_query']} samples per query (seed {s['seed']}); reward: {s['reward']} ({what}).", "",
        "| policy | reward (mean +/- s.e. over queries) | KL from the reference, nats (mean +/- s.e. over samples) |",
        "|---|---|---|",
        f"| reference | {r['mean']:+.4f} +/- {r['stderr']:.4f} | {r['kl']:.3f} +/- {r['kl_stderr']:.3f} |",
        f"| policy | {p['mean']:+.4f} +/- {p['stderr']:.4f} | {p['kl']:.3f} +/- {p['kl_stderr']:.3f} |",
        f"| policy - reference (paired over queries) | {d['mean']:+.4f} +/- {d['stderr']:.4f} ({z:+.1f} s.e.) | |",
        "", "![reward and KL](evaluation.png)", "",
        "## Samples, reference and policy, same queries", "",
        "Each one's first sample for the query, with its own reward; every query in samples.jsonl.", "",
    ]  # fmt: skip
    for row in rows[:n_shown]:
        lines += [f"**Query:** {show(row['query'])}", "",
                  f"- reference ({row['reference_rewards'][0]:+.3f}): {show(row['reference'])}",
                  f"- policy ({row['policy_rewards'][0]:+.3f}): {show(row['policy'])}", ""]  # fmt: skip
    return "\n".join(lines)


def plot_evaluation(path: Path, s: dict) -> None:
    """Left: the reward of the reference and the policy, mean +/- s.e. over queries; right: their KL from the
    reference, mean +/- s.e. over samples."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names, figs = ["reference", "policy"], [s["reference_eval"], s["policy_eval"]]
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(9, 3.8))
    ax.bar(names, [f["mean"] for f in figs], yerr=[f["stderr"] for f in figs], capsize=5, color=["grey", "tab:blue"])
    ax.set_title(f"{'true reward' if s['kind'] == 'true' else 'reward-model score'}\n{s['reward']}", fontsize=9)
    bx.bar(names, [f["kl"] for f in figs], yerr=[f["kl_stderr"] for f in figs], capsize=5, color=["grey", "tab:blue"])
    bx.set_title("KL from the reference, nats", fontsize=9)
    for a in (ax, bx):
        a.grid(alpha=0.3, axis="y")
    fig.suptitle(f"{s['n_queries']} queries x {s['samples_per_query']} samples, mean +/- s.e.", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
