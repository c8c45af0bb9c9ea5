"""ppo_throughput.py's report on stdout: what was compared, episodes/s and per CPU-second against TRL, the FLOP
model and the profile tables; the figures also go into the summary that becomes results.json."""

from __future__ import annotations

import json
import statistics
from collections import defaultdict

from lmprefs.models.flops import response_columns

# lmprefs / TRL per episode, both sides in the same dtype: in bf16 (a CPU with native bf16) and in fp32 (the
# fp32-only CPUs, where both sides run their matmuls at the same peak and only FLOPs and overheads can differ)
TARGETS = {"bfloat16": {"shared": 3.5, "separate": 2.0}, "float32": {"shared": 3.0, "separate": 1.6}}


def median(xs):
    return statistics.median(xs) if xs else float("nan")


def system_label(s: str) -> str:
    return "TRL" if s == "trl" else "lmprefs " + s


def fmt_phases(s: dict) -> str:
    keys = ("total_s", "generation_s", "rollout_forward_s", "scoring_s", "optimization_s")
    return (
        "total {:.3f} s = generation {:.3f} + rollout forwards {:.3f} + scoring {:.3f} + optimization {:.3f}".format(
            *(s[k] for k in keys)
        )
    )


def report_header(args, systems: list[str], results: dict, profiles: dict) -> None:
    """Which TRL and lmprefs were compared, on what model, source and settings."""
    print()
    first = next((r for s in systems for r in results[s] if r), None)
    trl_first = next((r for r in results.get("trl", []) if r), None)
    if trl_first:
        print(f"TRL side: {trl_first.get('ppo_trainer')} versions {json.dumps(trl_first.get('versions'))}")
    if args.anchor is not None:
        print(
            f"TRL side read from {args.anchor_result} (not measured in this invocation: its ratios compare runs made "
            "at different times)"
        )
    if first and "lmprefs" in first.get("versions", {}):
        print(f"lmprefs side: versions {json.dumps(first['versions'])}")
    if first:
        print(f"model: {json.dumps(first['model'])}")
    srcs = {
        json.dumps(r[k])
        for s in systems
        if s != "trl"
        for r in results[s]
        if r
        for k in ("lmprefs_source", "lmprefs_source_end")
    }
    srcs |= {json.dumps(pr[k]) for pr in profiles.values() if pr for k in ("lmprefs_source", "lmprefs_source_end")}
    print(
        f"lmprefs source (sha1 of lmprefs/**/*.py): {', '.join(sorted(srcs))}"
        + ("  WARNING: the package changed during this benchmark" if len(srcs) > 1 else "")
    )
    print(
        f"settings: batch {args.batch_size}, query {args.query_len}, response {args.response_len}, "
        f"{args.ppo_epochs} epochs x {args.minibatches} minibatches, T {args.temperature}, lr {args.lr}, "
        f"{args.threads} threads, both sides "
        f"{'fp32' if args.dtype == 'float32' else 'bf16 (TRL --bf16, lmprefs autocast)'}, "
        f"reward char-frac:e, {args.steps} updates/run (first = warm-up, excluded)"
    )


def eps_per_cpu_second(r: dict | None, args) -> float | None:
    """Episodes per CPU-second of a run's training call (warm-up included), from its CpuMonitor record: the
    process's own CPU seconds, unrounded (`own_cpu_s`, _exact_cpu.py); a result file without them (an older
    --anchor-result): its cores, rounded to 0.01, times the call's wall seconds."""
    cpu = (r or {}).get("cpu_during_train", {})
    own, wall = cpu.get("own_cores_avg"), cpu.get("wall_s")
    seconds = cpu.get("own_cpu_s") or (own * wall if own and wall else None)
    return args.batch_size * args.steps / seconds if seconds else None


def report_per_cpu_second(args, systems, modes, results, summary) -> None:
    """The same rounds per CPU-second: a ratio that other work on the machine moves far less than wall time."""
    print()
    print("episodes per CPU-second of the training call (warm-up included), per round:")
    per = {s: [eps_per_cpu_second(r, args) for r in results[s]] for s in systems}
    for s in systems:
        cells = ", ".join("n/a" if x is None else f"{x:.3f}" for x in per[s])
        print(f"  {system_label(s):>18}: {cells}")
    if "trl" not in systems:
        return
    for m in modes:
        ratios = [a / b for a, b in zip(per[m], per["trl"], strict=True) if a and b]
        if not ratios:
            continue
        r_med = median(ratios)
        summary["ratios"].setdefault(m, {})["per_cpu_second"] = {"per_round": ratios, "median": r_med}
        target = TARGETS[args.dtype][m]
        print(f"lmprefs ({m:>8} value model) / TRL per CPU-second: {r_med:.2f}x (rounds "
              f"{', '.join(f'{x:.2f}' for x in ratios)}) target >= {target}x: "
              f"{'MET' if r_med >= target else 'NOT MET'}")  # fmt: skip


def report_rounds(systems, results) -> None:
    print()
    print("episodes/s per round [cores used by other processes during the timed region / busy cores just before]:")
    for s in systems:
        cells = []
        for r in results[s]:
            if r is None:
                cells.append("FAILED")
                continue
            other = r["cpu_during_train"].get("other_cores_avg")
            flag = " CONTAMINATED" if r.get("contaminated") else ""
            cells.append(f"{r['episodes_per_sec']:.3f} [{other}/{r.get('busy_cores_before')}]{flag}")
        print(f"  {system_label(s):>18}: " + ", ".join(cells))


def usable_runs(systems, results):
    """Which runs the figures use: the uncontaminated ones, or every finished one (with a warning) where some
    system has no clean run."""

    def clean(r):
        return r is not None and not r.get("contaminated")

    if all(any(clean(r) for r in results[s]) for s in systems):
        return clean
    print("WARNING: some system has no uncontaminated run; the figures below include contaminated runs")
    return lambda r: r is not None


def report_medians(args, systems, modes, results, summary, use) -> None:
    """Each mode's median episodes/s and, with TRL measured, its ratios against TRL."""
    for s in systems:
        ok = [r["episodes_per_sec"] for r in results[s] if use(r)]
        per_round = [r["episodes_per_sec"] if r else None for r in results[s]]
        summary["systems"][s] = {"episodes_per_sec_median": median(ok), "per_round": per_round, "used": len(ok)}
    print()
    for m in modes:
        med = summary["systems"][m]["episodes_per_sec_median"]
        line = f"lmprefs ({m:>8} value model): {med:.3f} episodes/s (median of {summary['systems'][m]['used']})"
        if "trl" in systems:
            ratios = [
                a["episodes_per_sec"] / b["episodes_per_sec"]
                for a, b in zip(results[m], results["trl"], strict=True)
                if use(a) and use(b)
            ]
            trl_med = summary["systems"]["trl"]["episodes_per_sec_median"]
            r_med, target = median(ratios), TARGETS[args.dtype][m]
            summary["ratios"][m] = {
                "per_round": ratios,
                "median_of_round_ratios": r_med,
                "ratio_of_medians": med / trl_med,
                "target": target,
            }
            line += (
                f" | TRL {trl_med:.3f} | ratio {r_med:.2f}x (median of per-round ratios "
                f"{', '.join(f'{x:.2f}' for x in ratios) or 'none usable'}; ratio of medians "
                f"{med / trl_med:.2f}x) target >= {target}x: "
                f"{'MET' if min(r_med, med / trl_med) >= target else 'NOT MET'}"
            )
        print(line)


def report_median_run_phases(systems, results, use) -> None:
    print()
    print("mean seconds per update (median run of each system):")
    for s in systems:
        ok = [r for r in results[s] if use(r)]
        if not ok:
            continue
        r = sorted(ok, key=lambda r: r["episodes_per_sec"])[len(ok) // 2]
        print(f"  {system_label(s):>18}: {fmt_phases(r['sec_per_step_mean'])}")
        if s != "trl":
            print(f"  {'':>18}  detail: {json.dumps(r['detail_mean'])}")
        else:
            d: defaultdict[str, float] = defaultdict(float)
            for st in r["per_step"][1:]:
                for k, v in st["detail"].items():
                    d[k] += v / (len(r["per_step"]) - 1)
            print(f"  {'':>18}  detail: {json.dumps({k: round(v, 4) for k, v in sorted(d.items())})}")
        print(f"  {'':>18}  last metrics: {json.dumps(r.get('last_metrics'))}")


def report_throughput(args, systems, modes, results, summary) -> None:
    """Per-round episodes/s, medians, ratios against TRL and the phase split of the median runs."""
    report_rounds(systems, results)
    use = usable_runs(systems, results)
    report_medians(args, systems, modes, results, summary, use)
    report_per_cpu_second(args, systems, modes, results, summary)
    report_median_run_phases(systems, results, use)


def flop_model(args, n_layer: int = 4, d: int = 256, V: int = 8192) -> dict:
    """Matmul GFLOP per update of TRL's PPO and of lmprefs' (current code), for a GPT-2 of this shape (by default the
    anchor model's)."""
    B, Q, T, E = args.batch_size, args.query_len, args.response_len, args.ppo_epochs
    Ft, Fh = 24 * n_layer * d * d, 2 * d * V
    L = Q + T
    gen = B * (L - 1) * Ft + B * T * Fh  # prefill + T-1 cached steps, head on the T sampling positions
    trl = gen + B * L * (Ft + Fh) + B * L * Ft + 3 * E * B * L * (2 * Ft + Fh)
    # a trunk forward that reads the T positions predicting the response runs all but the last token (which feeds
    # none of them); on the CPU its top block runs at those T alone, and elsewhere only c_attn (6 of its 24 d^2
    # FLOPs a token), for the keys and values (lmprefs.models.trunk)
    Lr = Q + response_columns(T)
    Fr = Lr * Ft - (Lr - T) * 18 * d * d
    shared = gen + B * (Fr + T * Fh) + 3 * E * B * (Fr + T * Fh)
    separate = shared + B * Fr + 3 * E * B * Fr
    return {"trl": trl / 1e9, "lmprefs shared": shared / 1e9, "lmprefs separate": separate / 1e9}


def report_flop_model(args, shape: dict) -> dict | None:
    """The FLOP model printed for a GPT-2-like config (None for another shape)."""
    if not all(isinstance(shape.get(k), int) for k in ("n_layer", "n_embd", "vocab_size")):
        return None
    fm = flop_model(args, shape["n_layer"], shape["n_embd"], shape["vocab_size"])
    print()
    print(
        "FLOP model per update (matmuls only; per token Ft = 24*n_layer*d^2, LM head Fh = 2*d*V per position; "
        "training = 3x forward):"
    )
    for k, v in fm.items():
        ceiling = f", TRL/this = {fm['trl'] / v:.2f}x" if k != "trl" else ""
        print(f"  {k:>18}: {v:8.2f} GFLOP{ceiling}")
    print(
        "  (TRL: full-sequence logits and a separate critic trunk in every train forward, reference logits over "
        "the whole sequence; lmprefs: LM head and top block only at the response positions, values from the "
        "sampler's hidden states)"
    )
    return fm


def profile_rows(args, pf: dict) -> list[tuple[str, float]]:
    """A profiled update's seconds per phase, the rest of the update last."""
    ph = pf["phases"]
    opt_parts = ("ppo_train_fwd", "ppo_backward", "ppo_optimizer_step")
    n_opt = args.ppo_epochs * args.minibatches
    rows = [
        (f"sampling (KV-cache, {args.response_len} tokens)", ph.get("sample", 0)),
        ("rollout forward: policy/value", ph.get("rollout_policy_fwd", 0)),
        ("rollout forward: reference", ph.get("rollout_ref_fwd", 0)),
        ("scoring (decode + char-frac)", ph.get("score", 0)),
        (f"PPO: train forwards ({n_opt})", ph.get("ppo_train_fwd", 0)),
        (f"PPO: backward ({n_opt})", ph.get("ppo_backward", 0)),
        (f"PPO: optimizer steps ({n_opt})", ph.get("ppo_optimizer_step", 0)),
        ("PPO: rest (GAE, whitening, losses)", ph.get("ppo_update", 0) - sum(ph.get(k, 0) for k in opt_parts)),
    ]
    accounted = sum(v for _, v in rows)
    rows.append(("other (loop, KL ctl, stream, stats)", pf["update_s"] - accounted))
    return rows


def report_profile(args, m: str, pr: dict) -> None:
    pf = pr["profile"]
    print(
        f"== profile of one lmprefs update, value_model={m} (torch.profiler on; "
        f"{pf['update_s']:.3f} s with profiler, {pr['sec_per_step_mean']['total_s']:.3f} s mean "
        f"unprofiled in the same run) =="
    )
    for name, v in profile_rows(args, pf):
        print(f"  {name:<38} {v:8.3f} s  {100 * v / pf['update_s']:5.1f}%")
    print(f"  {'total':<38} {pf['update_s']:8.3f} s")
    if pf.get("gflop"):
        unprof = pr["sec_per_step_mean"]["total_s"]
        print(
            f"  FLOPs of one update (torch FlopCounterMode: matmuls + attention): {pf['gflop']:.0f} GFLOP "
            f"= {pf['gflop'] / unprof:.0f} GFLOP/s at the unprofiled {unprof:.3f} s/update"
        )
    print(f"top {args.profile_top} operators by self CPU time:")
    print(pf["table"])


def report_profiles(args, profiles: dict) -> None:
    if not profiles:
        return
    print()
    for m, pr in profiles.items():
        if not pr:
            print(f"profile {m}: FAILED")
            continue
        report_profile(args, m, pr)


def report(args, systems: list[str], modes: list[str], results: dict, profiles: dict, shape: dict) -> dict:
    """Everything after the runs, on stdout; returns the summary for results.json."""
    report_header(args, systems, results, profiles)
    summary: dict = {"systems": {}, "ratios": {}}
    if args.reps > 0:
        report_throughput(args, systems, modes, results, summary)
    else:
        print("(--reps 0: no throughput rounds)")
    summary["flop_model_gflop"] = report_flop_model(args, shape)
    report_profiles(args, profiles)
    return summary
