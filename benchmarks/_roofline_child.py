"""The quickstart as roofline.py runs it: `lmprefs quickstart ARGS` in this process, unchanged, recording what the
FLOP count needs (the model's config, the task's query shapes, the device, dtype and threads the run used) and,
with --count, the FLOPs of each stage as torch's FlopCounterMode counts them.

    python benchmarks/_roofline_child.py OUT.json [--count] ARGS...

The stages are the functions `run_quickstart` calls, wrapped in its module's namespace: each call is timed by the
recipe as usual, counted (--count) by a FlopCounterMode of its own, and followed by a reading of the process's peak
RSS so far, which tells in which stage the run's peak was reached.
"""

from __future__ import annotations

import json
import resource
import sys
from pathlib import Path

import _common  # noqa: F401 (offline hub, quiet tokenizers: set before transformers loads)

# the functions run_quickstart calls in each of its stages; evaluate_policy serves two, told apart by its `desc`
STAGE_OF = {"setup_eval_task": "assets and model", "collect_labels": "sample and label",
            "train_reward_model": "train reward model", "policy_for": "PPO", "build_run": "PPO",
            "track_true_reward": "PPO", "train_policy": "PPO"}  # fmt: skip
EVALUATIONS = {"initial policy": "evaluate initial", "final policy": "evaluate final"}


def main(argv: list[str]) -> int:
    import torch

    import lmprefs.recipes.quickstart as qs
    from lmprefs.cli.dispatch import main as lmprefs_main
    from lmprefs.models import cpu_linear
    from lmprefs.models.flops import flop_counter

    out, argv = Path(argv[0]), argv[1:]
    count = argv[:1] == ["--count"]
    argv = argv[1:] if count else argv
    record: dict = {"counted": {} if count else None, "peak_rss_mib": {}}

    def counted(stage_of, fn):
        def run(*args, **kwargs):
            stage = stage_of(kwargs)
            if not count:
                result = fn(*args, **kwargs)
            else:
                with flop_counter() as mode:
                    result = fn(*args, **kwargs)
                record["counted"][stage] = record["counted"].get(stage, 0) + mode.get_total_flops()
            record["peak_rss_mib"][stage] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
            return result

        return run

    setup = qs.setup_eval_task

    def setup_eval_task(cfg, *args, **kwargs):
        t, n_eval = setup(cfg, *args, **kwargs)
        record.update(model_config=t.model.config.to_dict(),
                      attention=getattr(t.model.config, "_attn_implementation", None),
                      query_length=int(t.train_queries.shape[1]), prefix=len(t.prefix), suffix=len(t.suffix),
                      train_queries=len(t.train_queries), device=str(t.device),
                      dtype=str(t.dtype).removeprefix("torch."), threads=torch.get_num_threads(),
                      fp32_linear=None if t.dtype != torch.float32 else  # under autocast nothing is routed
                      "onednn" if any(map(cpu_linear.routed, t.model.modules())) else "torch")  # fmt: skip
        return t, n_eval

    for name, stage in STAGE_OF.items():
        fn = setup_eval_task if name == "setup_eval_task" else getattr(qs, name)
        setattr(qs, name, counted(lambda _kw, s=stage: s, fn))
    qs.evaluate_policy = counted(lambda kw: EVALUATIONS[kw["desc"]], qs.evaluate_policy)
    code = lmprefs_main(["quickstart", *argv])
    out.write_text(json.dumps(record))
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
