"""The exact GPT-2 BPE, built as a Hugging Face fast tokenizer from the tiktoken file that openai-whisper ships.
No torch: the label formats use it to turn the original's token ids into text."""

from __future__ import annotations

import base64
import hashlib
import weakref
from pathlib import Path

from lmprefs.assets.cache import AssetError, _build_dir_atomically, _package_dir, cache_dir
from lmprefs.io.publish import sha256_file


def gpt2_tiktoken_file() -> Path:
    d = _package_dir("whisper", "pip install --no-deps openai-whisper==20250625")
    f = d / "assets" / "gpt2.tiktoken"
    if not f.exists():
        raise AssetError(f"{f} is missing; run: pip install --force-reinstall --no-deps openai-whisper==20250625")
    return f


def _read_tiktoken_ranks(f: Path) -> dict[bytes, int]:
    """The BPE ranks of a `.tiktoken` file (a base64 token and its rank a line), checked against its known hash.
    Read here rather than with tiktoken's loader, which keeps a copy of every file it reads, local ones too, in
    $TMPDIR/data-gym-cache."""
    data = f.read_bytes()
    if hashlib.sha256(data).hexdigest() != GPT2_TIKTOKEN_SHA256:
        raise AssetError(f"{f} is not the gpt2.tiktoken openai-whisper ships (its sha256 differs); run: "
                         "pip install --force-reinstall --no-deps openai-whisper==20250625")  # fmt: skip
    return {base64.b64decode(tok): int(rank) for tok, rank in (line.split() for line in data.splitlines() if line)}


def _bytes_to_unicode() -> dict[int, str]:
    # GPT-2's printable byte alphabet (encoder.py in openai/gpt-2)
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs), strict=True))


def _build_gpt2_tokenizer(out: Path) -> None:
    from transformers import GPT2TokenizerFast  # type: ignore[attr-defined]  # exported lazily, unseen by mypy

    ranks = _read_tiktoken_ranks(gpt2_tiktoken_file())
    b2u = _bytes_to_unicode()
    vocab = {"".join(b2u[b] for b in t): r for t, r in ranks.items()}
    vocab["<|endoftext|>"] = 50256

    def split(token: bytes, rank: int) -> tuple[bytes, bytes]:
        # replay BPE on the token with merges of lower rank only: the last two parts are the merge that made it
        parts = [bytes([b]) for b in token]
        while True:
            best = None
            for i in range(len(parts) - 1):
                r = ranks.get(parts[i] + parts[i + 1])
                if r is not None and r < rank and (best is None or r < best[1]):
                    best = (i, r)
            if best is None:
                break
            i = best[0]
            parts[i : i + 2] = [parts[i] + parts[i + 1]]
        assert len(parts) == 2, token
        return parts[0], parts[1]

    merges = []
    for t, r in sorted(ranks.items(), key=lambda kv: kv[1]):
        if len(t) > 1:
            a, b = split(t, r)
            merges.append(("".join(b2u[x] for x in a), "".join(b2u[x] for x in b)))
    # transformers v5: vocab_file=/merges_file= are silently ignored (a 1-token vocab); pass the dict and pairs
    tok = GPT2TokenizerFast(vocab=vocab, merges=merges, unk_token="<|endoftext|>", bos_token="<|endoftext|>",
                            eos_token="<|endoftext|>")  # fmt: skip
    if tok("Hello world").input_ids != [15496, 995] or len(tok) != 50257:
        raise AssetError("the rebuilt GPT-2 tokenizer does not reproduce GPT-2's ids; is openai-whisper intact?")
    tok.save_pretrained(out)


def gpt2_tokenizer_dir() -> Path:
    return _build_dir_atomically(cache_dir() / "gpt2-tokenizer", _build_gpt2_tokenizer)


def gpt2_tokenizer():
    """The exact GPT-2 BPE as a Hugging Face fast tokenizer ("Hello world" -> [15496, 995])."""
    return load_tokenizer(gpt2_tokenizer_dir())


_TOKENIZERS: dict[tuple, object] = {}
# files of a model directory that no tokenizer reads: a reward model or policy saved by a run holds the base model's
# tokenizer files byte for byte beside a config.json of its own
_NOT_TOKENIZER = {"generation_config.json", "lmprefs.json", "manifest.json", "reward_model.json",
                  "model.safetensors.index.json"}  # fmt: skip


def _tokenizer_key(p: Path) -> tuple:
    """What a directory's tokenizer is made of: the name and bytes of each file that may define it (config.json only
    where tokenizer_config.json does not name the tokenizer class, which is when transformers reads it)."""
    files = [f for pat in ("*.json", "*.txt", "*.model", "*.jinja") for f in sorted(p.glob(pat))
             if f.name not in _NOT_TOKENIZER]  # fmt: skip
    tok_cfg = p / "tokenizer_config.json"
    if tok_cfg.is_file() and '"tokenizer_class"' in tok_cfg.read_text(encoding="utf-8"):
        files = [f for f in files if f.name != "config.json"]
    return ("files", *((f.name, sha256_file(f)) for f in files))


def load_tokenizer(path: str | Path):
    """The Hugging Face tokenizer of a model directory (or hub name), read once per process and content of its
    files: building GPT-2's BPE takes ~0.1-0.4 s and a run loads the same one for the policy, each reward model it
    saved and the labels, while nothing in lmprefs changes a tokenizer after loading, so all of them can share one
    object (which also makes check_same_tokenizer's comparison of two vocabularies an identity check)."""
    from transformers import AutoTokenizer

    p = Path(path)
    key = _tokenizer_key(p) if p.is_dir() else ("name", str(path))
    if key not in _TOKENIZERS:
        if len(_TOKENIZERS) >= 16:  # a long-lived process (the tests, an experiment) loads many tokenizers
            _TOKENIZERS.pop(next(iter(_TOKENIZERS)))
        _TOKENIZERS[key] = AutoTokenizer.from_pretrained(str(path))
    return _TOKENIZERS[key]


_SAVED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def save_tokenizer(tok, out: Path) -> None:
    """`tok.save_pretrained(out)`, serialized once per tokenizer object: a run saves the same tokenizer into every
    checkpoint and reward model it writes (GPT-2's tokenizer.json is 3.6 MB of JSON to build each time), and nothing
    in lmprefs changes a tokenizer after loading it (`load_tokenizer`), so later saves write the first one's bytes."""
    files = _SAVED.get(tok)
    if files is None:
        written = [Path(f) for f in tok.save_pretrained(out) or ()]
        if written and all(f.parent == Path(out) for f in written):  # else each save goes through save_pretrained
            _SAVED[tok] = {f.name: f.read_bytes() for f in written}
        return
    for name, data in files.items():
        (Path(out) / name).write_bytes(data)


GPT2_TIKTOKEN_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"
