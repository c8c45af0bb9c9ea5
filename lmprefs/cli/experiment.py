"""`lmprefs experiment`: the paper's Figure 2 (mock-sentiment) and Figure 3 (kl-frontier), and the
writing-prompts demo; each resumable by rerunning its command."""

from __future__ import annotations

from pathlib import Path

from lmprefs.cli.common import ArgumentParser, command_parser, help_with_config, parse_numbers, run_dir_for
from lmprefs.errors import UserError


def cmd_experiment(argv: list[str]) -> int:
    from lmprefs.config.overrides import split_overrides
    from lmprefs.runtime.resolve import resolve_config

    if argv[:1] == ["writing-prompts"]:
        return _writing_prompts(argv[1:])
    argv, pairs = split_overrides(argv)
    p = command_parser("experiment", "lmprefs experiment {mock-sentiment,kl-frontier,writing-prompts} [PRESET] "
                "[--run-dir DIR] [...]")  # fmt: skip
    p.add_argument("name", choices=["mock-sentiment", "kl-frontier", "writing-prompts"],
                   help="mock-sentiment: the paper's Figure 2 (reward models from N labels vs direct access); "
                   "kl-frontier: Figure 3 (KL vs true reward of PPO runs beside the optimal policy); writing-prompts: "
                   "SFT, a reward model from scores and PPO with a separate value model (lmprefs experiment "
                   "writing-prompts --help)")  # fmt: skip
    p.add_argument("preset_arg", nargs="?", metavar="PRESET", help="preset every arm starts from (default quickstart)")
    p.add_argument("--preset", default=None, help="the same as PRESET")
    p.add_argument("--run-dir", default=None, help="directory (an existing one resumes)")
    p.add_argument("--eval-samples", type=int, default=2, help="samples per held-out query for each PPO arm")
    g = p.add_argument_group("mock-sentiment")
    g.add_argument("--labels", default="250,1000,4000", help="label counts of the reward-model arms")
    g.add_argument("--seeds", type=int, default=1, help="seeds of every arm (reward-model init, label subset, PPO)")
    g.add_argument("--eval-queries", type=int, default=256, help="held-out queries for the true-reward evaluation")
    g = p.add_argument_group("kl-frontier")
    g.add_argument("--queries", type=int, default=64, help="Q: held-out queries for the frontier and the PPO arms")
    g.add_argument("--samples", type=int, default=256, help="M: samples of the initial policy per query")
    g.add_argument("--betas", default=None, help="beta grid of the optimal frontier (default 25 from 0.01 to 10)")
    g.add_argument("--kl-targets", default="1,2,4,6", help="PPO arms with the adaptive KL controller at these targets")
    g.add_argument("--kl-coefs", default="", help="PPO arms with a fixed KL coefficient (beta) each")
    g.add_argument("--true-reward", default=None, help="true reward: vader, descriptiveness or module:function "
                   "(default labels.labeler)")  # fmt: skip
    g.add_argument("--min-ess", type=float, default=10.0, help="frontier points with a smaller mean effective "
                   "sample size are marked as not trusted")  # fmt: skip
    g.add_argument("--figure2", default=None, help="a mock-sentiment run directory whose arms are added as points")
    help_with_config(p, argv, "quickstart", pairs)
    a = p.parse_args(argv)
    if a.preset and a.preset_arg and a.preset != a.preset_arg:
        raise UserError(f"preset given twice: {a.preset_arg} and --preset {a.preset}")
    preset_name = a.preset or a.preset_arg or "quickstart"
    if a.name == "writing-prompts":  # its own flags: parsed when it comes first
        raise UserError("writing-prompts: put it right after `experiment` (lmprefs experiment writing-prompts --help)")
    other = {"mock-sentiment": ("--queries", "--samples", "--betas", "--kl-targets", "--kl-coefs", "--true-reward",
                                "--min-ess", "--figure2"),
             "kl-frontier": ("--labels", "--seeds", "--eval-queries")}[a.name]  # fmt: skip
    given = [f for f in other if any(x == f or x.startswith(f + "=") for x in argv)]
    if given:
        raise UserError(f"{given[0]} is not an option of `experiment {a.name}` (see lmprefs experiment --help)")
    from lmprefs.recipes import experiment

    if a.eval_samples < 1:
        raise UserError(f"--eval-samples {a.eval_samples}: must be at least 1")
    run_dir = run_dir_for(a.run_dir, resolve_config(preset_name, []), "experiment", a.name)
    cfg_file = run_dir / "experiment-config.json"
    if cfg_file.exists():  # resuming: the saved config wins
        if pairs:
            raise UserError(f"{run_dir} is an existing experiment; drop the --section.key overrides to resume it")
        cfg = resolve_config(preset_name, [], str(cfg_file))
    else:
        cfg = resolve_config(preset_name, pairs)

    def on_start():  # every input checked: now the run directory may be written
        if not cfg_file.exists():
            from lmprefs.io.config_file import save_config

            run_dir.mkdir(parents=True, exist_ok=True)
            save_config(cfg, cfg_file)

    if a.name == "mock-sentiment":
        counts = sorted(set(parse_numbers(a.labels, "--labels", int)))
        if not counts or counts[0] <= 0:
            raise UserError(f"--labels {a.labels!r}: label counts must be positive")
        if a.seeds < 1:
            raise UserError(f"--seeds {a.seeds}: must be at least 1")
        if a.eval_queries < 2:
            raise UserError(f"--eval-queries {a.eval_queries}: must be at least 2")
        out = experiment.run_mock_sentiment(cfg, run_dir, counts, a.eval_queries, a.eval_samples, a.seeds, on_start)
        for k, v in {"initial": out["results"]["initial"], **out["results"]["summary"]}.items():
            print(f"  {k:12s} true reward {v['mean']:+.4f} +/- {v['stderr']:.4f}, KL {v['kl']:.2f} +/- "
                  f"{v['kl_stderr']:.2f}" + (f" ({v['seeds']} seeds)" if v.get("seeds", 1) > 1 else ""))
    else:
        from lmprefs.training.frontier import DEFAULT_BETAS

        betas = parse_numbers(a.betas, "--betas") if a.betas is not None else list(DEFAULT_BETAS)
        bad = [b for b in betas if not b > 0 or b == float("inf")]
        if not betas or bad:
            raise UserError(f"--betas {a.betas!r}: every beta must be a positive number" + (f" (not {bad[0]:g})"
                                                                                           if bad else ""))
        for flag, v in (("--queries", a.queries), ("--samples", a.samples)):
            if v < 2:
                raise UserError(f"{flag} {v}: must be at least 2 (a standard error needs two)")
        targets, coefs = parse_numbers(a.kl_targets, "--kl-targets"), parse_numbers(a.kl_coefs, "--kl-coefs")
        for flag, text, xs in (("--kl-targets", a.kl_targets, targets), ("--kl-coefs", a.kl_coefs, coefs)):
            if any(not 0 < x < float("inf") for x in xs):
                raise UserError(f"{flag} {text!r}: every value must be a positive number")
        if a.min_ess < 1:
            raise UserError(f"--min-ess {a.min_ess}: must be at least 1")
        out = experiment.run_kl_frontier(cfg, run_dir, queries=a.queries, samples=a.samples, betas=betas,
                                         kl_targets=targets, kl_coefs=coefs, eval_samples=a.eval_samples,
                                         true_reward=a.true_reward or cfg.labels.labeler, min_ess=a.min_ess,
                                         figure2=Path(a.figure2) if a.figure2 else None,
                                         on_start=on_start)  # fmt: skip
        res = out["results"]
        trusted = [p for p in res["frontier"]["points"] if p["trusted"]]
        if trusted:
            top = trusted[0]
            print(f"  optimal frontier: trusted up to KL {top['kl']:.2f} nats (reward {top['reward']:+.4f}, beta "
                  f"{top['beta']:g}, mean ESS {top['ess_mean']:.0f} of {a.samples})")  # fmt: skip
        for k, v in res.items():
            if k not in ("frontier", "figure2") and "mean" in v:
                print(f"  {k:14s} true reward {v['mean']:+.4f} +/- {v['stderr']:.4f} at KL {v['kl']:.2f} +/- "
                      f"{v['kl_stderr']:.2f}")  # fmt: skip
    print(f"figure: {out['figure']}")
    return 0


def _writing_prompts(argv: list[str]) -> int:
    from lmprefs.config.overrides import split_overrides
    from lmprefs.io.config_file import save_config
    from lmprefs.runtime.resolve import resolve_config

    argv, pairs = split_overrides(argv)
    p = ArgumentParser(prog="lmprefs experiment writing-prompts",
                       description="SFT baseline, a reward model from per-response scores, PPO from the SFT model "
                       "with a separate value model, evaluation; an existing --run-dir resumes",
                       usage="lmprefs experiment writing-prompts [--data SCORES.jsonl] [--run-dir DIR] "
                       "[--section.key V ...]")  # fmt: skip
    p.add_argument("--data", default=None, help="JSONL of {prompt, response, score} (default: the offline demo, "
                   "Austen prompts, SmolLM2 stories, VADER scores)")  # fmt: skip
    p.add_argument("--preset", default="writing-prompts", help="preset (default writing-prompts)")
    p.add_argument("--run-dir", default=None, help="directory (an existing one resumes)")
    p.add_argument("--true-reward", default=None,
                   help="a reward on response texts to evaluate with: vader, descriptiveness or module:function "
                   "(default: vader for the demo, none for --data)")  # fmt: skip
    p.add_argument("--eval-queries", type=int, default=64, help="held-out prompts for the final evaluation")
    p.add_argument("--eval-samples", type=int, default=2, help="samples per held-out prompt")
    p.add_argument("--demo-prompts", type=int, default=256, help="demo: Austen passages used as prompts")
    p.add_argument("--demo-per-prompt", type=int, default=4, help="demo: sampled stories per prompt")
    help_with_config(p, argv, "writing-prompts", pairs)
    a = p.parse_args(argv)
    from lmprefs.recipes.writing_prompts import run_writing_prompts

    if a.eval_queries < 2 or a.eval_samples < 1 or a.demo_prompts < 2 or a.demo_per_prompt < 2:
        raise UserError("--eval-queries, --demo-prompts and --demo-per-prompt must be >= 2, --eval-samples >= 1")
    if a.data is not None:
        if not Path(a.data).is_file():
            raise UserError(f"--data {a.data}: no such file (a JSONL of prompt, response, score)")
        import tempfile

        from lmprefs.labels.formats import LabelFileError, import_file
        from lmprefs.pipeline.labeling import open_store

        with tempfile.TemporaryDirectory() as tmp:  # a bad row is refused before the run directory is made
            try:
                import_file(open_store(Path(tmp) / "check.sqlite"), a.data, format="scores")
            except LabelFileError as e:
                raise UserError(str(e)) from None
    if a.true_reward is not None:
        from lmprefs.pipeline.rewards import reward_function

        reward_function(a.true_reward)  # an unknown name is refused before any work
    run_dir = run_dir_for(a.run_dir, resolve_config(a.preset, []), "experiment", "writing-prompts")
    cfg_file, args_file = run_dir / "experiment-config.json", run_dir / "experiment-args.json"
    import json

    own = {"data": str(Path(a.data).resolve()) if a.data else None, "true_reward": a.true_reward,
           "eval_queries": a.eval_queries, "eval_samples": a.eval_samples, "demo_prompts": a.demo_prompts,
           "demo_per_prompt": a.demo_per_prompt}  # fmt: skip
    if cfg_file.exists():  # resuming: the same command line again, or no overrides (the saved config)
        from lmprefs.config.diff import flat_config, math_changes

        cfg = resolve_config(a.preset, [], str(cfg_file))
        diff = math_changes(flat_config(cfg), flat_config(resolve_config(a.preset, pairs))) if pairs else []
        saved = json.loads(args_file.read_text()) if args_file.exists() else own
        diff += [f"--{k.replace('_', '-')} {saved[k]} -> {own[k]}" for k in own
                 if k in saved and own[k] != saved[k] and (k != "data" or a.data)]  # fmt: skip
        if diff:
            raise UserError(f"{run_dir} is an existing experiment started otherwise ({'; '.join(diff[:3])}); resume "
                            "it with the same command line, or choose another --run-dir")  # fmt: skip
        own = saved
        print(f"resuming {run_dir}", flush=True)
    else:
        cfg = resolve_config(a.preset, pairs)
        run_dir.mkdir(parents=True, exist_ok=True)
        save_config(cfg, cfg_file)
        from lmprefs.io.atomic import atomic_write_text

        atomic_write_text(args_file, json.dumps(own))
    out = run_writing_prompts(cfg, run_dir, data=own["data"], true_reward=own["true_reward"],
                              n_eval=own["eval_queries"], eval_samples=own["eval_samples"],
                              demo_prompts=own["demo_prompts"], demo_per_prompt=own["demo_per_prompt"])  # fmt: skip
    ev = out["results"]["evaluate"]
    if "true_ppo" in ev:
        print(f"true reward on {ev['n_queries']} held-out prompts: SFT {ev['true_sft']:+.4f} -> PPO "
              f"{ev['true_ppo']:+.4f} (gain {ev['gain']:+.4f} +/- {ev['gain_stderr']:.4f})")  # fmt: skip
    print(f"report: {out['report']}")
    return 0
