"""`lmprefs experiment mock-sentiment`: the paper's Figure 2 at small scale. Policies trained against reward models
learned from different numbers of simulated labels, and one with direct access to the true reward, all with the
same KL target, compared by the true reward on held-out queries and plotted on one figure.

Every stage leaves a marker in the run directory, so an interrupted experiment picks up where it stopped: the label
store is filled once (idempotently), each arm is a train-policy run that resumes from its checkpoint, and finished
arms are skipped.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

from lmprefs.config import Config
from lmprefs.overrides import atomic_write_text

R = dataclasses.replace


def _eval(t, adapter, model, n_eval, samples, cfg, true_fn, desc):
    from lmprefs.pipeline import Task
    from lmprefs.quickstart import evaluate_policy

    task = t if model is None else Task(**{**t.__dict__, "model": model})
    e = evaluate_policy(task, t.heldout_queries[:n_eval], true_fn, adapter, samples, cfg.run.seed + 5, desc=desc)
    return {k: e[k] for k in ("mean", "stderr", "n_queries", "samples_per_query")}


def run_mock_sentiment(cfg: Config, run_dir: Path, label_counts: list[int], n_eval: int, samples: int) -> dict:
    from lmprefs.labels.labelers import score_fn
    from lmprefs.pipeline import collect_labels, open_store, run_train_policy, setup_task

    run_dir.mkdir(parents=True, exist_ok=True)
    true_name = cfg.labels.labeler
    true_fn = score_fn(true_name)
    results_path = run_dir / "results.json"
    results = json.loads(results_path.read_text()) if results_path.exists() else {}

    def save(key, value):
        results[key] = value
        atomic_write_text(results_path, json.dumps(results, indent=1))

    store_path = run_dir / "labels.sqlite"
    n_questions = math.ceil(max(label_counts) / (1 - cfg.labels.heldout_fraction))
    if "labels" not in results:
        print(f"[labels] sampling and labeling {n_questions} questions with {true_name}", flush=True)
        out = collect_labels(setup_task(cfg, n_eval), open_store(store_path), n_questions, source="experiment")
        save("labels", {"questions": n_questions, "seconds": out["seconds"]})
    if "initial" not in results:
        print("[initial] evaluating the initial policy", flush=True)
        t = setup_task(cfg, n_eval)
        save("initial", _eval(t, None, None, n_eval, samples, cfg, true_fn, "initial policy"))

    arms = [(f"rm-{n}", n, None) for n in label_counts] + [("direct", None, true_name)]
    for name, n, reward in arms:
        if name in results:
            print(f"[{name}] done: {results[name]['mean']:+.4f}", flush=True)
            continue
        arm_dir = run_dir / name
        arm_cfg = cfg if n is None else R(cfg, labels=R(cfg.labels, num_train=n))
        resume = (arm_dir / "run.json").is_file()  # begun before: resume (from its checkpoint, or over)
        print(f"[{name}] {'resuming' if resume else 'training'} ({'true reward' if reward else f'{n} labels'})",
              flush=True)  # fmt: skip
        t = setup_task(arm_cfg, n_eval)  # a fresh model per arm: adapters must not carry over between arms
        out = run_train_policy(arm_cfg, arm_dir, reward=reward, store_path=str(store_path), resume=resume, t=t,
                               true_reward=true_name)  # fmt: skip
        policy = out["run"].policy
        ev = _eval(t, policy.adapter, None if policy.adapter else policy.lm, n_eval, samples, cfg, true_fn, name)
        save(name, {**ev, "labels": n, "reward": reward or "model"})
    fig = plot_arms(run_dir, [a[0] for a in arms], results)
    return {"results": results, "figure": fig}


def plot_arms(run_dir: Path, names: list[str], results: dict) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from lmprefs.runlog import read_metrics

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 4.5))
    for name in names:
        path = run_dir / name / "metrics.jsonl"
        rows = read_metrics(path, "policy") if path.exists() else []
        if rows:
            true = [r.get("objective/true_reward", float("nan")) for r in rows]
            ax.plot([r["step"] for r in rows], true, label=name)
    ax.set_title("true reward of rollouts (same KL target)")
    ax.set_xlabel("PPO update")
    ax.legend()
    ax.grid(alpha=0.3)
    bars = [n for n in ["initial", *names] if n in results]
    bx.bar(bars, [results[n]["mean"] for n in bars], yerr=[results[n]["stderr"] for n in bars], capsize=4)
    bx.set_title("true reward on held-out queries (mean +/- s.e.)")
    bx.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    path = run_dir / "figure2.png"
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
