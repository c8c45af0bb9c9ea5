"""The exact GPT-2 BPE asset, rebuilt from the gpt2.tiktoken file that openai-whisper ships."""

import tempfile

import pytest

from lmprefs.assets.tokenizers import _build_gpt2_tokenizer, gpt2_tokenizer_dir, load_tokenizer, save_tokenizer


def test_gpt2_tokenizer_builds_from_the_local_file_and_writes_nothing_to_the_temporary_folder(tmp_path, monkeypatch):
    """A fresh build reproduces GPT-2's ids and leaves no copy of the file in $TMPDIR (tiktoken's own loader keeps
    one in data-gym-cache, and a benchmark or a user's temporary folder would be left holding it)."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setattr(tempfile, "tempdir", None)  # gettempdir() reads TMPDIR again
    _build_gpt2_tokenizer(tmp_path / "tok")
    tok = load_tokenizer(tmp_path / "tok")
    assert tok("Hello world").input_ids == [15496, 995] and tok.decode([50256]) == "<|endoftext|>"
    assert len(tok) == 50257 and list(tmp.iterdir()) == []


@pytest.mark.parametrize("model", ["gpt2", "smollm2-135m"])
def test_a_tokenizer_saved_again_writes_the_same_files_as_save_pretrained(tmp_path, model):
    """save_tokenizer serializes a tokenizer once and writes those bytes on later saves: the files must be
    save_pretrained's, name for name and byte for byte (SmolLM2's chat template included)."""
    from lmprefs.assets.models import resolve_model

    tok = load_tokenizer(gpt2_tokenizer_dir() if model == "gpt2" else resolve_model(model))
    for d in ("first", "again", "reference"):
        (tmp_path / d).mkdir()
    save_tokenizer(tok, tmp_path / "first")
    save_tokenizer(tok, tmp_path / "again")
    tok.save_pretrained(tmp_path / "reference")

    def files(d):
        return {f.name: f.read_bytes() for f in (tmp_path / d).iterdir()}

    assert files("again") == files("first") == files("reference") and "tokenizer.json" in files("again")
    assert load_tokenizer(tmp_path / "again") is load_tokenizer(tmp_path / "reference")  # same bytes, one object
