"""The asset cache: a folder that cannot be made (LMPREFS_CACHE naming a file, or a place under one) is one line
naming the variable, with nothing built."""

import pytest

from lmprefs.cli.dispatch import main


@pytest.mark.parametrize("under", ["", "sub"], ids=["a file", "under a file"])
def test_an_asset_cache_that_cannot_be_made_is_one_line_naming_lmprefs_cache(tmp_path, monkeypatch, capsys, under):
    (tmp_path / "afile").write_text("x\n")
    cache = tmp_path / "afile" / under if under else tmp_path / "afile"
    monkeypatch.setenv("LMPREFS_CACHE", str(cache))
    assert main(["assets", "prepare", "tiny-gpt2"]) == 2
    err = capsys.readouterr().err
    why = "Not a directory" if under else "File exists"
    assert err == (f"lmprefs assets: error: LMPREFS_CACHE={cache} (environment): cannot make the asset cache {cache} "
                   f"({why}); point it at a folder you can write\n")  # fmt: skip
    assert [p.name for p in tmp_path.iterdir()] == ["afile"] and (tmp_path / "afile").read_text() == "x\n"


def test_a_damaged_asset_is_listed_damaged_and_built_again_where_used(tmp_path, monkeypatch, capsys):
    """A model folder without config.json or with short weights (a killed or interfered build) is not `ready`; the
    next use sets it aside and builds it again, saying so in one line. In a cache of this test's own."""
    import shutil

    from lmprefs.assets.cache import COMPLETE, cache_dir
    from lmprefs.models.loading import load_lm

    cache = tmp_path / "cache"
    cache.mkdir()
    shutil.copytree(cache_dir() / "gpt2-tokenizer", cache / "gpt2-tokenizer")  # a copy: the shared cache is read
    monkeypatch.setenv("LMPREFS_CACHE", str(cache))
    assert main(["assets", "prepare", "tiny-gpt2"]) == 0
    asset = cache / "tiny-gpt2"
    assert (asset / COMPLETE).is_file()

    def status():
        capsys.readouterr()
        assert main(["assets", "list"]) == 0
        (line,) = [x for x in capsys.readouterr().out.splitlines() if x.split()[0] == "tiny-gpt2"]
        return line

    assert " ready " in status()
    (asset / "config.json").unlink()
    assert "damaged (no config.json; `lmprefs assets prepare tiny-gpt2` builds it again)" in status()
    lm, _ = load_lm("tiny-gpt2")  # used: built again, not a transformers traceback
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "asset tiny-gpt2" in err and "was damaged (no config.json)" in err
    assert (asset / "config.json").is_file() and " ready " in status() and lm.config.n_layer == 2
    assert not [p.name for p in cache.iterdir() if "tiny-gpt2." in p.name]  # nothing left aside

    with open(asset / "model.safetensors", "r+b") as f:  # weights cut short
        f.truncate(1000)
    assert "damaged (model.safetensors of 1000 bytes where its build wrote" in status()
    assert main(["assets", "prepare", "tiny-gpt2"]) == 0 and " ready " in status()

    (asset / COMPLETE).unlink()  # a folder built before the marker: judged by the files its asset holds
    assert " ready " in status()
    (asset / "model.safetensors").unlink()
    assert "damaged (no model.safetensors" in status()


def test_a_model_directory_without_weights_is_one_line(tmp_path, capsys):
    """A model folder of the user's with its config but no weights (a copy cut short) is named in one line, exit 2,
    where transformers ended the command in a traceback."""
    import shutil

    from lmprefs.assets.models import tiny_gpt2_austen_dir

    model = tmp_path / "my-model"
    shutil.copytree(tiny_gpt2_austen_dir(), model, ignore=shutil.ignore_patterns("*.safetensors"))
    assert main(["sample", "--preset", "tiny", "--task.initial-model", str(model), "--n", "1"]) == 2
    err = capsys.readouterr().err
    assert err == (f"lmprefs sample: error: model directory {model} has a config.json but no weights "
                   "(model.safetensors or pytorch_model.bin); copy or save the model into it again\n")  # fmt: skip
