import ast
import dataclasses
import json
from pathlib import Path

import pytest

from lmprefs.cli.dispatch import main
from lmprefs.config import PRESETS, Config, preset
from lmprefs.config.overrides import ConfigError, all_keys, apply_overrides
from lmprefs.io.config_file import load_config, save_config


def test_presets_carry_the_originals_hyperparameters():
    s = preset("sentiment")
    st = s.task
    assert (st.query_length, st.response_length, st.truncate_token, st.truncate_after) == (64, 24, 13, 16)
    assert (s.task.temperature, s.ppo.lr, s.ppo.batch_size, s.ppo.total_episodes) == (0.7, 1e-5, 512, 1_000_000)
    assert (s.rewards.kl_coef, s.rewards.kl_target, s.rewards.kl_horizon) == (0.15, 6.0, 10000)
    assert (s.train_reward.batch_size, s.train_reward.lr, s.train_reward.rollout_batch_size) == (32, 5e-5, 512)
    assert (s.ppo.noptepochs, s.ppo.nminibatches, s.ppo.vf_coef, s.ppo.cliprange, s.ppo.lam) == (4, 1, 0.1, 0.2, 0.95)
    assert s.labels.num_train == 4992 and s.labels.type == "best_of_4"
    t = preset("tldr")
    tt = t.task
    assert (tt.query_length, tt.response_length, tt.truncate_token, tt.truncate_after) == (500, 75, 198, 55)
    assert (t.rewards.kl_coef, t.rewards.kl_target, t.ppo.whiten_rewards, t.ppo.lr, t.ppo.batch_size) == (
        0.03, None, False, 2e-6, 32)  # fmt: skip
    assert t.task.query_suffix == "\n\nTL;DR:"
    c = preset("cnndm")
    ct = c.task
    assert (ct.temperature, ct.query_prefix, ct.end_text, c.rewards.kl_coef) == (0.5, "Article:\n\n", "\n", 0.01)
    assert (c.train_reward.batch_size, c.train_reward.lr, c.train_reward.rollout_batch_size) == (16, 2.5e-5, 128)
    assert {"sentiment", "descriptiveness", "tldr", "cnndm", "austen-sentiment", "tiny"} <= set(PRESETS)


def test_overrides_parse_by_type_and_reject_unknown_keys():
    cfg = apply_overrides(preset("sentiment"), [("ppo.lr", "2e-5"), ("rewards.kl-target", "None"),
                                                ("ppo.whiten-rewards", "false"), ("task.truncate-token", "None")])
    got = (cfg.ppo.lr, cfg.rewards.kl_target, cfg.ppo.whiten_rewards, cfg.task.truncate_token)
    assert got == (2e-5, None, False, None)
    with pytest.raises(ConfigError, match="did you mean --ppo.nminibatches"):
        apply_overrides(cfg, [("ppo.nminibatch", "2")])
    with pytest.raises(ConfigError, match="expected int"):
        apply_overrides(cfg, [("ppo.batch-size", "1.5")])
    with pytest.raises(ConfigError, match="nminibatches"):
        apply_overrides(cfg, [("ppo.nminibatches", "3")])  # 512 % 3 != 0: validation names the values
    # validated once with every override in place: the order of dependent overrides does not matter
    tiny = preset("tiny")  # 32 episodes of 16
    for pairs in ([("ppo.batch-size", "64"), ("ppo.total-episodes", "512")],
                  [("ppo.total-episodes", "512"), ("ppo.batch-size", "64")]):  # fmt: skip
        assert apply_overrides(tiny, pairs).ppo.num_updates == 8
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.ppo.noptepochs = 1  # the original's tests set a field that did not exist; frozen configs refuse


def test_config_round_trips_and_rejects_unknown_keys_in_files(tmp_path):
    cfg = apply_overrides(preset("cnndm"), [("lora.rank", "8"), ("lora.targets", "q_proj,v_proj")])
    save_config(cfg, tmp_path / "config.json")
    assert load_config(tmp_path / "config.json") == cfg
    d = json.loads((tmp_path / "config.json").read_text())
    d["ppo"]["nminibatch"] = 2
    (tmp_path / "bad.json").write_text(json.dumps(d))
    with pytest.raises(ConfigError, match="ppo.nminibatch"):
        load_config(tmp_path / "bad.json")


def test_stop_tokens_parse_as_ids_round_trip_and_need_stop_at_eos(tmp_path):
    cfg = apply_overrides(preset("tiny"), [("task.stop-at-eos", "true"), ("task.stop-tokens", "50256, 198")])
    assert cfg.task.stop_tokens == (50256, 198) and preset("tiny").task.stop_at_eos is False
    save_config(cfg, tmp_path / "config.json")
    assert load_config(tmp_path / "config.json") == cfg  # a JSON list comes back as the tuple
    with pytest.raises(ConfigError, match=r"--task.stop-tokens 'eos': expected int"):
        apply_overrides(cfg, [("task.stop-tokens", "eos")])
    with pytest.raises(ConfigError, match=r"task.stop_tokens=\(-3,\) must be token ids"):
        apply_overrides(cfg, [("task.stop-tokens", "-3")])
    with pytest.raises(ConfigError, match="only with task.stop_at_eos true"):
        apply_overrides(preset("tiny"), [("task.stop-tokens", "13")])
    d = json.loads((tmp_path / "config.json").read_text())
    d["task"]["stop_tokens"] = ["13"]
    (tmp_path / "bad.json").write_text(json.dumps(d))
    with pytest.raises(ConfigError, match="task.stop_tokens=.*: expected tuple"):
        load_config(tmp_path / "bad.json")


def test_cli_unknown_key_exits_2_with_a_suggestion(capsys):
    assert main(["sample", "--preset", "tiny", "--ppo.nminibatch", "2"]) == 2
    err = capsys.readouterr().err
    assert "--ppo.nminibatch" in err and "did you mean --ppo.nminibatches" in err and "Traceback" not in err
    assert main(["sample", "--preset", "nope"]) == 2
    assert "unknown preset 'nope'" in capsys.readouterr().err
    assert main(["train-reward", "tiny", "--train-reward.microbatch", "-1"]) == 2
    err = capsys.readouterr().err
    assert "train_reward.microbatch=-1 must be >= 0" in err and "Traceback" not in err



def test_text_overrides_decode_escapes_keep_other_text_and_refuse_a_broken_escape_in_one_line(capsys):
    cfg = apply_overrides(preset("tiny"), [("task.query-suffix", "\\n\\nRésumé → TL;DR:\\t\\x41\\u00e9 \\q")])
    assert cfg.task.query_suffix == "\n\nRésumé → TL;DR:\tAé \\q"  # not 'RÃ©sumÃ©': UTF-8 read as Latin-1
    for bad, why in (("\\x", "truncated \\xXX escape"), ("a\\N{no such name}", "unknown Unicode character name"),
                     ("tail\\", "\\ at end of string")):  # fmt: skip
        assert main(["config", "tiny", "--task.query-suffix", bad]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"lmprefs config: error: --task.query-suffix {bad!r}: ") and why in err, err
        assert len(err.splitlines()) == 1 and "Traceback" not in err


SECTIONS = {f.name: f.type if isinstance(f.type, str) else f.type.__name__ for f in dataclasses.fields(Config)}


def _section_reads(tree: ast.AST) -> set[str]:
    """"section.field" for every read of a config field in a module: `x.ppo.lr`, or `p.lr` where `p` is bound in the
    same function to `something.ppo`, or is a parameter annotated with PPOConfig (or named `ppo`), or
    `getattr(x.task, "query_prefix")`. The field alone is not enough: `labels.type` must not be satisfied by
    `device.type`."""
    out: set[str] = set()
    for fn in ast.walk(tree):
        if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef | ast.Module):
            continue
        alias = {}
        if not isinstance(fn, ast.Module):
            for a in fn.args.args + fn.args.kwonlyargs:
                ann = ast.unparse(a.annotation) if a.annotation else ""
                for sec, cls in SECTIONS.items():
                    if cls in ann or a.arg == sec:
                        alias[a.arg] = sec
        for node in ast.walk(fn):
            if isinstance(node, ast.Assign):
                tg, val = node.targets[0], node.value
                both = isinstance(tg, ast.Tuple) and isinstance(val, ast.Tuple)
                for t, v in zip(tg.elts, val.elts, strict=True) if both else [(tg, val)]:
                    if isinstance(t, ast.Name) and isinstance(v, ast.Attribute) and v.attr in SECTIONS:
                        alias[t.id] = v.attr
        for node in ast.walk(fn):
            if isinstance(node, ast.Attribute):
                v = node.value
                if isinstance(v, ast.Attribute) and v.attr in SECTIONS:
                    out.add(f"{v.attr}.{node.attr}")
                elif isinstance(v, ast.Name) and v.id in alias:
                    out.add(f"{alias[v.id]}.{node.attr}")
            elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "getattr" and len(node.args) >= 2:
                v, k = node.args[0], node.args[1]
                own = v.attr if isinstance(v, ast.Attribute) and v.attr in SECTIONS else None
                sec = own or alias.get(getattr(v, "id", ""))
                if sec and isinstance(k, ast.Constant):
                    out.add(f"{sec}.{k.value}")
    return out


def test_every_config_field_is_read_somewhere_in_the_package():
    """A knob nobody reads is a lie (torchtune's whiten_rewards, the original's rewards.whiten). A read counts for
    the section that owns it (`labels.type` is not satisfied by a read of `device.type`)."""
    pkg = Path(__file__).parents[2] / "lmprefs"
    reads = set()
    for p in pkg.rglob("*.py"):
        if p.name not in ("config.py", "overrides.py"):  # validation and help read every field
            reads |= _section_reads(ast.parse(p.read_text()))
    unread = [k for k in all_keys(Config) if k not in reads]
    assert not unread, f"config fields never read: {unread}"
    # the check itself: a field read only through another section's attribute of the same name is unread
    probe = _section_reads(ast.parse("def f(cfg, device):\n    return device.type, cfg.run.seed\n"))
    assert probe == {"run.seed"}


def test_auto_dtype_is_bf16_only_where_the_hardware_multiplies_bf16(monkeypatch):
    import torch

    from lmprefs.runtime import device

    cpu = torch.device("cpu")
    monkeypatch.delenv("LMPREFS_AUTO_DTYPE", raising=False)
    monkeypatch.setattr(device, "cpu_has_native_bf16", lambda: True)
    assert device.pick_dtype("auto", cpu) == torch.bfloat16
    monkeypatch.setattr(device, "cpu_has_native_bf16", lambda: False)
    assert device.pick_dtype("auto", cpu) == torch.float32
    assert device.pick_dtype("bfloat16", cpu) == torch.bfloat16  # asked for: given, emulated or not
    assert preset("quickstart").run.dtype == "auto"


def test_auto_dtype_can_be_pinned_from_the_environment(monkeypatch):
    import torch

    from lmprefs.errors import UserError
    from lmprefs.runtime import device

    cpu = torch.device("cpu")
    monkeypatch.setattr(device, "cpu_has_native_bf16", lambda: True)
    monkeypatch.setenv("LMPREFS_AUTO_DTYPE", "float32")
    assert device.pick_dtype("auto", cpu) == torch.float32
    assert device.pick_dtype("bfloat16", cpu) == torch.bfloat16  # only auto is pinned
    monkeypatch.setattr(device, "cpu_has_native_bf16", lambda: False)
    monkeypatch.setenv("LMPREFS_AUTO_DTYPE", "bfloat16")
    assert device.pick_dtype("auto", cpu) == torch.bfloat16
    monkeypatch.setenv("LMPREFS_AUTO_DTYPE", "fp16")
    with pytest.raises(UserError, match="LMPREFS_AUTO_DTYPE='fp16'"):
        device.pick_dtype("auto", cpu)


def test_a_config_saved_before_a_field_existed_loads_as_its_run_was_computed(tmp_path):
    """A run directory of an earlier version: its config.json lacks task.crop_local_files, and its local query file
    was cropped as the built-in corpora are; today's default (use the file as given) would change its queries."""
    from lmprefs.config.overrides import to_dict
    from lmprefs.io.config_file import load_config

    d = to_dict(preset("tiny"))
    del d["task"]["crop_local_files"]
    (tmp_path / "config.json").write_text(json.dumps(d))
    assert load_config(tmp_path / "config.json").task.crop_local_files is True
    assert preset("tiny").task.crop_local_files is False


@pytest.mark.parametrize("name", ["tiny", "quickstart"])
def test_a_checkpoint_saved_before_options_existed_resumes_while_they_do_what_the_code_did(name):
    """A checkpoint's manifest of an earlier version lacks the keys added since (a whole section, dpo, and single
    options): at what the code did before them they change nothing that run computed; set otherwise, they are a
    change like any other."""
    from lmprefs.config import DPOConfig
    from lmprefs.config.diff import flat_config, math_changes

    # a run saved before the dpo section existed reads it at DPOConfig's defaults (tiny's own DPO settings are for
    # DPO runs made since)
    now = flat_config(dataclasses.replace(preset(name), dpo=DPOConfig()))
    later = ("dpo.", "ppo.estimator", "ppo.rloo_k", "ppo.rloo_ratio", "ppo.overoptimization_stop",
             "rewards.normalize", "task.stop_at_eos", "task.stop_tokens")
    # the original's presets set chat_template false, what the code did before it (tiny's auto is not that value)
    later += ("task.chat_template",) if name == "quickstart" else ()
    before = {k: v for k, v in now.items() if not k.startswith(later)}
    assert math_changes(before, now) == []
    changed = flat_config(dataclasses.replace(preset(name), dpo=DPOConfig(beta=0.5)))
    assert math_changes(before, changed) == ["dpo.beta 0.1 -> 0.5"]
    rloo = dict(now, **{"ppo.estimator": "rloo"})
    assert math_changes(before, rloo) == ["ppo.estimator 'ppo' -> 'rloo'"]
    if name == "quickstart":  # the original's presets keep the raw format the code had before templates
        assert math_changes(before, dict(now, **{"task.chat_template": "true"})) == [
            "task.chat_template 'false' -> 'true'"]
    assert math_changes(before, dict(now, **{"ppo.lr": 1.0})) == [f"ppo.lr {now['ppo.lr']!r} -> 1.0"]
    assert math_changes(before, dict(now, **{"task.stop_at_eos": True})) == ["task.stop_at_eos False -> True"]
