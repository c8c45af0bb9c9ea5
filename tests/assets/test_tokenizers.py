"""The exact GPT-2 BPE asset, rebuilt from the gpt2.tiktoken file that openai-whisper ships."""

import tempfile

from lmprefs.assets.tokenizers import _build_gpt2_tokenizer, load_tokenizer


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
