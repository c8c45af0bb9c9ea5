"""The Python API: `import lmprefs` is cheap, configs take dotted overrides, and a reward
is a callable (API) or module:function (CLI)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

import lmprefs
from lmprefs.cli.dispatch import main
from lmprefs.config.overrides import ConfigError
from lmprefs.errors import UserError


def test_import_is_cheap_and_config_takes_python_values():
    code = "import sys, lmprefs; print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "[]"
    cfg = lmprefs.make_config("tiny", {"ppo.lr": 1e-3, "lora.targets": ["c_attn"], "rewards.kl-target": None,
                                  "task.truncate_token": "None"})  # fmt: skip
    got = (cfg.ppo.lr, cfg.lora.targets, cfg.rewards.kl_target, cfg.task.truncate_token)
    assert got == (1e-3, ("c_attn",), None, None)
    with pytest.raises(ConfigError, match="ppo.lr=-1"):
        lmprefs.make_config("tiny", {"ppo.lr": -1})
    with pytest.raises(ConfigError, match="ppo.noptepochs=4.5: expected int"):
        lmprefs.make_config("tiny", {"ppo.noptepochs": 4.5})
    with pytest.raises(ConfigError, match="did you mean --ppo.nminibatches"):
        lmprefs.make_config("tiny", {"ppo.nminibatch": 2})
    # the machine checks run on the config after the overrides, as on the command line (they ran before them)
    if importlib.util.find_spec("wandb") is None:
        with pytest.raises(UserError, match="wandb package is not installed"):
            lmprefs.make_config("tiny", {"run.report_to": ["tensorboard", "wandb"]})
    # the API builds configs without the command-line module (make_config used lmprefs.cli._config)
    code = "import sys, lmprefs; lmprefs.make_config('tiny', {'ppo.lr': 1e-3}); print('lmprefs.cli' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"


def test_a_reward_function_of_ones_own_via_api_and_cli(tmp_path, monkeypatch):
    seen = []

    def reward(texts):
        seen.append(len(texts))
        return [len(t) / 10 for t in texts]

    cfg = lmprefs.make_config("tiny", {"ppo.total_episodes": 16})
    out = lmprefs.train_policy(cfg, tmp_path / "api", reward=reward)
    assert seen and "objective/score" in out["stats"] and (out["policy"] / "model.safetensors").is_file()
    assert json.loads((tmp_path / "api" / "run.json").read_text())["reward"] == "callable"
    assert len(lmprefs.sample(tmp_path / "api", n=2)) == 2

    monkeypatch.syspath_prepend(str(tmp_path))
    src = "def vowels(texts):\n    return [sum(c in 'aeiou' for c in t) for t in texts]\n"
    (tmp_path / "my_rewards.py").write_text(src)
    args = ["train-policy", "tiny", "--reward", "my_rewards:vowels", "--ppo.total-episodes", "16"]
    assert main([*args, "--run-dir", str(tmp_path / "cli")]) == 0
    assert json.loads((tmp_path / "cli" / "run.json").read_text())["reward"] == "my_rewards:vowels"
    # a module name of its own: imported once per process, a bad_rewards here would hide test_bad_values' module
    (tmp_path / "api_bad_rewards.py").write_text("def wrong(texts):\n    return 'no'\n")
    assert main(["train-policy", "tiny", "--reward", "api_bad_rewards:wrong", "--run-dir", str(tmp_path / "bad")]) == 2


def test_score_api_reads_a_saved_reward_model(tmp_path):
    from lmprefs.models.artifacts import save_reward_model
    from lmprefs.models.loading import load_lm
    from lmprefs.models.reward_model import RewardModel

    lm, tok = load_lm("tiny-gpt2")
    task = {"query_prefix": "", "query_suffix": "", "query_length": 8, "response_length": 8}
    save_reward_model(RewardModel(lm, tok, seed=0), tmp_path / "rm", extra={"task": task})
    s = lmprefs.score(tmp_path / "rm", ["What a lovely day.", ("A query", "A response.")], device="cpu")
    assert len(s) == 2 and all(isinstance(x, float) for x in s) and s[0] != s[1]
