"""`lmprefs push`: exactly the model files and their cards go up (here to a local folder standing in for the hub),
and a push that cannot happen (offline, no token, an unreachable hub, not a finished run) is one line, exit 2, with
nothing uploaded."""

from __future__ import annotations

import json

import pytest

from lmprefs.cli.dispatch import main

POLICY_FILES = {"README.md", "config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                "tokenizer_config.json", "value_head.safetensors", "lmprefs.json", "adapter/adapter_config.json",
                "adapter/adapter_model.safetensors"}
RM_FILES = {"README.md", "adapter_config.json", "adapter_model.safetensors", "tokenizer.json", "tokenizer_config.json",
            "lmprefs.json"}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A finished tiny LoRA train-policy run: a reward model trained in it, checkpoints, logs, metrics."""
    d = tmp_path_factory.mktemp("push")
    assert main(["label", "tiny", "--db", str(d / "labels.sqlite"), "--n", "24"]) == 0
    assert main(["train-policy", "tiny", "--db", str(d / "labels.sqlite"), "--run-dir", str(d / "run"),
                 "--lora.rank", "2"]) == 0  # fmt: skip
    (d / "run" / "report.json").write_text(json.dumps({  # as quickstart writes it
        "true_reward_before": {"mean": 0.1, "stderr": 0.01, "n_queries": 16},
        "true_reward_after": {"mean": 0.35, "stderr": 0.02, "n_queries": 16}, "kl_after": {"kl": 1.5}}))
    return d / "run"


def files(d):
    return {str(p.relative_to(d)) for p in d.rglob("*") if p.is_file()}


def test_push_uploads_the_models_and_their_cards_and_nothing_else(run, tmp_path, capsys, monkeypatch):
    hub = tmp_path / "hub"
    monkeypatch.setenv("LMPREFS_HUB_DIR", str(hub))
    assert main(["push", str(run), "--repo", "alice/tiny-ppo"]) == 0
    assert files(hub / "alice" / "tiny-ppo") == POLICY_FILES  # no optimizer state, checkpoint, logs or manifest
    assert files(hub / "alice" / "tiny-ppo-reward-model") == RM_FILES
    assert (run / "checkpoint").is_dir() and (run / "logs").is_dir()  # which the run has
    card = (hub / "alice" / "tiny-ppo" / "README.md").read_text()
    assert 'from_pretrained("alice/tiny-ppo")' in card and "path/to/this/model" not in card
    assert "## Evaluation" in card and "| gain | +0.2500 |" in card and "tiny-gpt2-austen" in card
    assert card.index("## Evaluation") < card.index("## How to load")
    rm_card = (hub / "alice" / "tiny-ppo-reward-model" / "README.md").read_text()
    assert "held-out accuracy" in rm_card and "alice/tiny-ppo-reward-model" in rm_card
    out = capsys.readouterr().out
    assert f"policy: 10 files from {run / 'policy'} -> {hub}/alice/tiny-ppo" in out, out
    # one of them, alone, under the name given
    h2 = ["--hub-dir", str(tmp_path / "h2")]
    assert main(["push", str(run), "--repo", "rm-only", "--what", "reward-model", *h2]) == 0
    assert [p.name for p in (tmp_path / "h2").iterdir()] == ["rm-only"]
    assert files(tmp_path / "h2" / "rm-only") == RM_FILES


def test_the_pushed_policy_loads_back_offline(run, tmp_path):
    from lmprefs.models.artifacts import load_policy, load_reward_model

    assert main(["push", str(run), "--repo", "m", "--hub-dir", str(tmp_path)]) == 0
    assert load_policy(tmp_path / "m").temperature == 0.7  # no manifest: loaded unchecked
    load_reward_model(tmp_path / "m-reward-model")


def one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0], err
    return err[0]


def test_a_push_that_cannot_reach_the_hub_is_one_line_and_uploads_nothing(run, capsys, monkeypatch):
    import huggingface_hub

    monkeypatch.delenv("LMPREFS_HUB_DIR", raising=False)
    uploads = []
    monkeypatch.setattr(huggingface_hub.HfApi, "upload_folder", lambda self, **kw: uploads.append(kw))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # tests run offline
    assert main(["push", str(run), "--repo", "alice/x", "--what", "policy"]) == 2
    assert "alice/x" in (line := one_line(capsys)) and "offline" in line and "nothing was uploaded" in line
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub, "get_token", lambda: None)
    assert main(["push", str(run), "--repo", "alice/x"]) == 2
    assert "no Hugging Face token" in (line := one_line(capsys)) and "alice/x" in line
    monkeypatch.setattr(huggingface_hub, "get_token", lambda: "hf_fake")

    def unreachable(self, *a, **kw):
        raise ConnectionError("Name or service not known\nmore detail")

    monkeypatch.setattr(huggingface_hub.HfApi, "create_repo", unreachable)
    assert main(["push", str(run), "--repo", "alice/x"]) == 2
    line = one_line(capsys)
    assert "could not be reached" in line and "ConnectionError: Name or service not known" in line, line
    assert uploads == []


def test_bad_input_is_one_line_and_exit_2(run, tmp_path, capsys):
    (tmp_path / "unfinished").mkdir()
    (tmp_path / "unfinished" / "config.json").write_text((run / "config.json").read_text())
    hub = ["--hub-dir", str(tmp_path / "hub")]
    cases = [
        ([str(tmp_path / "unfinished"), "--repo", "x"], "not a finished run (no final policy"),
        ([str(run / "logs"), "--repo", "x"], "not a run directory"),
        ([str(tmp_path / "missing"), "--repo", "x"], "does not exist"),
        ([str(run), "--repo", "bad name!"], "not a hub repo name"),
        ([str(run), "--repo", "x", "--what", "value"], "invalid choice"),
        ([str(run)], "--repo"),
        ([str(tmp_path / "unfinished"), "--repo", "x", "--what", "reward-model"], "holds no reward model"),
        ([str(run), "--repo", "x", "--hub-dir", str(run / "config.json")], "is a file"),
        ([str(run), "--repo", "x", "--hub-dir", str(run / "config.json" / "hub")],
         f"--hub-dir {run / 'config.json' / 'hub'}: {run / 'config.json'} is a file, not a folder"),
    ]
    for argv, want in cases:
        assert main(["push", *hub, *argv]) == 2, argv  # a case's own --hub-dir comes last: it wins
        assert want in one_line(capsys), argv
    assert not (tmp_path / "hub").exists()


def test_a_bad_hub_dir_from_the_environment_is_named_as_the_environments(run, tmp_path, capsys, monkeypatch):
    for hub, want in ((run / "config.json", "is a file, expected the folder standing in for the hub"),
                      (run / "config.json" / "hub", f"{run / 'config.json'} is a file, not a folder")):  # fmt: skip
        monkeypatch.setenv("LMPREFS_HUB_DIR", str(hub))
        assert main(["push", str(run), "--repo", "x"]) == 2
        assert one_line(capsys) == f"lmprefs push: error: LMPREFS_HUB_DIR={hub} (environment): {want}"


def test_a_hub_dir_that_cannot_be_made_is_one_line_and_copies_nothing(run, tmp_path, capsys, monkeypatch):
    import errno
    import os

    from lmprefs.recipes import push

    real = push.Path.mkdir

    def refused(self, *a, **kw):  # as under /proc, where no folder can be made
        if self.is_relative_to(tmp_path / "hub"):
            raise OSError(errno.ENOENT, os.strerror(errno.ENOENT), str(self))
        return real(self, *a, **kw)

    monkeypatch.setattr(push.Path, "mkdir", refused)
    assert main(["push", str(run), "--repo", "alice/x", "--hub-dir", str(tmp_path / "hub")]) == 2
    assert one_line(capsys) == (f"lmprefs push: error: --hub-dir {tmp_path / 'hub'}: cannot make "
                                f"{tmp_path / 'hub' / 'alice'} (No such file or directory); nothing was copied")
    assert list(tmp_path.iterdir()) == []


def test_the_run_names_its_base_by_the_asset_and_push_drops_a_local_bases_path(run, tmp_path):
    from lmprefs.recipes.push import Upload, stage

    for d in (run / "policy" / "adapter", run / "reward_model"):
        assert json.loads((d / "adapter_config.json").read_text())["base_model_name_or_path"] == "tiny-gpt2-austen"
    src = tmp_path / "src"
    src.mkdir()
    (src / "lmprefs.json").write_text(json.dumps({"kind": "policy", "base": "sft", "base_path": "/home/me/sft"}))
    (src / "README.md").write_text("load path/to/this/model\n")
    (src / "manifest.json").write_text("{}")
    (tmp_path / "out").mkdir()
    assert stage(Upload("reward-model", src, "me/rm"), run, tmp_path / "out") == ["README.md", "lmprefs.json"]
    assert json.loads((tmp_path / "out" / "lmprefs.json").read_text()) == {"kind": "policy", "base": "sft"}
    assert (tmp_path / "out" / "README.md").read_text() == "load me/rm\n"


def test_with_a_token_each_repo_is_created_then_gets_one_commit_of_the_staged_files(run, monkeypatch, capsys):
    """The hub path, with HfApi stood in for: the same files as the local stand-in, one upload_folder per repo,
    to the id create_repo returned (a bare NAME lands in the token's namespace)."""
    import types

    import huggingface_hub

    monkeypatch.delenv("LMPREFS_HUB_DIR", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub, "get_token", lambda: "hf_fake")
    created, commits = [], {}
    monkeypatch.setattr(huggingface_hub.HfApi, "create_repo", lambda self, repo, private, exist_ok: (
        created.append((repo, private)) or types.SimpleNamespace(repo_id=f"alice/{repo}")))
    monkeypatch.setattr(huggingface_hub.HfApi, "upload_folder", lambda self, repo_id, folder_path, **kw: (
        commits.__setitem__(repo_id, files(folder_path))))
    assert main(["push", str(run), "--repo", "tiny", "--private"]) == 0
    assert created == [("tiny", True), ("tiny-reward-model", True)]
    assert commits == {"alice/tiny": POLICY_FILES, "alice/tiny-reward-model": RM_FILES}
    assert "-> https://huggingface.co/alice/tiny-reward-model" in capsys.readouterr().out
