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
